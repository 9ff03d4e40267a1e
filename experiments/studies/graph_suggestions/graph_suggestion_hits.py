"""How often a tool graph's next-tool suggestions name the gold tool, at the retrieval level.

    python -m experiments.studies.graph_suggestions.graph_suggestion_hits [--datasets bfcl,tau2,apibank] \
        [--data-root /work/shared/datasets]
                                            [--out results/graph_suggestions]

The tool-graph-memory critique says graph memory's next-tool suggestions are often wrong (about 30%
correct at the decisive turns of failed runs). This measures, on the gold histories
(teacher-forcing), 5 folds by group, seed 0, registry preset large, the share of steps where

- H-EPM's suggestion line (``configs/scorer/hepm.yaml``: its top two successors, offline summaries,
  ``turn_start`` recall) names the gold tool; a step whose previous tool has no successor gets no
  line, which counts as a miss (and in its own column);
- ToolNet's top 2 (``configs/scorer/toolnet.yaml`` at k = 2: the successors by weight, padded from
  the vector ranking) holds the gold tool;
- the plain vector ranking's top 2 holds it (for reference),

over all steps, at turn openings (the first call after a user message), and at the steps where the
previous call's most frequent successor in the training fold is not the gold tool (the steps where
following the graph's strongest edge goes wrong; a previous call without successors counts here).
Writes ``hits.md`` and ``hits.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tracer.build import build_dataset, build_embedder, build_scorer, load_config
from tracer.core.steps import extract_all
from tracer.eval.outputs import atomic_write_text, write_json
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors import OracleExecutor
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources

ROOT = Path(__file__).resolve().parents[3]  # experiments/studies/<topic>/ -> the repository
SUBSETS = ("all steps", "turn openings", "strongest edge wrong")
BATCH = 512


def load(name: str, data_root: Path, seed: int):
    cfg = load_config("dataset", name)
    if "path" in cfg:
        cfg["path"] = str(data_root / name)
    return build_dataset(cfg, "large", seed)


def step_hits(ds, res, folds: int, seed: int) -> list[dict]:
    """One row per test step: which subsets it falls in and whether each suggestion holds the gold tool."""
    split = Evaluator(ds, lambda: None, res, OracleExecutor(),
                      EvalConfig(folds=folds, seed=seed, progress=False))
    rows = []
    for fold in range(folds):
        train, test = split.split(fold)
        hepm = build_scorer("hepm")
        hepm.fit(train, res)
        toolnet = build_scorer("toolnet")
        toolnet.fit(train, res)
        steps = [s for s in extract_all(test) if s.gold in ds.registry]
        for lo in range(0, len(steps), BATCH):
            batch = steps[lo:lo + BATCH]
            h_scores = hepm.score(batch)
            lines = hepm.suggested(h_scores)
            t_scores = toolnet.score(batch)
            top2 = finalize(t_scores, 2, pad=True).presented
            vector2 = t_scores.fallback.topk(2, dim=1).indices.tolist()                       # [B, 2]
            for i, s in enumerate(batch):
                gold = ds.registry.id(s.gold)
                succ = toolnet.successors(s.history[-1] if s.history else None)
                strongest = max(succ, key=succ.get) if succ else None
                rows.append({"fold": fold, "opens_turn": s.position == 0,
                             "strongest_wrong": strongest != s.gold,
                             "hepm_line": gold in lines[i], "hepm_no_line": not lines[i],
                             "toolnet_top2": gold in top2[i][:2], "vector_top2": gold in vector2[i]})
    return rows


def summarise(rows: list[dict]) -> dict[str, dict]:
    subsets = {"all steps": rows, "turn openings": [r for r in rows if r["opens_turn"]],
               "strongest edge wrong": [r for r in rows if r["strongest_wrong"]]}
    out = {}
    for name, rs in subsets.items():
        n = len(rs)
        out[name] = {"steps": n, **{k: (sum(r[k] for r in rs) / n if n else None)
                                    for k in ("hepm_line", "hepm_no_line", "toolnet_top2", "vector_top2")}}
    return out


def table(results: dict[str, dict]) -> str:
    md = ["| dataset | steps | H-EPM suggestion line | (no line) | ToolNet top 2 | vector top 2 |",
          "|---|---|---|---|---|---|"]
    for ds, by in results.items():
        for subset, m in by.items():
            cells = ["–" if m[k] is None else f"{m[k]:.3f}"
                     for k in ("hepm_line", "hepm_no_line", "toolnet_top2", "vector_top2")]
            md.append(f"| {ds}: {subset} | {m['steps']} | " + " | ".join(cells) + " |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="bfcl,tau2,apibank")
    ap.add_argument("--data-root", type=Path, default=Path("/work/shared/datasets"))
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "graph_suggestions")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    embedder = build_embedder("minilm")
    results = {}
    for name in a.datasets.split(","):
        ds = load(name, a.data_root, a.seed)
        res = Resources.build(ds.registry, embedder, device="cpu", seed=a.seed)
        results[f"{name} ({len(ds.registry)} tools)"] = summarise(step_hits(ds, res, a.folds, a.seed))
        print(table(results), flush=True)
    md = table(results)
    write_json(a.out / "hits.json", results)
    atomic_write_text(a.out / "hits.md", md)
    print(f"-> {a.out}/hits.md, hits.json")


if __name__ == "__main__":
    main()
