"""Index storage like a database: immutable snapshots, an atomically replaced pointer, a verified manifest.

Layout of a saved index directory ``DIR`` (see docs/storage.md)::

    DIR/.tracer-index            marker: this directory belongs to tracer (save refuses any other)
    DIR/CURRENT                  "snapshots/<id>\\n", replaced atomically (temp + fsync + rename)
    DIR/snapshots/<id>/          one complete, never modified snapshot
    DIR/snapshots/<id>/MANIFEST.json   every file of the snapshot with its size and SHA-256
    DIR/LOCK                     held (flock) by a writer that reads, changes and saves the index

A save writes a fresh snapshot under a temporary name (``.tmp-<pid>-...``), fsyncs it, renames it to
its id and then replaces ``CURRENT`` (the pattern of LevelDB's CURRENT file or a git ref). A reader
resolves ``CURRENT`` once and reads only that snapshot, holding a shared ``flock`` on its manifest;
garbage collection deletes a snapshot only under an exclusive non-blocking lock, so never one a
reader or a publishing writer holds. Temporaries of a dead process are removed by the next save.
A writer that loads the index, changes it and saves it (``tracer update``) holds :func:`writer_lock`
throughout, so a second one waits and then loads what the first published, instead of saving over it.
Nothing outside ``DIR/snapshots`` and our own pointer temporaries is ever deleted.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from tracer.core.errors import DataError
from tracer.core.io import atomic_write_text, fsync_dir

MARKER = ".tracer-index"
POINTER = "CURRENT"
SNAPSHOTS = "snapshots"
MANIFEST = "MANIFEST.json"
LOCK = "LOCK"        # the writers' lock (the name LevelDB gives its own)
TMP = ".tmp-"        # prefix of every temporary we create: .tmp-<pid>-<random>
TRASH = ".del-"      # a snapshot being deleted
Verify = Literal["sha256", "size", "none"]


class CorruptIndex(DataError):
    """A saved index whose files do not match their manifest or cannot be parsed."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(name: str) -> bool:
    """A temporary of ours (``.tmp-<pid>-...`` or ``.del-...``) whose process is gone."""
    if name.startswith(TRASH):
        return True
    if not name.startswith(TMP):
        return False
    pid = name[len(TMP):].split("-", 1)[0]
    return pid.isdigit() and not _pid_alive(int(pid))


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check_target(root: Path) -> None:
    """Refuse a plain file, or a non-empty directory that is not a tracer index."""
    if root.exists() and not root.is_dir():
        raise FileExistsError(f"{root}: exists and is not a directory; refusing to save an index over it")
    if root.is_dir() and not (root / MARKER).exists():
        entries = sorted(p.name for p in root.iterdir())
        if entries:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise FileExistsError(f"{root}: not empty and not a tracer index (holds {shown}); "
                                  "save to a new or empty directory")


def clean_stale(root: Path) -> list[Path]:
    """Remove temporaries left by a crashed save (ours by prefix, their process gone); return them."""
    removed = []
    for parent in (root, root / SNAPSHOTS):
        if not parent.is_dir():
            continue
        for p in parent.iterdir():
            if _stale(p.name):
                # ignore_errors: a concurrent save may be removing the same leftover
                (shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink()
                 else p.unlink(missing_ok=True))
                removed.append(p)
    return removed


