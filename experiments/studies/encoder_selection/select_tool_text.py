"""Which tool text the fine-tuned transformer should embed, chosen without looking at any held-out fold.

    python -m experiments.studies.encoder_selection.select_tool_text [--dataset bfcl] [--fold 0] \
        [--recipe mnrl]
        [--out results/encoders/select_tool_text_bfcl_fold0.json]

The transformer counterpart of ``select_static --tool-text``. Inside outer fold ``--fold``'s training
trajectories only, 20 % of the groups (seeded, as select_static) are set aside as a validation split. For each
tool text (:data:`experiments.common.TOOL_TEXTS`: ``search``, ``Tool.search_text``, what every scorer embeds;
``params``, with the parameters' names; ``params_desc``, with their descriptions too) the encoder of
``--recipe`` is fine-tuned on the other 80 % with that text as the positives
(:func:`tracer.learn.encoders.finetuned`, cached by content hash) and scored by plain vector search on the
validation steps, each rendered context against every registry tool in the same text: recall@1/@5 and MRR,
zero-shot MiniLM and fine-tuned. The outer fold's held-out trajectories are never read.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from experiments.common import TOOL_TEXTS, inner_split, ranking_metrics, retext, split_arguments, write_out
from tracer.build import build_fold_encoders
from tracer.encode.embedders import SentenceTransformerEmbedder, minilm_path
from tracer.learn.encoders import finetuned, train_info


def vector_metrics(model: str, anchors, golds, tools) -> dict:
    emb = SentenceTransformerEmbedder(model, device="cpu", progress=0)
    # [S, N]
    return ranking_metrics((emb.encode(list(anchors)) @ emb.encode(list(tools)).T).numpy(), golds, tools)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split_arguments(ap)
    ap.add_argument("--recipe", default="mnrl", help="a transformer encoder_training config")
    ap.add_argument("--texts", nargs="+", default=list(TOOL_TEXTS), choices=tuple(TOOL_TEXTS))
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    ds, train, val_groups = inner_split(a)
    enc = build_fold_encoders(ds.registry, a.recipe, seed=a.seed)
    r = enc.recipe
    if r.kind != "transformer" or r.train.needs_teacher:
        ap.error(f"--recipe {a.recipe}: a transformer recipe without a teacher")
    fit_pairs = enc.pairs([t for t in train if t.group not in val_groups])   # the positives in search_text
    val_pairs = enc.pairs([t for t in train if t.group in val_groups])
    rows = []
    for name in a.texts:
        text = {t.search_text: TOOL_TEXTS[name](t) for t in ds.registry}
        fit, val = retext(fit_pairs, text), retext(val_pairs, text)
        tools = [text[t.search_text] for t in ds.registry]
        rows.append({"tool_text": name, "encoder": "zero-shot MiniLM",
                     **vector_metrics(str(minilm_path()), val.anchors, val.positives, tools)})
        print(json.dumps(rows[-1]), flush=True)
        t0 = time.perf_counter()
        path = finetuned(fit, r.train, r.base_model, r.encoder_dir, "cpu")
        rows.append({"tool_text": name, "encoder": f"fine-tuned ({a.recipe})", "checkpoint": str(path),
                     "train_seconds": train_info(path)["train_seconds"],
                     "wall_seconds": round(time.perf_counter() - t0, 1),
                     **vector_metrics(str(path), val.anchors, val.positives, tools)})
        print(json.dumps(rows[-1]), flush=True)
    write_out(a.out, {"dataset": a.dataset, "registry": a.registry, "outer_fold": a.fold, "seed": a.seed,
                      "recipe": a.recipe, "fit_pairs": len(fit_pairs), "validation_pairs": len(val_pairs),
                      "validation_groups": len(val_groups), "rows": rows})


if __name__ == "__main__":
    main()
