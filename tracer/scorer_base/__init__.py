"""What every scorer builds on: the interface every tool selector shares and the one place scores become tool
sets.

- :mod:`~tracer.scorer_base.protocol`: :class:`Scorer` (every capability declared) and :class:`ScorerBase`
  (defaults).
- :mod:`~tracer.scorer_base.records`: :class:`Scores` (primary, fallback, fell_back, diagnostics,
  presentation) and :class:`Selection`.
- :mod:`~tracer.scorer_base.ranking`: ``rank`` and ``finalize`` (padding, always-present tools, present-all),
  the shared tensor helpers (``scatter_primary``, ``no_proposal``, ``confidence``).
- :mod:`~tracer.scorer_base.resources`: :class:`Resources` (registry, embedder, tool index) and the training
  steps.
- :mod:`~tracer.scorer_base.single_step`: one live step in numpy, equal to the batched path (the per-step
  budget needs it).
- :mod:`~tracer.scorer_base.fit`: :class:`FitReport`; :mod:`~tracer.scorer_base.persist`: saved indexes.
"""
