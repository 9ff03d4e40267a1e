"""The loopback pieces of the gateway benchmarks (``bench_gateway``, ``gateway_stages``): a stub upstream that
answers every chat completion at once with a fixed body, free ports, waiting for a process to serve, BFCL
request bodies with a saved index, and the load generator (``C`` clients, each sending its next request when
its answer arrives, after a pause).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ANSWER = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "stub",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "ok"}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


def stub_app():
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def completions(request):
        await request.body()
        return Response(ANSWER, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def serve(app, port: int) -> None:
    """Run ``app`` (the stub, or another proxy of a benchmark) on 127.0.0.1:``port`` until it is
    terminated."""
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                timeout_keep_alive=75)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def build_requests(n: int, index: Path | None) -> tuple[list[bytes], Path]:
    """n request bodies (BFCL steps, all tools) and a saved index (``index``, or one fitted on all of
    BFCL)."""
    from tracer.data import load_dataset
    from tracer.retriever import Retriever

    ds = load_dataset("bfcl", execute=False)
    if index is None:
        index = Path(tempfile.mkdtemp(prefix="bench_gateway_")) / "index"
        Retriever.from_dataset(ds, "tracer_plus", device="cpu").save(index)
    tools = ds.registry.to_openai()
    steps = ds.steps()
    bodies = [json.dumps({"model": "stub", "messages": list(s.context), "tools": tools}).encode()
              for s in steps[:n]]
    return bodies, index


async def run_phase(url: str, bodies: list[bytes], clients: int, max_seconds: float, think_s: float = 0.0,
                    seed: int = 0) -> dict:
    """Each client sends its next request when its answer arrived, after a pause drawn uniformly from
    [0.5, 1.5] x ``think_s`` (the first after one from [0, 1] x ``think_s``): independent agents, not 16
    clients that stay in step and arrive all at once every ``think_s``."""
    latencies, selection, errors, kinds = [], [], 0, {}
    rng = np.random.default_rng(seed)
    queue = list(enumerate(bodies))
    deadline = time.perf_counter() + max_seconds
    # aiohttp: the load generator shares the machine's cores with the stub and the gateway, so its own
    # CPU per request is kept small (aiohttp 0.25 ms against httpx 2.7 ms for these 68 KB bodies at 16
    # clients)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=180)) as client:
        async def worker() -> None:
            nonlocal errors
            if think_s:
                await asyncio.sleep(think_s * rng.uniform(0.0, 1.0))
            while queue and time.perf_counter() < deadline:
                _, body = queue.pop()
                t0 = time.perf_counter()
                try:
                    async with client.post(url, data=body, headers={"content-type": "application/json"}) as r:
                        content = await r.read()
                    dt = time.perf_counter() - t0
                    if r.status != 200 or content != ANSWER:
                        errors += 1
                        kinds[str(r.status)] = kinds.get(str(r.status), 0) + 1
                        continue
                    latencies.append(dt)
                    selection.append(float(r.headers.get("x-tracer-selection-ms", 0.0)) / 1e3)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    errors += 1
                    kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
                if think_s:
                    await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    if kinds:
        print(f"errors at {clients} clients against {url}: {kinds}", flush=True)
    return {"latency": np.array(latencies), "selection": np.array(selection), "errors": errors,
            "wall": wall, "n": len(latencies)}
