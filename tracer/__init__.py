"""tracer: trajectory-aware tool retrieval for LLM agents.

The names a user needs::

    from tracer import Retriever, load_dataset, load_native

    retriever = Retriever.from_dataset("data/example", "tracer_plus")   # fit on logged trajectories
    retriever.select(messages, k=5)                                      # the k tools to present
    retriever.save("index/"); Retriever.load("index/")                   # a snapshot on disk

Layers, lowest first (imports point down only; tests/unit/test_layers.py checks it):
``core`` records, steps, contexts, files and errors; ``data``, ``encode``, ``memory``, ``executors``,
``models``; ``scorer_base`` (what every scorer builds on: the Scorer interface, resources, ranking and
presentation); ``learn`` (losses, trainers, learned heads); ``scorers`` (one module or package a scorer);
``online``, ``envs``; ``eval``, ``jobs``, ``retriever``, ``build``, ``run_dir``; ``serve``; ``cli``.
"""

from tracer.core.errors import DataError
from tracer.core.store import CorruptIndex
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import Dataset, load_dataset, load_native, register_loader
from tracer.retriever import Retriever
from tracer.scorer_base.protocol import Scorer

__all__ = ["CorruptIndex", "DataError", "Dataset", "Registry", "Retriever", "Scorer", "Tool", "Trajectory",
           "load_dataset", "load_native", "register_loader"]
