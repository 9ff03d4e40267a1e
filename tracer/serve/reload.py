"""The served index: loaded read-only, swapped without a restart when its directory changes.

An index directory either holds a ``CURRENT`` pointer (immutable snapshots, the pointer replaced
atomically when a new one is published) or, in the older layout, a ``meta.json`` rewritten by an
atomic directory swap. :func:`version_token` reads whichever exists; :meth:`IndexHolder.maybe_reload`
loads a new :class:`Retriever` when the token changed (a poll, and on SIGHUP) and swaps the reference
in one assignment, so a request in flight keeps the retriever it started with.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from tracer.retriever import Retriever

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


def version_token(directory: str | Path) -> tuple[int, bytes] | None:
    """(mtime_ns, content) of ``DIR/CURRENT`` if it exists, else of ``DIR/meta.json``; None if neither does."""
    d = Path(directory)
    for name in ("CURRENT", "meta.json"):
        path = d / name
        try:
            return path.stat().st_mtime_ns, path.read_bytes()
        except FileNotFoundError:
            continue
    return None


class IndexHolder:
    """The current retriever of an index directory, reloadable.

    Args:
        directory: the index directory (``--index``).
        load: builds a retriever from the directory (default :meth:`Retriever.load`).
    """

    def __init__(self, directory: str | Path, load: Callable[[Path], Retriever] | None = None):
        self.directory = Path(directory)
        self._load = load or Retriever.load
        self._lock = threading.Lock()  # one reload at a time
        self.token = version_token(self.directory)
        self.retriever = self._load(self.directory)
        self.reloads = 0

    def maybe_reload(self, force: bool = False) -> bool:
        """Load the index again if its version token changed (or ``force``); True when swapped.

        A failed load (a snapshot being written, a bad file) keeps the current retriever and is logged.
        """
        with self._lock:
            token = version_token(self.directory)
            if token == self.token and not force:
                return False
            try:
                fresh = self._load(self.directory)
            except Exception as e:  # noqa: BLE001  (any failure: keep serving the old index)
                log.error("index reload failed; still serving the previous index",
                          extra={"event": "reload_failed", "index": str(self.directory), "error": repr(e)})
                return False
            self.retriever, self.token = fresh, token
            self.reloads += 1
            log.info("index reloaded", extra={"event": "reloaded", "index": str(self.directory),
                                              "tools": len(fresh.registry)})
            return True
