"""Prompt-cache stability of the gateway's presentation, replayed on BFCL.

    python -m experiments.studies.prompt_cache.gateway_cache_stability       # tracer_plus, k = 5, 5 folds
    python -m experiments.studies.prompt_cache.gateway_cache_stability --k 3 --folds 5 --scorer tracer_fixed

Each held-out BFCL conversation (5-fold by task: the index is fitted on the other folds) is replayed
through the gateway's own selection code (:func:`tracer.serve.selection.choose` and
:class:`StickyPresenter`): every gold call is one request carrying the whole BFCL registry as its
``tools`` (registry order = the canonical order) and the conversation up to that call. Per mode:

- **stable prefix**: the tool block of a request is the presented schemas in order; its stable prefix
  is the longest run of leading tools identical to the previous request's (the part a provider's prefix
  cache can reuse). Reported as a share of the tool-schema tokens of every request after a
  conversation's first, and as the share of those requests whose previous tool block is kept whole;
- **recall@k**: the gold tool is among the presented ones;
- **tool tokens / request**: the presented schemas' tokens (``minilm-wordpiece``, tracer.eval.tokens).

Modes: ``plain`` (top k in rank order, the per-step default), ``plain, canonical order`` (the same k
sorted in registry order), ``sticky`` (the gateway's default, capped at 4 k tools) and ``sticky,
no cap``. Writes a Markdown table and a JSON file under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from tracer.core.folds import kfold
from tracer.core.steps import extract_steps
from tracer.data import Dataset, load_dataset
from tracer.eval.tokens import TokenCounter
from tracer.retriever import Retriever
from tracer.serve.selection import StickyPresenter, UnknownToolVectors, choose

MODES = ("plain", "plain, canonical order", "sticky", "sticky, no cap")


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def replay(args: argparse.Namespace) -> dict:
    ds = load_dataset("bfcl", execute=False)
    tools = ds.registry.to_openai()
    canonical = list(ds.registry.names)
    position = {n: i for i, n in enumerate(canonical)}
    counter = TokenCounter()
    tool_tokens = {t["function"]["name"]: counter.tool(t) for t in tools}
    totals = {m: {"steps": 0, "hits": 0, "tokens": 0, "later_tokens": 0, "stable_tokens": 0, "later": 0,
                  "kept_whole": 0} for m in MODES}
    unknown = UnknownToolVectors()
    for split in kfold(ds.trajectories, args.folds, seed=args.seed):
        train = Dataset(name="bfcl-train", registry=ds.registry, trajectories=split.train)
        retriever = Retriever.from_dataset(train, args.scorer, device="cpu")
        presenters = {"sticky": StickyPresenter(True, 4 * args.k),
                      "sticky, no cap": StickyPresenter(True, None)}
        for traj in split.test:
            previous: dict[str, list[str]] = {}
            for step in extract_steps(traj):
                chosen = choose(retriever, list(step.context), tools, args.k, unknown)
                shown = {"plain": chosen, "plain, canonical order": sorted(chosen, key=position.__getitem__)}
                shown |= {m: p.present(traj.id, chosen, canonical) for m, p in presenters.items()}
                for mode, names in shown.items():
                    t = totals[mode]
                    tokens = sum(tool_tokens[n] for n in names)
                    t["steps"] += 1
                    t["hits"] += step.gold in names
                    t["tokens"] += tokens
                    if mode in previous:
                        keep = common_prefix(previous[mode], names)
                        t["later"] += 1
                        t["later_tokens"] += tokens
                        t["stable_tokens"] += sum(tool_tokens[n] for n in names[:keep])
                        t["kept_whole"] += keep == len(previous[mode])
                    previous[mode] = names
        print(f"fold {split.fold}: {len(split.test)} conversations replayed", flush=True)
    return {m: {"recall@k": t["hits"] / t["steps"], "tool_tokens_per_request": t["tokens"] / t["steps"],
                "stable_prefix_token_share": t["stable_tokens"] / max(t["later_tokens"], 1),
                "previous_block_kept_whole": t["kept_whole"] / max(t["later"], 1),
                "requests": t["steps"], "later_requests": t["later"]} for m, t in totals.items()}


def table(rows: dict, args: argparse.Namespace) -> str:
    head = (f"BFCL multi-turn, {args.scorer}, k = {args.k}, {args.folds}-fold by task (seed {args.seed}); "
            f"{next(iter(rows.values()))['requests']} requests (one per gold call)\n\n"
            "| presentation | stable tool-prefix tokens | previous tool block kept whole | recall@k | "
            "tool tokens / request |\n|---|---:|---:|---:|---:|\n")
    return head + "".join(
        f"| {m} | {r['stable_prefix_token_share']:.1%} | {r['previous_block_kept_whole']:.1%} | "
        f"{r['recall@k']:.3f} | {r['tool_tokens_per_request']:.0f} |\n" for m, r in rows.items())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scorer", default="tracer_plus")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/gateway"))
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = replay(args)
    md = table(rows, args)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"cache_stability_{args.scorer}_k{args.k}"
    (args.out / f"{stem}.md").write_text(md)
    (args.out / f"{stem}.json").write_text(json.dumps(
        {"config": {k: str(v) for k, v in vars(args).items()}, "wall_s": round(time.perf_counter() - t0, 1),
         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
