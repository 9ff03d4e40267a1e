"""``train.py``'s report in words: what the index weighs (and what dominates it) and report.md."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracer.core.store import open_snapshot
from tracer.learn.blend_report import report_markdown as blend_markdown

# a snapshot file's part of the index, by name (a cascade's stage files carry a ``fast.``/``slow.`` prefix)
PARTS = {
    "trie": "tries and memories",
    "model.pt": "candidate model",
    "blend_head.pt": "blend head",
    "tools.faiss": "tool index",
    "tool_vectors.npy": "tool index",
    "tools_idmap.json": "tool index",
    "tools.json": "registry",
}


def part(name: str) -> str:
    if name.startswith("encoders/"):
        return "encoders"
    base = name.split("/")[-1].removeprefix("fast.").removeprefix("slow.")
    return next((label for prefix, label in PARTS.items() if base.startswith(prefix)), "other")


def index_size(directory: str | Path) -> dict[str, Any]:
    """Bytes of an index's current snapshot, in all and per part (encoders, tries and memories, candidate
    model, tool index, registry, other), largest first."""
    parts: dict[str, int] = {}
    with open_snapshot(directory, "none") as snap:
        for f in snap.rglob("*"):
            if f.is_file():
                label = part(f.relative_to(snap).as_posix())
                parts[label] = parts.get(label, 0) + f.stat().st_size
    return {"bytes": sum(parts.values()), "parts": dict(sorted(parts.items(), key=lambda kv: -kv[1]))}


# the scorers' fit timings (FitReport.history), in words; a cascade's carry a ``fast.``/``slow.`` prefix
STAGES = {
    "seconds_embed": "embedding the training steps (memories, queries)",
    "seconds_inner": "inner folds (the candidate model's training data)",
    "seconds_index": "inner folds (the head's training data)",
    "seconds_train": "training the candidate model or head",
    "seconds_fast": "fast stage",
    "seconds_slow": "slow stage",
}


def _encoder_row(role: str, h: Mapping[str, Any]) -> str:
    teacher = f" (its teacher: {h['teacher_train_seconds']:.1f} s)" if h.get("teacher_train_seconds") else ""
    this = h.get("seconds")
    return (
        f"| {role}: `{h['served_as']}` | {h['pairs']} | {h['train_seconds']:.1f}{teacher} | "
        f"{'–' if this is None else f'{this:.1f}'} |"
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def report_markdown(report: Mapping[str, Any]) -> str:
    """report.md: the data, the time per stage, the index and its size, the held-out metrics."""
    s = report["seconds"]
    lines = [
        f"# {report.get('preset') or report['scorer']} on {report['dataset']}",
        "",
        f"{report['trajectories']} trajectories, {report['steps']} training steps, "
        f"{report['registry_size']} tools; "
        f"scorer `{report['scorer']}`, encoder `{report['encoder']}`"
        + (f", slow stage `{report['slow_encoder']}`" if report.get("slow_encoder") else "")
        + ".",
        "",
        "| stage | seconds |",
        "|---|---:|",
        f"| encoder (training, or finding it cached, and embedding the tools) | {s['encoder']:.1f} |",
        f"| scorer fit (memories, tries, candidate model or head) | {s['scorer']:.1f} |",
    ]
    for k, v in s["scorer_stages"].items():
        stage, _, key = k.rpartition(".")
        if key in STAGES:
            lines.append(f"| &nbsp;&nbsp;{stage + ': ' if stage else ''}{STAGES[key]} | {v:.1f} |")
    lines.append(f"| save | {s['save']:.1f} |")
    trained = report.get("encoder_training") or []
    if trained:
        lines += ["", "| encoder | pairs | training when built (s) | this run (s) |", "|---|---:|---:|---:|"]
        for h in trained:
            role = (
                "outer" if h.get("inner_of") is None else f"inner fold without {len(h['held_groups'])} groups"
            )
            lines.append(_encoder_row(role, h))
            if h.get("slow"):
                lines.append(_encoder_row("slow stage", h["slow"]))
        lines.append(
            "\nA run that finds a checkpoint in the cache (the same pairs and recipe trained before) takes "
            "about 0 s for it; the time it took when built is beside it."
        )
    if report.get("index"):
        ix = report["index"]
        lines += [
            "",
            (
                f"Index: `{ix['path']}`, {_mb(ix['bytes'])} "
                f"({', '.join(f'{k} {_mb(v)}' for k, v in ix['parts'].items())}). It carries its encoders: "
                "copy the folder anywhere and load it (`tracer serve --index`, `Retriever.load`)."
            ),
        ]
    h = report.get("heldout")
    if h:
        lines += [
            "",
            (
                f"## Held-out ({h['folds']} outer folds, k = {h['k']}, {h['n_steps']} steps, "
                f"{h['registry_size']} tools; evaluate.py's metrics: `{h['metrics']}`)"
            ),
            "",
            f"Pooled over the held-out steps: recall@1 {h['recall_at_1']:.4f}"
            + (f", recall@5 {h['recall_at_5']:.4f}" if h.get("recall_at_5") is not None else "")
            + ".",
            "",
            "| metric | mean over folds |",
            "|---|---:|",
        ]
        lines += [f"| {k} | {v:.4f} |" for k, v in h["mean"].items() if isinstance(v, float)]
    if report.get("blend_head"):
        lines += ["", blend_markdown(report["blend_head"]).replace("# Blend head", "## Blend head", 1)]
    return "\n".join(lines) + "\n"
