"""Markdown table of evaluate.py runs over encoders: recall@1/@5 and MRR pooled over steps, latency per step.

    python scripts/encoders_table.py results/encoders/bfcl/*_*/

Each DIR is one ``evaluate.py`` run (the committed metrics.json and run_info.json). Recall@1/@5 are
pooled over all held-out steps (run_info.json's recall curve); MRR and latency are metrics.json's
means over folds (latency: each fold's per-step p50/p95, one thread, embedding included).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def row(run: Path) -> dict:
    info = json.loads((run / "run_info.json").read_text())
    doc = json.loads((run / "metrics.json").read_text())
    curve = info["recall_curve"]  # pooled recall at k = 1, 2, ...
    emb = info["config"]["embedder"]
    label = emb.get("_target_", "sentence-transformers").rsplit(".", 1)[-1] + (
        f" {emb['variant']}" if "variant" in emb else "") + (" +per-fold fine-tuning" if info["config"].get(
            "encoder_training") else "")
    return {"encoder": label, "scorer": doc["scorer"], "steps": doc["n_steps"], "recall@1": curve[0],
            "recall@5": curve[4], "mrr": doc["mean"]["mrr"],
            "p50_ms": doc["mean"]["latency_ms_p50"], "p95_ms": doc["mean"]["latency_ms_p95"], "run": str(run)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    rows = [row(d) for d in ap.parse_args().dirs if (d / "metrics.json").exists()]
    print("| encoder | scorer | steps | recall@1 | recall@5 | MRR | step p50 ms | step p95 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['encoder']} | {r['scorer']} | {r['steps']} | {r['recall@1']:.4f} | {r['recall@5']:.4f} | "
              f"{r['mrr']:.4f} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} |")


if __name__ == "__main__":
    main()
