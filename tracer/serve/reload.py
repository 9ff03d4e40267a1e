"""The served index: loaded read-only, swapped without a restart when its directory changes.

An index directory either holds a ``CURRENT`` pointer (immutable snapshots, the pointer replaced
atomically when a new one is published) or, in the older layout, a ``meta.json`` rewritten by an
atomic directory swap. :func:`version_token` reads whichever exists; :meth:`IndexHolder.maybe_reload`
loads a new :class:`Retriever` when the token changed (a poll, and on SIGHUP) and swaps the reference
in one assignment, so a request in flight keeps the retriever it started with.

A version that fails to load is remembered (:attr:`IndexHolder.failure`, shown by ``/health``) and not
loaded again by a poll until the token changes: a snapshot is immutable, so a corrupt one
(:class:`~tracer.core.errors.DataError`: a checksum, a file that does not parse) stays corrupt, and every
try would hash the whole index again. Any other failure (an ``OSError``, memory) may pass: that version
is tried again after 1 s, then 2, 4, ... up to 5 minutes (:func:`tracer.core.backoff.backoff_s`). A forced
reload (SIGHUP, the admin endpoint) always tries.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracer.core.backoff import backoff_s
from tracer.core.errors import DataError
from tracer.retriever import Retriever
from tracer.serve.bounded import MESSAGE_CHARS, clip

log = logging.getLogger("tracer.serve")

# Young-generation threshold of the cyclic collector while serving (CPython's default is 700). A
# request's parsed body (~900 dicts and lists for a 128-tool request) and the stack's own objects are
# freed by reference counting when the request ends, but while they live they set off about one young
# collection per request and a generation-1 pass every ~11 requests: ~0.1 ms of CPU per request, and
# passes of up to 5 ms measured on the event loop (docs/gateway.md, Latency). At 100,000 a collection
# runs only once that many containers outlive their requests (reference cycles): a few MB at most.
SERVING_GC_THRESHOLD = 100_000


def freeze_long_lived() -> None:
    """Collect once, then move every object alive now (the loaded index, torch, the libraries: ~450k)
    out of the collector's sight (``gc.freeze``), and raise the young-generation threshold (above)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GC_THRESHOLD, *gc.get_threshold()[1:])


def refreeze_long_lived() -> None:
    """After a reload: if the process froze its long-lived objects (``tracer serve``), freeze again so
    the new index is frozen too, and the old one's cycles become collectable."""
    if gc.get_freeze_count():
        gc.unfreeze()
        freeze_long_lived()


def version_token(directory: str | Path) -> tuple[int, bytes] | None:
    """(mtime_ns, content) of ``DIR/CURRENT`` if it exists, else of ``DIR/meta.json``; None if neither
    does."""
    d = Path(directory)
    for name in ("CURRENT", "meta.json"):
        path = d / name
        try:
            return path.stat().st_mtime_ns, path.read_bytes()
        except FileNotFoundError:
            continue
    return None


MAX_BACKOFF_S = 300.0


def version_name(token: tuple[int, bytes] | None) -> str | None:
    """The snapshot a token names (``snapshots/<id>``); None for the older layout."""
    if token is None or not token[1].startswith(b"snapshots/"):
        return None
    return token[1].decode("utf-8", "replace").strip()


@dataclass
class LoadFailure:
    """The last version that failed to load: its token, the error, when it may be tried again."""

    token: tuple[int, bytes] | None
    error: str
    attempts: int
    retry_at: float


class IndexHolder:
    """The current retriever of an index directory, reloadable.

    Args:
        directory: the index directory (``--index``).
        load: builds a retriever from the directory (default :meth:`Retriever.load`).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, directory: str | Path, load: Callable[[Path], Retriever] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.directory = Path(directory)
        self._load, self._clock = load or Retriever.load, clock
        self._lock = threading.Lock()  # one reload at a time
        self.token, self.retriever = self._load_stable()
        self.served = (self.retriever, self.version)  # one attribute: a request reads both from one load
        self.reloads = 0
        self.failure: LoadFailure | None = None  # the newest version failed; cleared by a good load
        self.failed_loads = 0

    def _load_stable(self) -> tuple[tuple[int, bytes] | None, Retriever]:
        """The version token and the retriever loaded under it: a pointer replaced during the load (a writer
        publishing meanwhile) means the load may have resolved the newer snapshot, so it is loaded again until
        the token is the same before and after (the pointer only moves forward; bounded all the same)."""
        for _ in range(5):
            token = version_token(self.directory)
            fresh = self._load(self.directory)
            if version_token(self.directory) == token:
                break
        return token, fresh

    @property
    def version(self) -> str | None:
        """The snapshot being served (``snapshots/<id>``; None for the older layout)."""
        return version_name(self.token)

    def health(self) -> dict:
        """``status`` "ok", or "degraded" with ``reload_error`` and ``failed_version`` while the newest
        version failed to load (the previous one, ``version``, is still served)."""
        r, failure = self.retriever, self.failure
        report = {"status": "ok" if failure is None else "degraded", "tools": len(r.registry),
                  "scorer": r.scorer.name, "index": str(self.directory), "version": self.version,
                  "reloads": self.reloads}
        if failure is not None:
            report.update(reload_error=failure.error, failed_version=version_name(failure.token))
        return report

    def maybe_reload(self, force: bool = False) -> bool:
        """Load the index again if its version token changed (or ``force``); True when swapped.

        A failed load (a snapshot being written, a bad file) keeps the current retriever, is logged and
        remembered; a poll does not try that version again before its ``retry_at`` (module docstring).
        """
        with self._lock:
            token = version_token(self.directory)
            if not force and (token == self.token or self._waiting(token)):
                return False
            try:
                token, fresh = self._load_stable()
            except Exception as e:  # noqa: BLE001  (any failure: keep serving the old index)
                self._failed(token, e)
                return False
            self.retriever, self.token, self.failure = fresh, token, None
            self.served = (fresh, self.version)
            self.reloads += 1
            log.info("index reloaded", extra={"event": "reloaded", "index": str(self.directory),
                                              "tools": len(fresh.registry)})
            return True

    def _waiting(self, token: tuple[int, bytes] | None) -> bool:
        f = self.failure
        return f is not None and f.token == token and self._clock() < f.retry_at

    def _failed(self, token: tuple[int, bytes] | None, e: Exception) -> None:
        same = self.failure is not None and self.failure.token == token
        attempts = self.failure.attempts + 1 if same else 1
        backoff = math.inf if isinstance(e, DataError) else backoff_s(1.0, attempts, cap=MAX_BACKOFF_S)
        self.failure = LoadFailure(token, clip(repr(e), MESSAGE_CHARS), attempts, self._clock() + backoff)
        self.failed_loads += 1
        log.error("index reload failed; still serving the previous index",
                  extra={"event": "reload_failed", "index": str(self.directory), "error": self.failure.error,
                         "version": version_name(token), "retry_in_s": backoff})