def write_manifest(snap: Path) -> dict[str, Any]:
    """Hash every file of ``snap`` (its folders' too: the encoder a snapshot carries, ``encoders/<id>/``) into
    its MANIFEST.json, keyed by the path relative to ``snap`` (files and folders fsynced first)."""
    files = {}
    for p in sorted(q for q in snap.rglob("*") if q.is_file() and q != snap / MANIFEST):
        with open(p, "rb") as f:
            os.fsync(f.fileno())
            files[p.relative_to(snap).as_posix()] = {"size": os.fstat(f.fileno()).st_size,
                                                      "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
    for d in sorted(q for q in snap.rglob("*") if q.is_dir()):
        fsync_dir(d)
    doc = {"format": "tracer-snapshot", "version": 1, "files": files}
    atomic_write_text(snap / MANIFEST, json.dumps(doc, indent=1) + "\n")
    return doc


def inside(snap: Path, name: str) -> Path:
    """``snap / name`` for a relative path a manifest or a meta.json names; one that would leave the snapshot
    (absolute, ``..``) is a :class:`CorruptIndex`: a saved file never makes a reader open a path outside
    it."""
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts:
        raise CorruptIndex(snap / MANIFEST, f"names a path outside the snapshot: {name[:120]!r}")
    return snap / rel


def verify_snapshot(snap: Path, mode: Verify = "sha256") -> None:
    """Check every file against the manifest: missing, wrong size or wrong SHA-256 is a
    :class:`CorruptIndex`."""
    if mode == "none":
        return
    if mode not in ("sha256", "size"):
        raise ValueError(f"verify must be 'sha256', 'size' or 'none', got {mode!r}")
    doc = read_json(snap / MANIFEST)
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        raise CorruptIndex(snap / MANIFEST, "no 'files' table")
    for name, want in files.items():
        if (not isinstance(want, dict) or not isinstance(want.get("size"), int)
                or not isinstance(want.get("sha256"), str)):
            raise CorruptIndex(snap / MANIFEST, f"malformed entry for {name!r}")
        p = inside(snap, name)
        if not p.is_file():
            raise CorruptIndex(p, "listed in the manifest but missing")
        size = p.stat().st_size
        if size != want["size"]:
            raise CorruptIndex(
                p, f"size {size} bytes, the manifest says {want['size']} (truncated or replaced)"
            )
        if mode == "sha256" and sha256_file(p) != want["sha256"]:
            raise CorruptIndex(p, "SHA-256 does not match the manifest (the file is corrupt)")


def read_json(path: Path) -> Any:
    """A JSON file of the index; missing, undecodable or invalid is a :class:`CorruptIndex` naming it."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CorruptIndex(path, "file missing") from None
    except UnicodeDecodeError as e:
        raise CorruptIndex(path, f"not UTF-8 at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise CorruptIndex(path, f"not valid JSON: {e.msg}", line=e.lineno) from None


def current_snapshot(root: str | Path) -> str:
    """The id the pointer names now (a cheap version token: a server reloads when it changes).

    Raises FileNotFoundError when ``root`` holds no saved index."""
    root = Path(root)
    try:
        text = (root / POINTER).read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"{root}: no saved index here (no {POINTER} pointer)") from None
    prefix = SNAPSHOTS + "/"
    if not text.startswith(prefix) or "/" in text[len(prefix):] or text.endswith("/"):
        raise CorruptIndex(root / POINTER, f"does not name a snapshot: {text[:80]!r}")
    return text[len(prefix):]


def current_path(root: str | Path) -> Path | None:
    """The folder of the snapshot ``CURRENT`` names now, or None (no index there yet, or it was just
    collected): what a new save may hard-link unchanged files from (:mod:`tracer.encode.bundle`)."""
    try:
        snap = Path(root) / SNAPSHOTS / current_snapshot(root)
    except (FileNotFoundError, CorruptIndex):
        return None
    return snap if snap.is_dir() else None


def _try_lock(path: Path, how: int) -> int | None:
    """An fd holding ``flock(how)`` on ``path``, or None when the file is gone or the lock is busy."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, how)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def open_snapshot(root: str | Path, verify: Verify = "sha256") -> Iterator[Path]:
    """``with open_snapshot(dir) as snap:`` read the files of the current snapshot, verified.

    ``root`` may be an index directory (the pointer is resolved once), a snapshot directory, or an
    index in the flat layout of earlier versions (read as is: it has no manifest to verify).
    While the block runs the snapshot holds a shared lock, so garbage collection cannot delete it.
    """
    root = Path(root)
    if (root / MANIFEST).is_file() and not (root / POINTER).exists():
        candidates: Iterator[Path] = iter([root])
    elif not (root / POINTER).exists() and (root / "meta.json").is_file():
        yield root  # the flat layout of earlier versions
        return
    else:
        candidates = (root / SNAPSHOTS / current_snapshot(root) for _ in range(50))
    for snap in candidates:
        fd = _try_lock(snap / MANIFEST, fcntl.LOCK_SH)
        if fd is None or not (snap / MANIFEST).is_file():  # collected between resolving and locking
            if fd is not None:
                os.close(fd)
            continue
        try:
            verify_snapshot(snap, verify)
            yield snap
            return
        finally:
            os.close(fd)
    raise CorruptIndex(root / POINTER, "names a snapshot that does not exist")


def collect(root: Path, keep: int = 2) -> list[str]:
    """Delete old snapshots: keep the current one and the ``keep - 1`` newest others; skip any that a
    reader or writer holds (its lock). Returns the ids deleted."""
    snaps = root / SNAPSHOTS
    ids = sorted((p.name for p in snaps.iterdir() if not p.name.startswith(".")), reverse=True)
    try:
        current = current_snapshot(root)
    except FileNotFoundError:
        return []
    others = [i for i in ids if i != current]
    deleted = []
    for sid in others[max(keep - 1, 0):]:
        fd = _try_lock(snaps / sid / MANIFEST, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            continue
        try:
            if sid == current_snapshot(root):  # the pointer never moves back, but check under the lock
                continue
            trash = snaps / f"{TRASH}{sid}"
            try:
                os.replace(snaps / sid, trash)  # readers that resolve it now find no manifest and retry
            except FileNotFoundError:  # another writer collected it between our open and our lock
                continue
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        deleted.append(sid)
    return deleted


@contextmanager
def save_snapshot(root: str | Path, keep: int = 2) -> Iterator[Path]:
    """``with save_snapshot(dir) as tmp:`` write the files of a new snapshot into ``tmp``; on success it is
    manifested, fsynced and published as ``CURRENT``, then old snapshots are collected.

    Refuses a target that is a file or a non-empty directory that is not a tracer index. On error the
    temporary is removed and ``CURRENT`` still names the previous snapshot.
    """
    root = Path(root)
    _check_target(root)
    root.mkdir(parents=True, exist_ok=True)
    if not (root / MARKER).exists():
        atomic_write_text(root / MARKER, json.dumps({"format": "tracer-index", "version": 1}) + "\n")
    snaps = root / SNAPSHOTS
    snaps.mkdir(exist_ok=True)
    clean_stale(root)
    sid = f"{time.time_ns():020d}-{os.getpid()}-{os.urandom(3).hex()}"
    tmp = snaps / f"{TMP}{os.getpid()}-{sid}"
    tmp.mkdir()  # mkdir (unlike mkdtemp) honours the umask
    try:
        yield tmp
        write_manifest(tmp)
        fd = _try_lock(tmp / MANIFEST, fcntl.LOCK_SH)  # held until published: collection skips it
        try:
            fsync_dir(tmp)
            os.replace(tmp, snaps / sid)
            fsync_dir(snaps)
            atomic_write_text(
                root / POINTER, f"{SNAPSHOTS}/{sid}\n", fsync=True, prefix=f"{TMP}{os.getpid()}-"
            )
            fsync_dir(root)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    collect(root, keep)


@contextmanager
def writer_lock(root: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """``with writer_lock(dir):`` load, change and save the index with no other writer in between.

    An exclusive ``flock`` on ``DIR/LOCK`` (created, empty, where missing): a second writer blocks until the
    first leaves the block (``on_wait`` is called first, to say so), then reads the snapshot the first
    published. The kernel releases the lock when its process dies, so a crashed writer never leaves it held.
    Readers (``Retriever.load``, servers) never take it. ``DIR`` must hold a saved index (its pointer)."""
    root = Path(root)
    if not (root / POINTER).is_file():
        raise FileNotFoundError(f"{root}: no saved index here (no {POINTER} pointer)")
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)  # the umask applies
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
