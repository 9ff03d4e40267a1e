"""The embedding cache on disk: one folder per encoder, holding ``.npz`` shards of (key, vector) rows.

A shard is written once, to a temporary file renamed into place (a crash never leaves half a shard), and named
by the SHA-256 of its bytes: reading it back checks that hash (its manifest), then each zip member's CRC and
the rows' shape. A shard that fails (truncated, a flipped byte, another dimension's vectors) is reported with
a warning and renamed aside to ``<name>.npz.corrupt`` (never deleted); its texts are simply encoded again.
Shards of older versions, named by their keys' hash (20 hex digits), are checked by CRC alone.

Each ``encode`` call that computes new vectors adds one shard, so a folder opened with more than
``COMPACT_AT`` shards is compacted: everything read is written as one shard, then the shards it merged are
removed (a crash in between leaves duplicates, which read back as one). What the cache holds only grows with
texts its owner chose to persist; a serving process persists none
(:class:`tracer.encode.embedders.CachedEmbedder`, ``persist_contexts``).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tracer.core.io import atomic_write

# more shards than this in a folder are merged into one when it is opened: each is a file to open and parse at
# start-up, and a run that encodes step by step writes one per step
COMPACT_AT = 16
_CONTENT_NAMED = re.compile(r"[0-9a-f]{64}")


def _check(shard: Path, data: bytes, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The shard's keys ``[n]`` (S32) and vectors ``[n, dim]``, or ValueError / zip errors saying what is
    wrong."""
    if _CONTENT_NAMED.fullmatch(shard.stem) and hashlib.sha256(data).hexdigest() != shard.stem:
        raise ValueError("its SHA-256 is not the one it was written with (its name)")
    with np.load(io.BytesIO(data)) as z:
        keys, vecs = z["keys"], z["vecs"]
        bad = z.zip.testzip()  # numpy stops reading before the CRC check: a flipped byte passes it
    if bad is not None:
        raise ValueError(f"member {bad} fails its CRC")
    if keys.shape != (len(vecs),) or vecs.dtype != np.float32:
        raise ValueError(f"{len(keys)} keys for {len(vecs)} vectors of {vecs.dtype}")
    if vecs.shape[1:] != (dim,):
        raise ValueError(f"vectors of dimension {vecs.shape[1:]}, the embedder's is {dim}")
    return keys, vecs


def read_shards(folder: Path, dim: int) -> dict[bytes, np.ndarray]:
    """Every verified row of ``folder``'s shards, by key (compacting the folder first when it holds many)."""
    rows: dict[bytes, np.ndarray] = {}
    read: list[Path] = []
    for shard in sorted(folder.glob("*.npz")):
        try:
            data = shard.read_bytes()
        except FileNotFoundError:  # merged meanwhile by another process compacting this folder
            continue
        try:
            keys, vecs = _check(shard, data, dim)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            aside = shard.with_name(shard.name + ".corrupt")
            try:
                os.replace(shard, aside)
            except FileNotFoundError:
                continue
            warnings.warn(f"{shard}: corrupt embedding-cache shard ({type(e).__name__}: {e}); moved to "
                          f"{aside.name}, its texts will be encoded again", RuntimeWarning, stacklevel=4)
            continue
        read.append(shard)
        for k, v in zip(keys, vecs):
            # numpy's fixed-width bytes drop trailing NULs; keys are 32-byte digests, so pad back
            rows[bytes(k).ljust(32, b"\0")] = v
    if len(read) > COMPACT_AT and rows:
        merged = write_shard(folder, list(rows), np.stack(list(rows.values())))
        for shard in read:
            if shard != merged:
                shard.unlink(missing_ok=True)
    return rows


def write_shard(folder: Path, keys: Sequence[bytes], vecs: np.ndarray) -> Path:
    """One shard of ``keys`` and their vectors ``[n, d]`` float32, written atomically under its SHA-256."""
    buf = io.BytesIO()
    np.savez(buf, keys=np.array(keys, dtype="S32"), vecs=vecs)
    data = buf.getvalue()
    return atomic_write(folder / f"{hashlib.sha256(data).hexdigest()}.npz", lambda f: f.write(data))
