"""The structures learned from trajectories.

- :mod:`~tracer.memory.keys`: :class:`StateKey` (which calls form a step's state) and key parsing.
- :mod:`~tracer.memory.transitions`: :class:`TransitionTable`, counts N(S, t) in CSR (ToolNet, AutoTool,
  H-EPM).
- :mod:`~tracer.memory.trie`: :class:`ExecutionTrie`, the table plus priors and edge memories (TRACER,
  tracer_plus).
- :mod:`~tracer.memory.priors`: the empirical and contextual priors.
"""
