"""Manifests of cached encoder artifacts: what was built, checked before it is trusted.

Every folder tracer derives from a model (an ONNX export, a model2vec table, a fine-tuned checkpoint, under
``<encoder_dir>/<kind>-<hash>/``) gets a ``MANIFEST.json`` when it is built: the recipe it was built from
(``inputs``) and the size and SHA-256 of every file in it, written last, inside the temporary folder that is
renamed into place, so a folder without one was never finished by this version. Its ``digest`` (SHA-256 over
the inputs and the file hashes) is the artifact's content fingerprint, which the embedding cache keys its
vectors by.

A producer (:func:`reuse` then :func:`new_artifact`) checks the folder it would reuse: intact, it is reused as
it is; missing a file, with a file of another size or hash, with a file the manifest does not list, or with no
manifest at all, it is moved aside to ``<name>.corrupt-<random>`` (never deleted) with a warning naming the
file, and built again. A consumer that is handed a folder and cannot rebuild it (a saved index names a
fine-tuned checkpoint) calls
:func:`fingerprint`: a damaged artifact is a :class:`ArtifactMismatch` naming the file; a folder without a
manifest (the bundled MiniLM, a user's own model) is nobody's artifact and is fingerprinted by hashing its
files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracer.core.errors import DataError
from tracer.core.io import atomic_new_dir, atomic_write_text, chmod_created

MANIFEST = "MANIFEST.json"
FORMAT = "tracer-artifact"
# files whose bytes decide what a sentence-transformers folder computes (README and the like do not)
_HASHED_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")


class ArtifactMismatch(DataError):
    """A cached artifact whose files differ from its manifest (or that has none); the message names the
    file."""


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def folder_hash(folder: str | Path) -> str:
    """sha256 over the relative paths and bytes of the files that define a model folder (recipe keys hash
    their source with it; bookkeeping files, ``train_info.json`` and the manifest, are left out)."""
    folder = Path(folder)
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _HASHED_SUFFIXES
                    and not p.name.startswith(".") and p.name not in ("train_info.json", MANIFEST)):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST)


def _digest(inputs: Any, files: Mapping[str, Mapping[str, Any]]) -> str:
    blob = json.dumps({"inputs": inputs, "files": {k: v["sha256"] for k, v in files.items()}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def seal(folder: str | Path, inputs: Mapping[str, Any]) -> str:
    """Write ``folder``'s manifest (``inputs`` and every file's size and SHA-256) atomically; returns its
    digest."""
    folder = Path(folder)
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in _files(folder)}
    digest = _digest(dict(inputs), files)
    doc = {"format": FORMAT, "version": 1, "inputs": dict(inputs), "digest": digest, "files": files}
    atomic_write_text(folder / MANIFEST, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return digest


def verify(folder: str | Path) -> str:
    """The digest of an intact artifact; an :class:`ArtifactMismatch` naming the first file that differs."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ArtifactMismatch(path, "missing: no manifest (built before manifests, or not finished)")
    try:
        doc = json.loads(path.read_text())
        files, inputs = doc["files"], doc["inputs"]
        wanted = {name: (int(f["size"]), str(f["sha256"])) for name, f in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ArtifactMismatch(path, f"unreadable manifest ({type(e).__name__}: {e})") from None
    for p in _files(folder):
        if str(p.relative_to(folder)) not in wanted:
            raise ArtifactMismatch(p, "not in the manifest (a file added after the artifact was built)")
    for name, (size, sha) in wanted.items():
        p = folder / name
        if not p.is_file():
            raise ArtifactMismatch(p, "missing (listed in the manifest)")
        if p.stat().st_size != size:
            raise ArtifactMismatch(p, f"size {p.stat().st_size} bytes, the manifest says {size} "
                                      "(truncated or replaced)")
        if sha256_file(p) != sha:
            raise ArtifactMismatch(p, "SHA-256 differs from the manifest (the file was changed or damaged)")
    digest = _digest(inputs, files)
    if doc.get("digest") != digest:
        raise ArtifactMismatch(path, "its digest does not match its own inputs and files")
    return digest


def reuse(out: str | Path) -> str | None:
    """The digest of the intact artifact at ``out``, else None: absent, or damaged (moved aside with a
    warning), so the caller builds it (:func:`new_artifact`)."""
    out = Path(out)
    try:
        inode = out.stat().st_ino
    except FileNotFoundError:
        return None
    try:
        return verify(out)
    except ArtifactMismatch as e:
        problem = e
    try:
        if out.stat().st_ino != inode:  # another process rebuilt it meanwhile: check that one instead
            return reuse(out)
        aside = out.with_name(f"{out.name}.corrupt-{os.urandom(4).hex()}")
        os.rename(out, aside)
    except FileNotFoundError:  # another process moved it aside first
        return None
    warnings.warn(f"{problem}; the cached artifact was moved aside to {aside.name} and is built again",
                  RuntimeWarning, stacklevel=3)
    return None


@contextmanager
def new_artifact(out: str | Path, inputs: Mapping[str, Any]) -> Iterator[Path]:
    """``with new_artifact(out, inputs) as tmp:`` fill ``tmp``; it is sealed (its manifest written last) and
    renamed to ``out`` (:func:`tracer.core.io.atomic_new_dir`: an ``out`` another process finished meanwhile
    is kept). Every file and folder in it gets the mode the umask gives what we create (:func:`own_modes`)."""
    with atomic_new_dir(out) as tmp:
        yield tmp
        own_modes(tmp)
        seal(tmp, inputs)


def own_modes(folder: Path) -> None:
    """Give every file (0666) and folder (0777) under ``folder`` the mode the umask allows, as
    docs/storage.md promises for what tracer creates. The libraries that fill an artifact do not all
    honour the umask: safetensors writes ``model.safetensors`` through a 0600 temporary (``mkstemp``), so a
    model2vec table or a fine-tuned checkpoint would be unreadable to the group that reads the cache."""
    for p in (folder, *folder.rglob("*")):
        if not p.is_symlink():
            chmod_created(p, directory=p.is_dir())


@contextmanager
def one_builder(out: str | Path) -> Iterator[None]:
    """Hold the build lock of artifact ``out`` (``.<name>.lock`` beside it): a second process that wants the
    same artifact waits for the first, then reuses what it built (:func:`reuse`) instead of building it
    too (parallel test workers and sweep jobs on one machine)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fingerprint(folder: str | Path) -> str:
    """A model folder's content fingerprint, for cache keys: an artifact's manifest digest once its files are
    verified (a damaged one, which the caller cannot rebuild, is an :class:`ArtifactMismatch` naming the
    file), else the hash of its files (:func:`folder_hash`)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return folder_hash(folder)
    try:
        return verify(folder)
    except ArtifactMismatch as e:
        raise ArtifactMismatch(e.path, f"{str(e).removeprefix(e.path + ': ')}; it cannot be rebuilt here "
                                       f"(the artifact {folder} is read, not built, by this caller): build "
                                       "it again where it was made, or move the folder away") from None
