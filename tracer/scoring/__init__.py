"""The scoring layer: the interface every tool selector shares and the one place scores become tool sets.

- :mod:`~tracer.scoring.protocol`: :class:`Scorer` (every capability declared) and :class:`ScorerBase`
  (defaults).
- :mod:`~tracer.scoring.records`: :class:`Scores` (primary, fallback, fell_back, diagnostics, presentation)
  and
  :class:`Selection`.
- :mod:`~tracer.scoring.ranking`: ``rank`` and ``finalize`` (padding, always-present tools, present-all), the
  shared tensor helpers (``scatter_primary``, ``no_proposal``, ``confidence``).
- :mod:`~tracer.scoring.resources`: :class:`Resources` (registry, embedder, tool index) and the training
  steps.
- :mod:`~tracer.scoring.single_step`: one live step in numpy, equal to the batched path (the per-step budget
  needs it).
- :mod:`~tracer.scoring.fit`: :class:`FitReport`; :mod:`~tracer.scoring.persist`: saved indexes.
"""
