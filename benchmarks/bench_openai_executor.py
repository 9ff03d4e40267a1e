"""The OpenAI-compatible executor against the loopback stub server: throughput, and a dripping server.

    python -m benchmarks.bench_openai_executor [--requests 200] [--concurrency 8] [--baseline REV]

Prints requests per second for ``--requests`` tool decisions at ``--concurrency`` in flight, and the
wall time of one request to a server that writes its reply one byte every 20 ms (about 8 s for the
whole reply) with ``timeout_s=2, max_retries=0``. With ``--baseline REV`` the same runs use the
executor of that git revision too (e.g. ``4cb0dee``, the hand-written urllib client), loaded from
``git show REV:tracer/executors/openai.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the stub server is the tests' own (tests/stub_openai_server.py, standard library only), imported as a
# module of the repository: ``python -m benchmarks.bench_openai_executor`` from its root
from tests.stub_openai_server import StubOpenAIServer
from tracer.executors import Request
from tracer.executors.openai import OpenAIExecutor

ROOT = Path(__file__).resolve().parents[1]

TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "A tool.",
                                           "parameters": {"type": "object",
                                                          "properties": {"x": {"type": "string"}}}}}
         for i in range(5)]


def executor_at(rev: str) -> type:
    """``OpenAIExecutor`` as it was at git revision ``rev`` (imported as a module of the tracer package)."""
    source = subprocess.run(["git", "show", f"{rev}:tracer/executors/openai.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "openai_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("tracer.executors.openai_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.OpenAIExecutor


def throughput(cls: type, n: int, concurrency: int) -> float:
    requests = [Request(messages=[{"role": "user", "content": f"tool_{i % 5} x=v{i}"}], tools=TOOLS)
                for i in range(n)]
    with StubOpenAIServer() as server:
        ex = cls(base_url=server.url, model="stub", api_key_env=None, concurrency=concurrency)
        start = time.perf_counter()
        decisions = ex.choose(requests)
        elapsed = time.perf_counter() - start
    assert all(d.call is not None for d in decisions)
    return n / elapsed


def drip(cls: type) -> tuple[float, str]:
    with StubOpenAIServer(drip_s=0.02) as server:
        ex = cls(base_url=server.url, model="stub", api_key_env=None, timeout_s=2, max_retries=0)
        start = time.perf_counter()
        [d] = ex.choose([Request(messages=[{"role": "user", "content": "tool_1"}], tools=TOOLS)])
        return time.perf_counter() - start, (d.error or "a reply")[:80]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--baseline", default=None)
    a = ap.parse_args()
    clients = {"httpx (this tree)": OpenAIExecutor}
    if a.baseline:
        clients[f"{a.baseline}"] = executor_at(a.baseline)
    for label, cls in clients.items():
        rps = throughput(cls, a.requests, a.concurrency)
        wall, what = drip(cls)
        print(f"{label}: {rps:.0f} requests/s ({a.requests} at concurrency {a.concurrency}); "
              f"dripping server, timeout_s=2: {wall:.1f} s -> {what}")


if __name__ == "__main__":
    main()
