"""Load test of ``tracer serve`` on loopback: throughput and the latency the gateway adds.

    python -m benchmarks.bench_gateway                          # 16 and 64 clients, BFCL index (tracer_plus)
    python -m benchmarks.bench_gateway --clients 16 --requests 1000 --out results/gateway
    python -m benchmarks.bench_gateway --floor ...          # also the floor: a proxy that only forwards bytes
    python -m benchmarks.bench_gateway --pin ...    # the gateway (and floor) on CPU 0,
                                                    # stub and clients on CPU 1

Three processes: a stub upstream that answers every chat completion at once with a fixed body
(uvicorn + Starlette, this file with ``--role stub``), the gateway (``python -m tracer.cli serve``,
k = 5, on an index fitted on all of BFCL and saved to a temporary directory) and this load generator
(asyncio + aiohttp, ``C`` clients each sending its next request when its answer arrives, after a pause:
0 ms is the throughput test, where every client is always waiting and latency is mostly queueing on
a saturated gateway; 250 ms stands for an agent's own work between model calls, drawn per pause from
[125, 375] ms so the clients do not stay in step). Requests are BFCL decision
steps: the conversation up to a gold call plus the whole 128-tool registry, the same bodies for both
phases. At each concurrency the same request list is sent first straight to the stub (the direct
phase), then through the gateway; each phase is bounded by ``--requests`` and ``--max-seconds``.

Reported per concurrency: throughput, latency p50/p99 direct and through the gateway, the selection
(``X-Tracer-Selection-Ms``, the time spent choosing), and the **added latency beyond the selection**: the
percentile of (gateway latency - that request's selection stage) minus the same percentile of the direct
latency. Also the CPU time the stub and the gateway processes used per request (``/proc``; selection included
for the gateway), which the machine's load does not inflate as it does wall-clock latency, and each process's
run-queue wait per request (time it was runnable but another job held the CPU;
``/proc/PID/task/*/schedstat``): the part of the latency that is the machine's other load, not the gateway's
work. ``--floor`` adds a third phase per row through a proxy on the same stack (uvicorn + Starlette + aiohttp)
that forwards the bytes without parsing or choosing: what any gateway built this way adds on this machine.
Errors: any non-200 answer or exception. The load average of the machine is printed beside the numbers (the
machine is shared).

``--pin`` (a machine with at least 2 CPUs) gives the gateway (and the floor proxy) CPU 0 and the stub and the
load generator CPU 1, in every phase, the direct one included (``taskset``, so every thread a process starts
inherits it). Unpinned, the three processes share the cores, and a request's hop to the stub wakes a process
that takes the gateway's core (docs/gateway.md, Latency); pinned, the gateway keeps a core of its own, as it
does where the model server and the agent run elsewhere. The direct phase then has the stub and the clients on
one core, which the table's direct columns show.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import aiohttp
import numpy as np

from benchmarks.loopback import ROOT, build_requests, free_port, run_phase, serve, stub_app, wait_ready


def floor_app(upstream: str):
    """The floor under any gateway on this stack: uvicorn + Starlette + aiohttp forwarding the request's
    bytes as they came (no parsing, no checks, no choosing), the answer's bytes back."""
    import contextlib as cl

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    session: list[aiohttp.ClientSession] = []

    @cl.asynccontextmanager
    async def lifespan(app):
        session.append(aiohttp.ClientSession(auto_decompress=False))
        yield
        await session[0].close()

    async def completions(request):
        async with session[0].post(upstream + "/chat/completions", data=await request.body(),
                                   headers={"content-type": "application/json"}) as r:
            return Response(await r.read(), r.status, media_type="application/json")

    async def health(request):
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                             Route("/health", health)],
                     lifespan=lifespan)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux ``/proc``): a cost that the machine's load does not
    inflate."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_queue_ms(pid: int) -> float:
    """Milliseconds a process's threads have spent runnable but waiting for a CPU
    (``/proc/PID/task/*/schedstat``, second field): the scheduling delay the other jobs on the machine impose,
    which latency includes."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e6


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("bench", "stub", "floor"), default="bench")
    p.add_argument("--upstream", default=None, help="(--role floor) the upstream's /v1 base URL")
    p.add_argument("--floor", action="store_true",
                   help="also send each phase through a byte-forwarding proxy on the same stack (the floor)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    p.add_argument("--requests", type=int, default=1000, help="requests per phase")
    p.add_argument("--think-ms", type=float, nargs="+", default=[0.0, 250.0],
                   help="each client's mean pause after an answer (0: back to back, the throughput test)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="per phase")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--index", type=Path, default=None, help="a saved BFCL index (default: fit tracer_plus)")
    p.add_argument("--pin", action="store_true",
                   help="gateway and floor on CPU 0, stub and load generator on CPU 1")
    args = p.parse_args()
    if args.role in ("stub", "floor"):
        serve(stub_app() if args.role == "stub" else floor_app(args.upstream), args.port)
        return

    bodies, index = build_requests(args.requests, args.index)
    stub_port, gw_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        p.error("--pin needs 2 CPUs")


    def on(n: int) -> list[str]:  # a child's command prefix: taskset pins it, and so every thread it starts
        return ["taskset", "-c", str(n)] if args.pin else []

    if args.pin:
        os.sched_setaffinity(0, {1})  # this load generator
    stub = subprocess.Popen([*on(1), sys.executable, "-m", "benchmarks.bench_gateway", "--role", "stub",
                             "--port", str(stub_port)], env=env)
    gateway = subprocess.Popen([*on(0), sys.executable, "-m", "tracer.cli", "serve", "--index", str(index),
                                "--upstream", f"http://127.0.0.1:{stub_port}/v1", "--port", str(gw_port),
                                "--k", "5", "--log-level", "warning"], env=env, cwd=ROOT)
    floor = None
    if args.floor:
        floor_port = free_port()
        floor = subprocess.Popen([*on(0), sys.executable, "-m", "benchmarks.bench_gateway", "--role", "floor",
                                  "--port", str(floor_port),
                                  "--upstream", f"http://127.0.0.1:{stub_port}/v1"], env=env)
    rows = []
    try:
        wait_ready(f"http://127.0.0.1:{stub_port}/health", stub)
        wait_ready(f"http://127.0.0.1:{gw_port}/health", gateway)
        if floor is not None:
            wait_ready(f"http://127.0.0.1:{floor_port}/health", floor)
            asyncio.run(run_phase(f"http://127.0.0.1:{floor_port}/v1/chat/completions", bodies[:200], 4, 60))
        direct_url = f"http://127.0.0.1:{stub_port}/v1/chat/completions"
        gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        asyncio.run(run_phase(gw_url, bodies[:200], 4, 60))  # warm-up: caches, connections
        for c, think in ((c, t) for t in args.think_ms for c in args.clients):
            load = os.getloadavg()
            pids = {"client": os.getpid(), "gateway": gateway.pid, "stub": stub.pid}
            cpu0, wait0 = cpu_seconds(stub.pid), {k: run_queue_ms(p) for k, p in pids.items()}
            direct = asyncio.run(run_phase(direct_url, bodies, c, args.max_seconds, think / 1e3))
            cpu1, gw0, wait1 = cpu_seconds(stub.pid), cpu_seconds(gateway.pid), {k: run_queue_ms(p)
                                                                                 for k, p in pids.items()}
            through = asyncio.run(run_phase(gw_url, bodies, c, args.max_seconds, think / 1e3))
            gw1, wait2 = cpu_seconds(gateway.pid), {k: run_queue_ms(p) for k, p in pids.items()}
            beyond = through["latency"] - through["selection"]
            rows.append({
                "clients": c, "think_ms": think, "pinned": int(args.pin), "load_avg_1m": round(load[0], 2),
                "requests": through["n"], "errors": direct["errors"] + through["errors"],
                "stub_cpu_ms_per_request": (cpu1 - cpu0) / max(direct["n"], 1) * 1e3,
                "gateway_cpu_ms_per_request": (gw1 - gw0) / max(through["n"], 1) * 1e3,
                "direct_rps": direct["n"] / direct["wall"], "gateway_rps": through["n"] / through["wall"],
                "direct_p50": np.percentile(direct["latency"], 50),
                "direct_p99": np.percentile(direct["latency"], 99),
                "gateway_p50": np.percentile(through["latency"], 50),
                "gateway_p99": np.percentile(through["latency"], 99),
                "selection_p50": np.percentile(through["selection"], 50),
                "selection_p99": np.percentile(through["selection"], 99),
                "added_p50": np.percentile(beyond, 50) - np.percentile(direct["latency"], 50),
                "added_p99": np.percentile(beyond, 99) - np.percentile(direct["latency"], 99),
                **{f"wait_direct_{k}_ms": (wait1[k] - wait0[k]) / max(direct["n"], 1)
                   for k in ("client", "stub")},
                **{f"wait_gateway_{k}_ms": (wait2[k] - wait1[k]) / max(through["n"], 1) for k in pids}})
            if floor is not None:  # after the gateway phase, so the two phases above keep their order
                bare = asyncio.run(run_phase(f"http://127.0.0.1:{floor_port}/v1/chat/completions", bodies, c,
                                             args.max_seconds, think / 1e3))
                rows[-1].update(floor_errors=bare["errors"],
                                floor_added_p50=np.percentile(bare["latency"], 50) - rows[-1]["direct_p50"],
                                floor_added_p99=np.percentile(bare["latency"], 99) - rows[-1]["direct_p99"])
            print(json.dumps({k: round(float(v), 5) for k, v in rows[-1].items()}), flush=True)
    finally:
        for proc in (gateway, stub) if floor is None else (floor, gateway, stub):
            proc.terminate()
            proc.wait(30)
    head = ("| clients | pause (ms) | load avg (1 min) | requests | errors | throughput direct / gateway "
            "(req/s) | latency p50 / p99 direct (ms) | latency p50 / p99 gateway (ms) | selection p50 / p99 "
            "(ms) | **added beyond selection p50 / p99 (ms)** | CPU per request: stub / gateway (ms) |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    md = head + "".join(
        f"| {r['clients']} | {r['think_ms']:.0f} | {r['load_avg_1m']} | {r['requests']} | {r['errors']} | "
        f"{r['direct_rps']:.0f} / {r['gateway_rps']:.0f} | {ms(r['direct_p50'])} / {ms(r['direct_p99'])} | "
        f"{ms(r['gateway_p50'])} / {ms(r['gateway_p99'])} | {ms(r['selection_p50'])} / "
        f"{ms(r['selection_p99'])} | **{ms(r['added_p50'])} / {ms(r['added_p99'])}** | "
        f"{r['stub_cpu_ms_per_request']:.2f} / {r['gateway_cpu_ms_per_request']:.2f} |\n" for r in rows)
    md += ("\nRun-queue wait per request (ms: time runnable but waiting for a CPU, from "
           "/proc/PID/task/*/schedstat)\n\n"
           "| clients | pause (ms) | direct phase: client / stub | gateway phase: client / gateway / stub |\n"
           "|---:|---:|---:|---:|\n") + "".join(
        f"| {r['clients']} | {r['think_ms']:.0f} | {r['wait_direct_client_ms']:.2f} / "
        f"{r['wait_direct_stub_ms']:.2f} | {r['wait_gateway_client_ms']:.2f} / "
        f"{r['wait_gateway_gateway_ms']:.2f} / {r['wait_gateway_stub_ms']:.2f} |\n"
        for r in rows)
    if args.floor:
        md += ("\nThe floor: the same requests through a proxy on the same stack that forwards bytes without "
               "parsing or choosing (`--floor`), its latency minus the direct one\n\n"
               "| clients | pause (ms) | errors | added by the byte-forwarding proxy p50 / p99 (ms) |\n"
               "|---:|---:|---:|---:|\n") + "".join(
            f"| {r['clients']} | {r['think_ms']:.0f} | {r['floor_errors']} | "
            f"{ms(r['floor_added_p50'])} / {ms(r['floor_added_p99'])} |\n" for r in rows)
    from tracer.core.threads import machine

    md = f"Machine: {machine()}; {'pinned' if args.pin else 'not pinned'}.\n\n" + md
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "bench_gateway_pinned" if args.pin else "bench_gateway"
        (args.out / f"{stem}.md").write_text(md)
        (args.out / f"{stem}.json").write_text(json.dumps(
            [{k: float(v) for k, v in r.items()} for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
