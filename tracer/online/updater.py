"""A fitted scorer that keeps learning while it serves: trajectories in, tries updated at once, learned
weights refitted on a schedule in the background, tools added, removed and renamed without a rebuild.

Example::

    up = Updater(scorer, refit_every=500, history=train_trajectories)
    up.update(new_trajectories, tools=new_tool_definitions)   # tries updated now
    up.remove_tool("old_api")                                  # gone from every ranking at once
    up.wait()                                                   # the background refit, if one runs

- *Tries* (:func:`tracer.online.incremental.update_scorer`): synchronous, the same result as a rebuild on the
  union (see :mod:`tracer.online.incremental` for the float tolerance of the edge memories).
- *Learned parts* (tracer's blend head, tracer_plus's candidate model): refitted on every trajectory
  the updater holds (``history`` plus every update) every ``refit_every`` trajectories or on
  :meth:`Updater.refit`, in a daemon thread, by a fresh scorer of the same config fitted with the
  same seed; the new weights replace the old in one attribute assignment, so a step is scored by
  the old weights or the new, never a mix. Until then the current weights serve the updated tries.
  A refit equals a batch fit on the same trajectories (same inner folds, same seed). A tracer_plus
  with transferred weights (``transfer``) keeps them; set ``scorer.transfer = None`` to refit it on
  its own logs once there are enough.
- *Encoder* (opt-in, ``encoder=``): a refit first fine-tunes the encoder on the updater's trajectories
  (e.g. ``lambda trajs, registry: build_fold_encoders(registry, recipe)(trajs)`` with a recipe of
  ``configs/encoder_training/``; checkpoints are cached by a content hash of the pairs), builds fresh
  resources around it, fits a fresh scorer on them (tries, tables and weights: every stored context is
  embedded anew), adds what arrived meanwhile and swaps the whole scorer in by one assignment
  (``on_swap`` tells the owner: :class:`tracer.retriever.Retriever` replaces its scorer).
- *Drift*: :meth:`Updater.remove_tool` masks a tool out of every ranking (the retriever filters it;
  its trie edges stay, so :meth:`Updater.add_tool` of the same name brings it back as it was);
  :meth:`Updater.add_tool` registers a tool with its fallback vector; :meth:`Updater.rename_tool`
  renames it in the registry, the fallback index and every trie state. The mask lives in the
  scorer's resources (``Resources.removed``), so a saved index keeps it (``meta.json``).

Updates are serialised by a lock; a scorer must not be scored from another thread while
:meth:`Updater.update` mutates its tries (the refit thread never touches them).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tracer.core.types import Registry, Tool, Trajectory
from tracer.online.incremental import grow_resources, rename_scorer, update_scorer
from tracer.scorer_base.resources import Resources


class Updater:
    """Incremental updates, a refit schedule and registry drift for one fitted scorer.

    Args:
        scorer: a fitted scorer (any; only those with tries learn from trajectories).
        refit_every: refit the learned part after this many new trajectories (None: on demand only).
        history: the trajectories the scorer was fitted on; refits learn from them plus every update.
        background: refit in a daemon thread (False: in the caller's thread, e.g. for a CLI).
        encoder: ``(trajectories, registry) -> Resources`` around an encoder fine-tuned on them; given, a
            refit rebuilds the whole scorer over it (see the module docstring). None: the weights only.
        on_swap: called with the new scorer after an encoder refit swapped it in.
    """

    def __init__(self, scorer, refit_every: int | None = None, history: Iterable[Trajectory] = (),
                 background: bool = True,
                 encoder: Callable[[Sequence[Trajectory], Registry], Resources] | None = None,
                 on_swap: Callable[[Any], None] | None = None):
        if scorer.res is None:
            raise ValueError(f"scorer {scorer.name!r} is not fitted")
        if refit_every is not None and refit_every < 1:
            raise ValueError(f"refit_every must be >= 1 or None, got {refit_every}")
        self.scorer, self.refit_every, self.background = scorer, refit_every, background
        self.encoder, self.on_swap = encoder, on_swap
        self.trajectories: list[Trajectory] = list(history)
        self.since_refit = 0
        self.refits: list[dict] = []     # one entry per completed refit: trajectories, seconds
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending = False

    # ---- trajectories ------------------------------------------------------------------------
    def update(self, trajectories: Sequence[Trajectory], tools: Sequence[Tool] = ()) -> dict:
        """Register ``tools`` not yet known (a removed one comes back), add the successful steps of the
        trajectories not applied before (by id and content: the ledger ``res.applied``,
        :mod:`tracer.core.applied`) to every trie, and start a refit when the schedule says so. Returns what
        was done: ``trajectories`` applied now, ``already_applied`` (left out: the same id and content applied
        before, or repeated in this call), ``id_reused`` (applied now although their id was applied before
        with other content: another trajectory under a reused id) and their ids, ``reused_ids``."""
        t0 = time.perf_counter()
        with self._lock:
            split = self.scorer.res.applied.split(trajectories)
            fresh = split.fresh
            res = grow_resources(self.scorer.res, tools)
            res = dataclasses.replace(res, removed=res.removed - {t.name for t in tools},
                                      applied=res.applied.adding(fresh))
            n_new_tools = len(res.registry) - len(self.scorer.res.registry)
            n_steps = update_scorer(self.scorer, fresh, res)
            self.trajectories.extend(fresh)
            self.since_refit += len(fresh)
            due = self.refit_every is not None and self.since_refit >= self.refit_every
        out = {"trajectories": len(fresh), "already_applied": split.already, "id_reused": len(split.reused),
               "reused_ids": [t.id for t in split.reused], "steps": n_steps,
               "new_tools": n_new_tools, "seconds": time.perf_counter() - t0, "refit_started": False}
        if due and self.refits_anything:
            out["refit_started"] = self.refit(wait=not self.background)
        return out

    # ---- learned parts -----------------------------------------------------------------------
    def refit(self, wait: bool = True) -> bool:
        """Refit the learned part on every trajectory held now and swap it in (``wait``: block until done).
        Returns False when the scorer has nothing to refit. A refit asked for while one runs starts
        when it ends, on the trajectories held then."""
        if not self.refits_anything:
            return False
        with self._lock:
            self.since_refit = 0
            if self._thread is not None and self._thread.is_alive():
                self._pending = True
                thread = self._thread
            else:
                thread = self._thread = threading.Thread(target=self._refit_loop, name="tracer-refit",
                                                         daemon=True)
                thread.start()
        if wait:
            self.wait()
        return True

    def _refit_loop(self) -> None:
        while True:
            with self._lock:
                trajectories, res, self._pending = list(self.trajectories), self.scorer.res, False
            t0 = time.perf_counter()
            entry = {"trajectories": len(trajectories)}
            try:
                if self.encoder is not None:
                    self._refit_with_encoder(trajectories, res)
                else:
                    fresh = type(self.scorer)(**self.scorer.config())
                    fresh.fit(trajectories, res)
                    self.scorer.adopt(fresh)   # the learned part in one assignment: the swap is atomic
            except Exception as e:  # noqa: BLE001  (kept for wait() to raise; the old weights keep serving)
                entry["error"] = e
            with self._lock:
                self.refits.append({**entry, "seconds": time.perf_counter() - t0})
                if not self._pending:
                    return

    @property
    def refits_anything(self) -> bool:
        return self.encoder is not None or self.scorer.learned_part is not None

    def _refit_with_encoder(self, trajectories: list[Trajectory], res: Resources) -> None:
        """Fine-tune, rebuild and fit a fresh scorer on ``trajectories``, catch it up under the lock with the
        trajectories and tools that arrived meanwhile and the removed-tools mask, then swap it in whole."""
        fresh = type(self.scorer)(**self.scorer.config())
        fresh.fit(trajectories, self.encoder(trajectories, res.registry))
        with self._lock:
            now = self.scorer.res
            grown = grow_resources(fresh.res, list(now.registry)[len(fresh.res.registry):])
            update_scorer(fresh, self.trajectories[len(trajectories):],
                          dataclasses.replace(grown, removed=now.removed, applied=now.applied))
            self.scorer = fresh                                    # one assignment: the swap is atomic
            if self.on_swap is not None:
                self.on_swap(fresh)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the running refit (and any refit queued behind it) has been swapped in; a refit
        that failed (e.g. too few trajectories for the inner folds) raises its error here."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if self.refits and "error" in self.refits[-1]:
            raise RuntimeError(f"refit on {self.refits[-1]['trajectories']} trajectories failed; "
                               "the previous weights still serve") from self.refits[-1]["error"]

    # ---- registry drift ----------------------------------------------------------------------
    def add_tool(self, tool: Tool) -> None:
        """Register a tool (embedding its fallback vector); a removed tool of that name comes back."""
        self.update([], [tool])

    def remove_tool(self, name: str) -> None:
        """Mask a tool out of every ranking at once (no rebuild; saved with the index)."""
        with self._lock:
            res = self.scorer.res
            if name not in res.registry:
                raise KeyError(f"cannot remove {name!r}: no such tool in the registry")
            self.scorer.res = dataclasses.replace(res, removed=res.removed | {name})

    def rename_tool(self, old: str, new: str) -> None:
        """Rename a tool: registry, fallback vector and trie states; its counts and memories stay."""
        with self._lock:
            rename_scorer(self.scorer, old, new)

    @property
    def removed(self) -> frozenset[str]:
        """Names of the tools masked out of every ranking (the scorer's ``res.removed``)."""
        return self.scorer.res.removed
