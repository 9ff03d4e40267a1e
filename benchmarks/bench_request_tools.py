"""What a gateway request costs before any selection when it carries its tool schemas, against the registry
held by the gateway (``tracer serve --tools-from-index``): body size, parsing and validating it
(``parse_chat_request``), and, held, building the candidate list (``tracer.serve.http.held.candidates``).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_request_tools [--sizes 1000 10000] [--repeats 50]

Tool schemas are BFCL's real function documents shipped in ``bfcl-eval`` (every ``BFCL_v4_*.json`` category:
1,853 distinct functions, ~600 bytes each); registries larger than that repeat them under suffixed names
(``name__2``), so body sizes are real and names distinct. Times are per request, single thread, the median of
``--repeats`` runs, thread CPU time, the cyclic collector set as ``tracer serve`` sets it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import time
from pathlib import Path

import orjson

from tracer.serve.http.held import candidates
from tracer.serve.http.validation import parse_chat_request
from tracer.serve.reload import freeze_long_lived

MESSAGES = [{"role": "user", "content": "Find the cheapest flight from SFO to JFK next Friday and book it."}]


def bfcl_functions() -> list[dict]:
    """Every distinct function document of bfcl-eval's BFCL_v4 categories, as OpenAI tool objects."""
    import bfcl_eval

    seen: dict[str, dict] = {}
    for path in sorted(glob.glob(str(Path(bfcl_eval.__file__).parent / "data" / "BFCL_v4_*.json"))):
        for line in Path(path).read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            for fn in row.get("function") or [] if isinstance(row, dict) else []:
                seen.setdefault(
                    fn["name"],
                    {
                        "type": "function",
                        "function": {
                            "name": fn["name"],
                            "description": fn.get("description", ""),
                            "parameters": {**fn.get("parameters", {}), "type": "object"},
                        },
                    },
                )
    return list(seen.values())


def registry(n: int, base: list[dict]) -> list[dict]:
    """``n`` tools: the documents in order, again and again, each name made valid and distinct."""
    out, used = [], set()
    for i in range(n):
        t = base[i % len(base)]
        name = t["function"]["name"].replace(".", "_")[:56]
        while name in used:
            name = f"{name[:56]}__{i // len(base) + len(used) % 7 + 2}"
        used.add(name)
        out.append({"type": "function", "function": {**t["function"], "name": name}})
    return out


def cpu_median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    base = bfcl_functions()
    freeze_long_lived()  # the collector as tracer serve sets it (tracer/serve/reload.py)
    print(
        f"{len(base)} distinct BFCL function documents; "
        f"machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; thread CPU time, median of {args.repeats}\n"
    )
    print("| tools | mode | body (KB) | parse + validate (ms) | held candidates (ms) | total (ms) |")
    print("|---:|---|---:|---:|---:|---:|")
    for n in args.sizes:
        tools = registry(n, base)
        names = [t["function"]["name"] for t in tools]
        full = orjson.dumps({"model": "m", "messages": MESSAGES, "tools": tools})
        bare = orjson.dumps({"model": "m", "messages": MESSAGES})
        parse_full = cpu_median(lambda full=full: parse_chat_request(full), args.repeats)
        parse_bare = cpu_median(lambda bare=bare: parse_chat_request(bare), args.repeats)
        held = cpu_median(lambda tools=tools, names=names: candidates(tools, names, [], []), args.repeats)
        print(
            f"| {n:,} | schemas in every request | {len(full) / 1024:,.0f} | {parse_full * 1e3:.2f} | – | "
            f"{parse_full * 1e3:.2f} |"
        )
        print(
            f"| {n:,} | registry held (`--tools-from-index`) | {len(bare) / 1024:,.1f} | "
            f"{parse_bare * 1e3:.3f} | "
            f"{held * 1e3:.3f} | {(parse_bare + held) * 1e3:.3f} |"
        )
    print(
        "\ncommand: OMP_NUM_THREADS=1 python -m benchmarks.bench_request_tools "
        + " ".join(f"--sizes {' '.join(map(str, args.sizes))} --repeats {args.repeats}".split())
    )


if __name__ == "__main__":
    main()
