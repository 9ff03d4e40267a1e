"""Which training recipe the general encoder uses, chosen on a corpus none of the evaluation datasets is:
encoders trained on BFCL's single-turn corpus, APIBench and BFCL multi-turn logs (Seal-Tools, SGD, tau2 and
API-Bank left out) rank Seal-Tools' requests against the 2,587 tools they call, read with their parameters.

    python -m experiments.studies.general_encoder.select_recipe [--per-source 500] [--recipes LABEL ...] \
        [--out results/general_encoder/select_recipe.json]

Each recipe is :data:`tracer.learn.encoders.general.TRAIN` with the fields it names changed; the row is
recall@1 and recall@5 of each (request, gold tool) pair over those tools, by cosine, with the
MiniLM it starts from as the first row. Nothing of BFCL, tau2 or API-Bank's held-out folds is read, so the
choice leaks nothing into the leave-one-dataset-out table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from tracer.core.context import ContextRendering
from tracer.core.tool_text import tool_text
from tracer.data.corpora import read_corpus
from tracer.encode.embedders import SentenceTransformerEmbedder
from tracer.learn.encoders.general import RENDERING, TOOL_TEXT, TRAIN, build
from tracer.learn.encoders.transformer import train_info

RECIPES = {"lr 2e-5, 1 epoch (TRAIN)": {}, "lr 1e-4, 1 epoch": {"lr": 1e-4}}
LEFT_OUT = ("seal_tools", "sgd", "tau2", "apibank")


def seal_recall(embedder: SentenceTransformerEmbedder, mirrors: str) -> dict[str, float]:
    """recall@1 and @5 of Seal-Tools' (request, gold tool) pairs over its tools."""
    rendering = ContextRendering.from_config(RENDERING)
    examples = read_corpus("seal_tools", mirrors)
    tools = sorted({tool_text(t, TOOL_TEXT) for e in examples for t in e.golds})
    col = {t: i for i, t in enumerate(tools)}
    queries = [rendering.render([{"role": "user", "content": e.query}]) for e in examples]
    q, t = embedder.encode(queries), embedder.encode(tools)                       # [Q, d], [T, d]
    sims = q @ t.T                                                                # [Q, T]
    pair_q = torch.tensor([i for i, e in enumerate(examples) for _ in e.golds])   # [P]
    pair_t = torch.tensor([col[tool_text(g, TOOL_TEXT)] for e in examples for g in e.golds])  # [P]
    r = (sims[pair_q] > sims[pair_q, pair_t][:, None]).sum(1)                     # [P] tools ranked above
    return {"pairs": len(r), "tools": len(tools), "recall@1": float((r < 1).float().mean()),
            "recall@5": float((r < 5).float().mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirrors", default="data/mirrors")
    ap.add_argument("--per-source", type=int, default=500)
    ap.add_argument("--recipes", nargs="*", choices=tuple(RECIPES), default=list(RECIPES))
    ap.add_argument("--out", default="results/general_encoder/select_recipe.json")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = {"MiniLM (zero-shot)": seal_recall(SentenceTransformerEmbedder(progress=0), a.mirrors)}
    for label in a.recipes:
        change = RECIPES[label]
        folder, counts = build(LEFT_OUT, a.mirrors, per_source=a.per_source, train={**TRAIN, **change})
        rows[label] = seal_recall(SentenceTransformerEmbedder(str(folder), progress=0), a.mirrors) | {
            "pairs_trained": counts, "train_seconds": train_info(folder)["train_seconds"]}
        print(label, json.dumps(rows[label]), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"left_out": LEFT_OUT, "per_source": a.per_source, "rows": rows,
                                       "command": " ".join(["python -m", __spec__.name, *sys.argv[1:]])},
                                      indent=1) + "\n")


if __name__ == "__main__":
    main()
