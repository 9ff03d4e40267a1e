"""Atomic writes: nothing half-written. Files go to a temporary sibling and are renamed into place;
directories are built in a temporary sibling and swapped in, so the target is always either the old
complete directory or the new one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write`` on a binary file in the target's directory, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` to ``path`` atomically."""
    import torch

    return atomic_write(path, lambda f: torch.save(obj, f))


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def replace_dir(new: Path, out: Path) -> None:
    """Move directory ``new`` to ``out``; an existing ``out`` is renamed away first and removed after."""
    if not out.exists():
        os.replace(new, out)
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old"))
    os.replace(out, old / "content")
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old / "content", out)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(out: str | Path) -> Iterator[Path]:
    """``with atomic_dir(out) as tmp:`` write into ``tmp``; on success it replaces ``out``, on error it is removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    try:
        yield tmp
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
