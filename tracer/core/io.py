"""Atomic file writes: nothing half-written, and files readable as the umask says.

A file goes to a temporary sibling (``.tmp-<pid>-...``: recognisably ours) and is renamed into place,
so a reader sees the old complete file or the new one. ``mkstemp``/``mkdtemp`` create 0600/0700;
what we create is chmod-ed to the umask-derived mode (0644/0755 under the usual umask 022).
Directories of several files are saved as snapshots by :mod:`tracer.core.store`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask is a set-and-restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def chmod_created(path: str | Path, directory: bool = False) -> None:
    """Give a file (0666) or directory (0777) we created the mode the umask allows."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], *, fsync: bool = False,
                 prefix: str | None = None) -> Path:
    """Call ``write`` on a binary file in the target's directory, then rename it to ``path``.

    ``fsync``: flush the file to disk before the rename (for pointers that must survive a power cut).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=prefix or f".tmp-{os.getpid()}-{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        chmod_created(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str, **kw: Any) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")), **kw)


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` to ``path`` atomically."""
    import torch

    return atomic_write(path, lambda f: torch.save(obj, f))


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


@contextmanager
def atomic_new_dir(out: str | Path) -> Iterator[Path]:
    """``with atomic_new_dir(out) as tmp:`` fill ``tmp``; on success it is renamed to ``out``, on error
    removed.

    For content-addressed folders (exported and trained encoders): ``out`` never exists half-written, and an
    ``out`` that appeared meanwhile (another process built the same content) is kept and ``tmp`` dropped.
    Nothing that exists is ever replaced or deleted.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{os.getpid()}-{out.name}-{os.urandom(3).hex()}"
    tmp.mkdir()  # mkdir (unlike mkdtemp) honours the umask
    try:
        yield tmp
        try:
            os.rename(tmp, out)  # fails on an existing non-empty out: never replaced
        except OSError:
            if not out.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
