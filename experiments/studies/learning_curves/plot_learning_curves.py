"""Tables and plots of ``experiments/studies/learning_curves/learning_curves.py``'s CSVs (works on partial
runs).

    python -m experiments.studies.learning_curves.plot_learning_curves [--out results/learning_curves]

Writes ``<out>/summary.md``: per dataset, recall@1 and recall@k (mean ± SD over the folds that ran)
for every scorer at every N, the cold start (N = 0: tracer_plus with transferred weights against
vector search) and the smallest N from which tracer_plus's recall@k stays above ToolNet's and
AutoTool's; and ``<out>/<dataset>.png``.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # experiments/studies/<topic>/ -> the repository
ORDER = ("tracer_plus", "tracer_plus_nousage", "tracer_plus_novel3x2", "tracer_plus_zscand",
         "tracer_plus_transfer", "cold_start", "cold_start_zsusage", "tracer", "tool2vec", "autotool",
         "toolnet", "hybrid", "vector", "vector_general", "bm25")
# checked against their inputs (the vector search over their encoder, BM25) and rivals
INPUTS = {"tracer_plus": ("vector", "bm25"), "tracer_plus_novel3x2": ("vector", "bm25"),
          "tracer_plus_zscand": ("vector", "bm25"), "tracer_plus_nousage": ("vector", "bm25"),
          "tracer_plus_transfer": ("vector", "bm25"), "cold_start": ("vector_general", "bm25"),
          "cold_start_zsusage": ("vector_general", "bm25")}
PLUS = tuple(INPUTS)


def read(paths: list[Path]) -> dict:
    """{(scorer, n): {"r1": [...], "rk": [...], "n_train": [...], "error": str}} over folds."""
    cells: dict = defaultdict(lambda: {"r1": [], "rk": [], "n_train": [], "error": ""})
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            rows += list(csv.DictReader(f))
    seen = set()
    for row in rows:
        if (row["fold"], row["n"], row["scorer"]) in seen:  # parallel runs of one fold: the first row counts
            continue
        seen.add((row["fold"], row["n"], row["scorer"]))
        c = cells[(row["scorer"], row["n"])]
        if row["error"]:
            c["error"] = row["error"]
            continue
        c["r1"].append(float(row["recall_at_1"]))
        c["rk"].append(float(row["recall_at_k"]))
        c["n_train"].append(int(row["n_train"]))
    return cells


def ns_of(cells) -> list[str]:
    ns = {n for _, n in cells}
    return sorted(ns, key=lambda n: float("inf") if n == "all" else int(n))


def fmt(xs: list[float]) -> str:
    return f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1) if len(xs) > 1 else 0:.3f} ({len(xs)})" if xs else "–"


def passes(cells, ns, a: str, b: str) -> str:
    """The smallest N from which a's mean recall@k is above b's at every later N (over the Ns both ran)."""
    both = [n for n in ns if cells.get((a, n), {}).get("rk") and cells.get((b, n), {}).get("rk")]
    above = [np.mean(cells[(a, n)]["rk"]) > np.mean(cells[(b, n)]["rk"]) for n in both]
    for i, n in enumerate(both):
        if all(above[i:]):
            return n
    return "never (over the Ns that ran)"


def dataset_section(name: str, cells, k: int) -> list[str]:
    ns = ns_of(cells)
    scorers = [s for s in ORDER if any(sc == s for sc, _ in cells)]
    lines = [f"## {name}", "",
             (f"recall@1 / recall@{k}, mean ± SD over folds (folds that ran). N = training "
              "trajectories in arrival order; `all` = the whole training split."), ""]
    lines.append("| N | " + " | ".join(f"{s} r@1 | {s} r@{k}" for s in scorers) + " |")
    lines.append("|---" * (1 + 2 * len(scorers)) + "|")
    for n in ns:
        cols = []
        for s in scorers:
            c = cells.get((s, n))
            if c is None:
                cols += ["–", "–"]
            elif c["error"] and not c["r1"]:
                cols += ["n/a", "n/a"]
            else:
                cols += [fmt(c["r1"]), fmt(c["rk"])]
        lines.append(f"| {n} | " + " | ".join(cols) + " |")
    errors = {s: c["error"] for (s, _), c in cells.items() if c["error"]}
    for s, e in errors.items():
        lines.append(f"\nn/a ({s}): {e}")
    lines.append("")
    for plus in PLUS:  # never worse than its inputs (within 0.005)
        gaps = []
        for n in ns:
            own = cells.get((plus, n), {}).get("rk")
            inputs = [np.mean(cells[(b, n)]["rk"]) for b in INPUTS[plus] if cells.get((b, n), {}).get("rk")]
            if own and inputs:
                gaps.append((n, np.mean(own) - max(inputs)))
        if gaps:
            below = [n for n, g in gaps if g < -0.005]
            lines.append(f"- {plus} recall@{k} minus max({', '.join(INPUTS[plus])}): "
                         + ", ".join(f"N = {n}: {g:+.3f}" for n, g in gaps)
                         + (f" (below by more than 0.005 at N = {', '.join(below)})." if below else
                            " (never below by more than 0.005)."))
    for plus in PLUS:
        for rival in ("toolnet", "autotool", "tool2vec"):
            if any(sc == plus for sc, _ in cells) and any(sc == rival for sc, _ in cells):
                lines.append(
                    f"- {plus} stays above {rival} (recall@{k}) from N = {passes(cells, ns, plus, rival)}.")
    return lines + [""]


def plot(name: str, cells, k: int, path: Path) -> None:
    ns = ns_of(cells)
    x = np.arange(len(ns))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for ax, key, label in ((axes[0], "r1", "recall@1"), (axes[1], "rk", f"recall@{k}")):
        for s in ORDER:
            pts = [(i, cells[(s, n)][key]) for i, n in enumerate(ns) if cells.get((s, n), {}).get(key)]
            if not pts:
                continue
            xi = [p[0] for p in pts]
            mu = [np.mean(p[1]) for p in pts]
            sd = [np.std(p[1], ddof=1) if len(p[1]) > 1 else 0.0 for p in pts]
            ax.errorbar(xi, mu, yerr=sd, marker="o", capsize=3, label=s,
                        linestyle="--" if s in ("vector", "tracer_plus_transfer") else "-")
        ax.set_xticks(x, ns)
        ax.set_xlabel("training trajectories N (arrival order)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{name}: learning curves (teacher forcing, mean ± SD over folds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "learning_curves")
    ap.add_argument("-k", type=int, default=5)
    args = ap.parse_args()
    lines = ["# Learning curves", "",
             ("Command: `nice -n 10 python -m experiments.studies.learning_curves.learning_curves` then "
              "`python -m experiments.studies.learning_curves.plot_learning_curves`."), ""]
    by_dataset = defaultdict(list)
    for path in sorted(args.out.glob("*.csv")):  # <dataset>.csv and <dataset>.<tag>.csv
        by_dataset[path.name.split(".")[0]].append(path)
    for name in (d for d in ("bfcl", "tau2", "apibank") if d in by_dataset):
        cells = read(by_dataset[name])
        lines += dataset_section(name, cells, args.k)
        plot(name, cells, args.k, args.out / f"{name}.png")
    (args.out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
