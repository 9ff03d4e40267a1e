"""tracer: trajectory-aware tool retrieval for LLM agents.

Layers, lowest first (imports point down only; tests/unit/test_layers.py checks it):
``core`` records, steps, contexts, files and errors; ``data``, ``encode``, ``memory``, ``executors``;
``scoring`` (the Scorer interface, ranking and presentation); ``learn`` (losses, trainers, learned heads);
``scorers``; ``online``, ``envs``; ``eval``, ``train``, ``retriever``; ``serve``; ``cli``.
The public entry from Python is :class:`tracer.retriever.Retriever`.
"""
