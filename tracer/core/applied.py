"""The applied ledger: which logged trajectories an index has learned from, so each is learned once.

The gateway's log only grows and ``tracer update`` reads it whole each time; an index that did not know
what it had applied would count every trajectory again on every update. The ledger knows a trajectory by
its ``id`` *and* its content, not by a cursor into a file: ids survive log rotation, copies and reordering,
and ``Retriever.update`` from Python has no file. The content is what learning reads, ``messages``,
``reward`` and ``success`` (:func:`content_digest`; ``group``, ``domain`` and ``metadata`` are left out, so
a copy of a log re-exported with other task names or annotations is still the same trajectories).

- same id, same content: applied before, left out (``already_applied``);
- same id, other content: another trajectory that happens to reuse the id (a second log whose ids are
  ``t0``, ``t1``, ... like the first's; the gateway writes a random suffix into every id, so its own log
  never does this). It is learned, and the ledger keeps it as its own entry (the id and its content: the
  pair is the disambiguated id); the update reports it as ``id_reused``, so an edited line that was learned
  before (and is now learned again) is visible rather than silent;
- a new id: learned.

Each entry is a pair of 64-bit keys, the first 8 bytes of the BLAKE2b digest of the id and of the content
(16 bytes a trajectory: a million applied cost 16 MB in every process that loads the index), kept sorted.
Two distinct trajectories collide with probability about ``n / 2^64`` for ``n`` applied.

Saved as ``applied.npy`` (a sorted structured array ``(id, content)``) in the index's snapshot
(:func:`tracer.scorer_base.persist.write_common`), so the manifest verifies it like every other file. An index
saved before the ledger existed has applied nothing; one saved before content keys (``applied.npy`` a
sorted ``uint64`` array of id keys) is read as entries of unknown content (key 0), and an id among them
counts as applied whatever its content (the rule it was recorded under); the next save keeps them so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracer.core.store import CorruptIndex

FILE = "applied.npy"
ROW = np.dtype([("id", "<u8"), ("content", "<u8")])
UNKNOWN = 0  # the content key of an entry from a ledger saved before content keys


def _key(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def digest(tid: str) -> int:
    """The ledger's key of a trajectory id (the first 8 bytes of its BLAKE2b digest, little-endian)."""
    return _key(tid.encode("utf-8", "surrogatepass"))


def content_digest(t: Any) -> int:
    """The ledger's key of a trajectory's content: its messages, reward and success as canonical JSON
    (never :data:`UNKNOWN`)."""
    text = json.dumps([list(t.messages), float(t.reward), bool(t.success)], sort_keys=True,
                      separators=(",", ":"), default=str)  # ensure_ascii: any string encodes
    return _key(text.encode("ascii")) or 1


def _rows(trajectories: Iterable[Any]) -> np.ndarray:
    return np.array([(digest(t.id), content_digest(t)) for t in trajectories], dtype=ROW)


@dataclass(frozen=True)
class Split:
    """What a ledger makes of a batch: ``fresh`` to learn (in order), ``already`` left out (applied before,
    or repeated in the batch), ``reused`` the fresh ones whose id was applied (or came earlier in the batch)
    with other content."""

    fresh: list
    already: int
    reused: list


@dataclass(frozen=True)
class Applied:
    """An immutable set of applied trajectories: ``rows``, sorted unique ``(id, content)`` key pairs
    (:data:`ROW` ``[n]``)."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=ROW))

    def __len__(self) -> int:
        return len(self.rows)

    def split(self, trajectories: Sequence[Any]) -> Split:
        """Sort a batch into the trajectories to learn and those applied before (see the module docstring)."""
        q = _rows(trajectories)                                                            # [T]
        id_known, exact = np.zeros(len(q), dtype=bool), np.zeros(len(q), dtype=bool)
        if len(self.rows):
            last = len(self.rows) - 1
            first = q.copy()
            first["content"] = UNKNOWN                            # (id, 0): the first entry an id can have
            at = self.rows[np.minimum(np.searchsorted(self.rows, first), last)]          # [T]
            id_known = at["id"] == q["id"]
            legacy = id_known & (at["content"] == UNKNOWN)       # recorded by id alone: applied, any content
            exact = legacy | (self.rows[np.minimum(np.searchsorted(self.rows, q), last)] == q)
        fresh, reused, seen, seen_ids = [], [], set(), set()
        for t, (tid, content), old, known in zip(trajectories, q.tolist(), exact.tolist(), id_known.tolist()):
            if old or (tid, content) in seen:
                continue
            if known or tid in seen_ids:
                reused.append(t)
            seen.add((tid, content))
            seen_ids.add(tid)
            fresh.append(t)
        return Split(fresh, len(trajectories) - len(fresh), reused)

    def adding(self, trajectories: Iterable[Any]) -> Applied:
        """The ledger with ``trajectories`` added (itself when there are none)."""
        new = _rows(trajectories)
        return self if not len(new) else Applied(np.union1d(self.rows, new))

    def save(self, directory: Path) -> None:
        np.save(directory / FILE, self.rows, allow_pickle=False)

    @classmethod
    def load(cls, directory: Path) -> Applied:
        """The ledger saved in ``directory``; none saved (an older index) is an empty one, and one of id keys
        only (before content keys) is read as entries of unknown content."""
        path = directory / FILE
        if not path.exists():
            return cls()
        try:
            keys = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise CorruptIndex(path, f"not a numpy array file ({e})") from None
        if keys.dtype == np.uint64 and keys.ndim == 1:  # the ledger before content keys: ids only
            rows = np.zeros(len(keys), dtype=ROW)
            rows["id"] = keys
        elif keys.dtype == ROW and keys.ndim == 1:
            rows = keys
        else:
            raise CorruptIndex(path, "expected a 1-d array of (id, content) uint64 key pairs, "
                                     f"got {keys.dtype} {keys.shape}")
        ids, content = rows["id"], rows["content"]
        if not ((ids[1:] > ids[:-1]) | ((ids[1:] == ids[:-1]) & (content[1:] > content[:-1]))).all():
            raise CorruptIndex(path, "its keys are not sorted and unique")
        return cls(rows)
