"""Prompt-cache-stable presentation measured on a real engine: llama.cpp's prompt-evaluation seconds per step
with the gateway's sticky presentation and with plain top-k, on the same BFCL conversations.

    python -m experiments.real_model.cache_presentation --conversations 5 --out outputs/real_model/cache

The deterministic replay (``experiments/studies/prompt_cache``) counts the tool-schema tokens a provider's
prefix cache could reuse. Here a real engine reuses them: the script starts the local model server
(``tracer.models``, Qwen2.5-Coder-1.5B by default, llama.cpp keeping the KV state of the last prompt only),
fits ``tracer_plus`` on the BFCL conversations outside fold 0 (5 folds by task, seed 0, BFCL's own
128 tools), saves the index and starts ``tracer serve`` in front of the server, once with sticky
presentation (its default) and once with ``--no-sticky``. Each of ``--conversations`` seeded test
conversations of fold 0 is replayed step by step, teacher-forced: one request per gold call, carrying the
conversation up to it and all 128 tools, with one generated token (the answer is not the point; the prompt
is), the conversations one after the other, as one agent would send them.

Per request it records the prompt tokens the server counted (``usage``) and, from llama.cpp's own perf
lines in the server log, the tokens it evaluated and the milliseconds that took: what the KV cache did not
cover. Qwen's chat template puts the tools in the system prompt before the conversation, so a request whose
tool block is the previous one's re-reads only the new messages; a tool appended at the block's end
(sticky) re-reads the conversation after it; a changed block (plain) re-reads nearly everything.

Writes ``requests.jsonl`` and ``summary.json`` under ``--out`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from tracer.core.folds import kfold
from tracer.core.steps import extract_steps
from tracer.data import Dataset, load_dataset
from tracer.models import serve
from tracer.models.server import free_port
from tracer.retriever import Retriever

ROOT = Path(__file__).resolve().parents[2]
MODES = {"sticky": [], "plain": ["--no-sticky"]}


def start_gateway(index: Path, upstream: str, k: int, flags: list[str]) -> tuple[subprocess.Popen, str]:
    """``tracer serve`` as its own process (no log: a logged gateway also runs trial conversations,
    which would widen some steps' tool blocks)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracer.cli", "serve", "--index", str(index), "--port", str(port),
         "--k", str(k), "--upstream", upstream, "--upstream-timeout", "3600", "--reload-interval", "0",
         *flags],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"tracer serve exited ({proc.returncode}) before answering")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("tracer serve did not answer within 300 s")
        time.sleep(0.5)


def replay(args: argparse.Namespace) -> list[dict]:
    ds = load_dataset("bfcl", execute=False)
    tools = ds.registry.to_openai()
    split = next(iter(kfold(ds.trajectories, 5, seed=args.seed)))
    conversations = random.Random(args.seed).sample(list(split.test), args.conversations)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, serve(args.model, port=args.port, n_ctx=args.n_ctx) as model:
        index = Path(tmp) / "index"
        train = Dataset(name="bfcl-train", registry=ds.registry, trajectories=split.train)
        Retriever.from_dataset(train, "tracer_plus", device="cpu").save(index)
        for mode, flags in MODES.items():
            gateway, url = start_gateway(index, model.url, args.k, flags)
            try:
                for traj in conversations:
                    for step in extract_steps(traj):
                        rows.append(ask(url, model, mode, traj.id, step.index, list(step.context), tools))
                        print(json.dumps(rows[-1]), flush=True)
            finally:
                gateway.send_signal(signal.SIGTERM)
                gateway.wait(60)
    return rows


def ask(url: str, model, mode: str, conversation: str, step: int, messages: list, tools: list) -> dict:
    """One request through the gateway; the engine's evaluated tokens and milliseconds read from its log."""
    before = len(model.timings())
    body = {"model": model.model, "messages": messages, "tools": tools, "tool_choice": "auto",
            "temperature": 0, "max_tokens": 1}
    start = time.monotonic()
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=3600,
                       headers={"X-Tracer-Conversation": f"{mode}-{conversation}"})
    wall = time.monotonic() - start
    reply.raise_for_status()
    time.sleep(0.5)  # llama.cpp writes its perf lines just after the answer
    # one completion per request on Qwen's own template; chatml-function-calling (smollm2) runs several
    perf = model.timings()[before:]
    if not perf:
        raise RuntimeError(f"no perf lines for the request in {model.log}")
    return {"mode": mode, "conversation": conversation, "step": step,
            "prompt_tokens": reply.json()["usage"]["prompt_tokens"], "completions": len(perf),
            "evaluated_tokens": sum(p["prompt_tokens"] for p in perf),
            "prompt_eval_s": sum(p["prompt_ms"] for p in perf) / 1000, "wall_s": round(wall, 3)}


def summarise(rows: list[dict]) -> dict:
    out = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        later = [r for r in mine if r["step"] > 0]  # a conversation's first request shares no tool block
        prompt, evaluated = sum(r["prompt_tokens"] for r in mine), sum(r["evaluated_tokens"] for r in mine)
        out[mode] = {
            "requests": len(mine),
            "prompt_tokens_mean": float(np.mean([r["prompt_tokens"] for r in mine])),
            "evaluated_tokens_mean": float(np.mean([r["evaluated_tokens"] for r in mine])),
            "cached_share": 1 - evaluated / prompt,
            "cached_share_after_first": 1 - sum(r["evaluated_tokens"] for r in later) / sum(
                r["prompt_tokens"] for r in later),
            "prompt_eval_s_mean": float(np.mean([r["prompt_eval_s"] for r in mine])),
            "prompt_eval_s_total": float(sum(r["prompt_eval_s"] for r in mine)),
            "wall_s_mean": float(np.mean([r["wall_s"] for r in mine])),
        }
    return out


def table(summary: dict) -> str:
    header = ("| presentation | requests | prompt tokens / request | evaluated / request | served from the "
              "KV cache (after a conversation's first step) | prompt eval s / request | wall s / request |")
    lines = [header, "|---|---:|---:|---:|---|---:|---:|"]
    for mode, s in summary.items():
        lines.append(f"| {mode} | {s['requests']} | {s['prompt_tokens_mean']:,.0f} | "
                     f"{s['evaluated_tokens_mean']:,.0f} | {s['cached_share']:.1%} "
                     f"({s['cached_share_after_first']:.1%}) | {s['prompt_eval_s_mean']:.1f} | "
                     f"{s['wall_s_mean']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen-coder")
    parser.add_argument("--port", type=int, default=None, help="the model server's (default: a free one)")
    parser.add_argument("--n-ctx", type=int, default=20480)
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.conversations < 1:
        parser.error("--conversations must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    start_load = os.getloadavg()
    rows = replay(args)
    summary = {"modes": summarise(rows), "conversations": args.conversations, "k": args.k, "seed": args.seed,
               "model": args.model, "load_average_start": start_load, "load_average_end": os.getloadavg()}
    (args.out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(table(summary["modes"]))


if __name__ == "__main__":
    main()
