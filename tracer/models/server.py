"""Start a model's OpenAI-compatible server (``llama_cpp.server``) on 127.0.0.1 and wait until it answers.

:func:`start_server` runs the engine's Python on the verified GGUF file (llama_cpp.server through
``llama_shim.py``, which lets a message's content be null, as OpenAI's format does), the model's chat
format and context, with stdout and stderr in ``<models_dir>/logs/NAME-PORT.log``, and returns a
:class:`ModelServer` once ``GET /v1/models`` answers 200. A server that exits while starting, or is not
answering by the deadline, is reported with the tail of its log (and stopped). llama.cpp prints its
timings for each completion to that log; :func:`timings` reads them back.

llama.cpp's OpenMP threads spin while they wait for each other; on a machine whose cores are shared
(2 cores, load average 5) a spinning thread holds a core another one needs, and 2 threads ran slower
than 1 (SmolLM2's prompt: 22 against 56 tokens/s). The server therefore runs with
``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it (2 threads then: 99 tokens/s).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import httpx

from tracer.models.catalogue import ModelSpec, models_dir

# llama_cpp.server behind a middleware that accepts null message content (see llama_shim.py)
SHIM = Path(__file__).with_name("llama_shim.py")


class ServerError(RuntimeError):
    """The model server did not start, or stopped while starting."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float, log: Path | None = None,
                 poll_s: float = 0.25) -> float:
    """Poll ``GET {url}/models`` (``url`` is the API root, ``.../v1``) until it answers 200.

    Returns the seconds waited. Raises :class:`ServerError` when ``process`` exits first or the deadline
    passes, with the tail of ``log``."""
    start = time.monotonic()
    while True:
        code = process.poll()
        if code is not None:
            raise ServerError(f"the model server exited ({code}) before answering at {url}\n"
                              f"{log_tail(log) if log else ''}")
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        if time.monotonic() - start > timeout_s:
            raise ServerError(f"the model server did not answer at {url} within {timeout_s:g} s\n"
                              f"{log_tail(log) if log else ''}")
        time.sleep(poll_s)


@dataclass
class ModelServer:
    """A running model server. ``url`` is its API root (``http://127.0.0.1:PORT/v1``), ``model`` the name
    it serves; use it as a context manager or call :meth:`stop`."""

    spec: ModelSpec
    process: subprocess.Popen
    url: str
    log: Path
    started_s: float

    @property
    def model(self) -> str:
        return self.spec.name

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (uvicorn's graceful stop; SIGINT is ignored by a process started in the background),
        then SIGKILL after ``timeout_s``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)

    def timings(self) -> list[dict[str, float]]:
        return timings(self.log.read_text(errors="replace"))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def server_command(spec: ModelSpec, python: Path, weights: Path, port: int, n_ctx: int | None = None,
                   threads: int | None = None, extra_args: Sequence[str] = (),
                   prompt_cache_mb: int | None = None) -> list[str]:
    """The ``llama_cpp.server`` command line (through :data:`SHIM`) for ``spec`` on 127.0.0.1:``port``.

    ``prompt_cache_mb``: keep up to that many MiB of evaluated prompts' KV states in RAM, each found again by
    its longest token prefix (llama_cpp's ``LlamaRAMCache``). Without it the server keeps only the last
    prompt's, so requests of several conversations taken in turn (free-running tasks advancing in
    lockstep) each re-read their whole prompt; with it each resumes from its own conversation's state.
    """
    threads = threads or os.cpu_count() or 1
    command = [str(python), str(SHIM), "--model", str(weights), "--model_alias", spec.name,
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx or spec.n_ctx),
               "--n_threads", str(threads), "--n_threads_batch", str(threads),
               # logits for the last token only: the server never returns prompt logprobs here
               "--logits_all", "false"]
    if spec.chat_format:
        command += ["--chat_format", spec.chat_format]
    if prompt_cache_mb:
        command += ["--cache", "true", "--cache_type", "ram", "--cache_size", str(prompt_cache_mb << 20)]
    return [*command, *extra_args]


def start_server(spec: ModelSpec, python: Path, weights: Path, port: int | None = None,
                 root: Path | None = None, n_ctx: int | None = None, threads: int | None = None,
                 timeout_s: float = 300, extra_args: Sequence[str] = (), prompt_cache_mb: int | None = None,
                 command: Sequence[str] | None = None) -> ModelServer:
    """Start the server and wait for it (``command`` replaces the llama_cpp command, for tests)."""
    port = port or free_port()
    logs = (root or models_dir()) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{spec.name}-{port}.log"
    if command is None:
        command = server_command(spec, python, weights, port, n_ctx, threads, extra_args, prompt_cache_mb)
    with open(log, "w") as out:
        process = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env={"OMP_WAIT_POLICY": "PASSIVE", **os.environ})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        waited = wait_healthy(url, process, timeout_s, log)
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        raise
    return ModelServer(spec=spec, process=process, url=url, log=log, started_s=waited)


# llama.cpp's perf lines, e.g.
#   "llama_perf_context_print: prompt eval time =  1234.56 ms /   210 tokens (  5.88 ms per token, ...)"
#   "llama_perf_context_print:        eval time =   456.78 ms /    20 runs   ( 22.84 ms per token, ...)"
_PERF = re.compile(r"(prompt eval|\beval) time\s*=\s*([0-9.]+) ms\s*/\s*([0-9]+) (?:tokens|runs)")


def timings(log_text: str) -> list[dict[str, float]]:
    """One entry per completion in a server log: prompt tokens and ms, generated tokens and ms, and the
    rates (tokens per second), from llama.cpp's ``prompt eval time`` and ``eval time`` lines."""
    out: list[dict[str, float]] = []
    current: dict[str, float] = {}
    for kind, ms, n in _PERF.findall(log_text):
        if kind == "prompt eval":
            current = {"prompt_tokens": int(n), "prompt_ms": float(ms)}
        elif current:
            current.update(generated_tokens=int(n), generation_ms=float(ms))
            for key, tokens, ms_key in (("prompt_tps", "prompt_tokens", "prompt_ms"),
                                        ("generation_tps", "generated_tokens", "generation_ms")):
                current[key] = round(1000 * current[tokens] / current[ms_key], 2) if current[ms_key] else 0.0
            out.append(current)
            current = {}
    return out
