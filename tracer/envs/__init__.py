"""Environments for free-running evaluation: where an executor's calls run, with a benchmark's turn rules
and its verdict. :class:`tracer.envs.base.Environment` is the interface; BFCL (:mod:`tracer.envs.bfcl`)
is the one implementation. A dataset names its environment class (``Dataset.environment``)."""
