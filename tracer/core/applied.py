"""The applied ledger: which logged trajectories an index has learned from, so each is learned once.

The gateway's log only grows and ``tracer update`` reads it whole each time; an index that did not know
what it had applied would count every trajectory again on every update. The ledger keys a trajectory by
its ``id`` (unique in a log: the gateway writes a random suffix into every id), not by a cursor into a
file: ids survive log rotation, copies and reordering, and ``Retriever.update`` from Python has no file.

Each id is kept as the first 8 bytes of its BLAKE2b digest (a sorted ``uint64`` array, 8 bytes an id:
a million applied trajectories cost 8 MB in every process that loads the index). Two distinct ids
collide with probability 2^-64 per pair; with ``n`` ids applied, a new id is wrongly taken for an
applied one with probability about ``n / 2^64`` (5e-13 for ten million).

Saved as ``applied.npy`` in the index's snapshot (:func:`tracer.scoring.persist.write_common`), so the
manifest verifies it like every other file; an index saved before the ledger existed has applied nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracer.core.store import CorruptIndex

FILE = "applied.npy"


def digest(tid: str) -> int:
    """The ledger's key of a trajectory id (the first 8 bytes of its BLAKE2b digest, little-endian)."""
    return int.from_bytes(
        hashlib.blake2b(tid.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little"
    )


@dataclass(frozen=True)
class Applied:
    """An immutable set of applied trajectory ids (their digests, ``keys``: sorted unique ``uint64 [n]``)."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def __len__(self) -> int:
        return len(self.keys)

    def split(self, trajectories: Sequence[Any]) -> tuple[list[Any], int]:
        """(the trajectories not applied yet, in order and each id once; how many were left out)."""
        keys = np.fromiter((digest(t.id) for t in trajectories), dtype=np.uint64, count=len(trajectories))
        at = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        known = (self.keys[at] == keys) if len(self.keys) else np.zeros(len(keys), dtype=bool)
        fresh, seen = [], set()
        for t, k, old in zip(trajectories, keys.tolist(), known.tolist()):
            if not old and k not in seen:
                seen.add(k)
                fresh.append(t)
        return fresh, len(trajectories) - len(fresh)

    def adding(self, ids: Iterable[str]) -> Applied:
        """The ledger with ``ids`` added (itself when there are none)."""
        new = np.fromiter((digest(i) for i in ids), dtype=np.uint64)
        return self if not len(new) else Applied(np.union1d(self.keys, new))

    def save(self, directory: Path) -> None:
        np.save(directory / FILE, self.keys, allow_pickle=False)

    @classmethod
    def load(cls, directory: Path) -> Applied:
        """The ledger saved in ``directory``; none saved (an older index) is an empty one."""
        path = directory / FILE
        if not path.exists():
            return cls()
        try:
            keys = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise CorruptIndex(path, f"not a numpy array file ({e})") from None
        if keys.dtype != np.uint64 or keys.ndim != 1 or (len(keys) > 1 and not (np.diff(keys) > 0).all()):
            raise CorruptIndex(path, f"expected a sorted 1-d uint64 array of unique keys, got {keys.dtype} "
                                     f"{keys.shape}")
        return cls(keys)
