"""``python -m tracer.models fetch|build|serve|bench --model smollm2|qwen-coder``.

    python -m tracer.models fetch --model qwen-coder      # weights into $TRACER_MODELS_DIR/weights, verified
    python -m tracer.models build                         # the llama.cpp engine (30-60 min on 2 loaded cores)
    python -m tracer.models serve --model smollm2 --port 8000   # until Ctrl-C; builds the engine if missing
    python -m tracer.models bench --model qwen-coder      # one timed request with 5 tools, llama.cpp's rates

``make model-server MODEL=qwen-coder`` runs ``serve``. Then:
``tracer serve --index DIR --upstream http://127.0.0.1:8000/v1 --k 5``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx

from tracer.models.catalogue import MODELS, get_model, models_dir
from tracer.models.engine import find_or_build_engine
from tracer.models.launch import serve
from tracer.models.weights import fetch


def _tool(name: str, description: str, **properties: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {p: {"type": t} for p, t in properties.items()},
                       "required": list(properties)}}}


# a BFCL-like step: a file-system agent with 5 presented tools
BENCH_REQUEST = {
    "messages": [
        {"role": "system",
         "content": "You are an agent operating a file system. Call a tool when one helps."},
        {"role": "user", "content": "Go into the folder 'documents' and list what is there."},
    ],
    "tools": [
        _tool("cd", "Change the current directory to the given folder.", folder="string"),
        _tool("ls", "List the contents of the current directory.", a="boolean"),
        _tool("mkdir", "Create a new directory in the current directory.", dir_name="string"),
        _tool("cat", "Print the contents of a file in the current directory.", file_name="string"),
        _tool("grep", "Search a file for lines matching a pattern.", file_name="string", pattern="string"),
    ],
    "tool_choice": "auto",
    "temperature": 0,
    "max_tokens": 128,
}


def _bench(args: argparse.Namespace) -> dict:
    body = json.loads(Path(args.request).read_text()) if args.request else dict(BENCH_REQUEST)
    results = []
    with serve(args.model, port=args.port, build=False, n_ctx=args.n_ctx, threads=args.threads,
               prompt_cache_mb=args.prompt_cache_mb) as server:
        body["model"] = server.model
        for _ in range(args.repeat):
            start = time.monotonic()
            reply = httpx.post(f"{server.url}/chat/completions", json=body, timeout=args.timeout).json()
            if "choices" not in reply:
                results.append({"seconds": round(time.monotonic() - start, 2), "error": reply})
                continue
            message = reply["choices"][0]["message"]
            results.append({"seconds": round(time.monotonic() - start, 2), "usage": reply.get("usage"),
                            "tool_calls": message.get("tool_calls"),
                            "content": (message.get("content") or "")[:300]})
        time.sleep(0.5)  # llama.cpp's perf lines reach the log after the reply
        rates = server.timings()
    return {"model": args.model, "server_start_s": round(server.started_s, 1), "requests": results,
            "llama_cpp_timings": rates, "load_average": os.getloadavg(), "cpus": os.cpu_count(),
            "tools": len(body.get("tools", [])), "threads": args.threads or os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracer.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("fetch", "serve", "bench"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, choices=sorted(MODELS))
        if name != "fetch":
            p.add_argument("--port", type=int, default=None,
                           help="default: 8000 for serve, a free one for bench")
            p.add_argument("--n-ctx", type=int, default=None, help="context tokens (default: the model's)")
            p.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: every CPU)")
            p.add_argument("--prompt-cache-mb", type=int, default=None,
                           help="keep evaluated prompts' KV states in RAM, up to this many MiB, each found "
                                "again by its longest prefix (default: the last prompt's only)")
    sub.add_parser("build")
    bench = sub.choices["bench"]
    bench.add_argument("--request", help="a chat-completions body as JSON (default: 5 file-system tools)")
    bench.add_argument("--repeat", type=int, default=1)
    bench.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)

    if args.command == "fetch":
        path = fetch(get_model(args.model))
        print(json.dumps({"model": args.model, "weights": str(path), "bytes": path.stat().st_size}))
    elif args.command == "build":
        python = find_or_build_engine()
        print(json.dumps({"engine": str(python)}))
    elif args.command == "bench":
        print(json.dumps(_bench(args), indent=1))
    else:
        server = serve(args.model, port=args.port or 8000, build=True, n_ctx=args.n_ctx, threads=args.threads,
                       prompt_cache_mb=args.prompt_cache_mb)
        print(f"{args.model} at {server.url} (log: {server.log}; cache: {models_dir()}); Ctrl-C stops it\n"
              f"  tracer serve --index DIR --upstream {server.url} --k 5", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM stops the server too
        try:
            server.process.wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
        return server.process.returncode or 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
