"""PNG plots: cost against accuracy (the paper's figure), recall against k, out-of-trie behaviour."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def _pyplot():
    """matplotlib's pyplot, headless (files only), imported with the first plot: importing it takes most of a
    second, which every train.py and evaluate.py process would pay, a run that fails early included."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def cost_accuracy(rows: Sequence[Mapping], path: str | Path, metric: str = "recall_at_k") -> Path:
    """One point per (scorer, k): mean prompt tokens per step against ``metric``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for scorer in sorted({r["scorer"] for r in rows}):
        pts = sorted((r["mean"]["cic_tokens"], r["mean"][metric], r["k"]) for r in rows
                     if r["scorer"] == scorer and r["mean"].get(metric) is not None)
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=scorer)
        for x, y, k in pts:
            ax.annotate(f"k={k}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("prompt tokens per step")
    ax.set_ylabel(metric)
    ax.set_title("cost against accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, Path(path))


def recall_vs_k(curves: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Recall at j (j = 1..10) per scorer, from each run's gold ranks."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in sorted(curves.items()):
        ax.plot(range(1, len(ys) + 1), ys, marker=".", label=name)
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, Path(path))


def out_of_trie(rows: Sequence[Mapping], path: str | Path) -> Path:
    """Out-of-trie rate and recall on out-of-trie steps, per scorer (trie-based scorers only)."""
    plt = _pyplot()
    rows = [r for r in rows if r["mean"].get("out_of_trie_rate") is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r['scorer']} k={r['k']}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["mean"]["out_of_trie_rate"] for r in rows], width=0.4,
           label="out-of-trie rate")
    ax.bar([i + 0.2 for i in x], [r["mean"]["recall_out_of_trie"] or 0 for r in rows], width=0.4,
           label="recall on out-of-trie steps")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    return _save(fig, Path(path))
