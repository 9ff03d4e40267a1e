"""Scorers, one module each; each is built from its YAML in ``tracer/configs/scorer/`` (``_target_`` +
arguments).

Adding a scorer: write ``tracer/scorers/<name>.py`` with a class deriving from
:class:`tracer.scorer_base.protocol.ScorerBase` and add ``tracer/configs/scorer/<name>.yaml`` whose
``_target_`` is its class. ``tracer.build.build_scorer("<name>")`` and ``python evaluate.py scorer=<name>``
then find it; ``tests/unit/configs/test_configs.py`` builds it and
``tests/integration/scorers/test_scorer_conformance.py`` runs the Scorer contract over it.
"""
