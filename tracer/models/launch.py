"""One call from a model's name to its running server: weights fetched and verified, engine found (or
built), server started and answering."""

from __future__ import annotations

from tracer.models.catalogue import get_model, models_dir
from tracer.models.engine import EngineError, engine_python, find_or_build_engine
from tracer.models.server import ModelServer, start_server
from tracer.models.weights import fetch


def serve(name: str, port: int | None = None, build: bool = False, **options) -> ModelServer:
    """Fetch ``name``'s weights when missing, find the engine (building it first when ``build``), start
    the server on 127.0.0.1 and wait until it answers. ``options`` go to :func:`start_server`
    (``n_ctx``, ``threads``, ``timeout_s``, ``extra_args``, ``prompt_cache_mb``).

    >>> with serve("smollm2") as server:       # doctest: +SKIP
    ...     openai.OpenAI(base_url=server.url, api_key="none").chat.completions.create(...)
    """
    spec = get_model(name)
    weights = fetch(spec)
    python = find_or_build_engine() if build else engine_python()
    if python is None:
        raise EngineError(f"no engine under {models_dir() / 'engine-venv'}: run "
                          "`python -m tracer.models build` (30-60 min on 2 cores) or `make model-server`")
    return start_server(spec, python, weights, port=port, **options)
