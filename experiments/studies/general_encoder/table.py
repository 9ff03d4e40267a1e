"""The general encoder's table: recall@1 and recall@5 of every run ``runs.sh`` wrote, on all held-out steps
and on the steps whose gold tool the fold's training never called (unseen), with paired tests against a
reference run on the same steps.

    python -m experiments.studies.general_encoder.table [--root outputs/general] [--out FILE]

Rows per dataset (each present run): the MiniLM (reading tools as name and description, or with their
parameters: ``_params``) and general vector searches, BM25, then per number of logged trajectories N (0, 10,
all) tracer_plus with MiniLM and with the general encoder, and ToolNet and AutoTool at N = 10; then the same
scorers on the held-out-tools split (``_holdout``: ``evaluate.py holdout_tools=true``; every scorer that
ranks, hybrid, H-EPM and the paper's TRACER too; Tracer+G ranks as ``tracer_fixed``); on BFCL, preset/best as
committed and started from the general encoder. Differences (Δ) are paired over the same steps (a sign-flip
permutation test, :func:`tracer.eval.report.paired`) against :func:`reference`; on the unseen steps, those of
the row's own training (its N).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tracer.eval.metrics import paired_test
from tracer.eval.outputs import read_steps
from tracer.eval.report import paired

ROWS = ("vector_minilm", "vector_minilm_params", "vector_general", "bm25",
        "tracer_plus_minilm_n0", "tracer_plus_minilm_n0_no_toolkit", "tracer_plus_minilm_n0_no_calls",
        "tracer_plus_minilm_n0_no_dataflow", "tracer_plus_minilm_params_n0",
        "tracer_plus_general_n0",
        # NESTFUL and ToolLinkOS added to the general encoder's corpora
        "vector_general_chains", "tracer_plus_general_chains_n0",
        "toolnet_n10", "autotool_n10", "tracer_plus_minilm_n10", "tracer_plus_minilm_novel_n10",
        "tracer_plus_minilm_novel3x2_n10", "tracer_plus_general_n10", "tracer_plus_general_novel3x2_n10",
        "tracer_plus_minilm",
        "tracer_plus_minilm_novel", "tracer_plus_minilm_novel3x2", "tracer_plus_general",
        # the held-out-tools split (evaluate.py holdout_tools=true)
        "vector_minilm_holdout", "vector_general_holdout", "bm25_holdout", "hybrid_holdout",
        "toolnet_holdout", "autotool_holdout", "hepm_holdout", "tracer_holdout", "tracer_fixed_holdout",
        "tracer_plus_minilm_holdout", "tracer_plus_minilm_novel_holdout",
        "tracer_plus_minilm_novel3x2_holdout", "tracer_plus_general_holdout",
        "tracer_plus_general_novel3x2_holdout",
        # preset/best as committed, and its per-fold fine-tuning started from the general encoder (BFCL)
        "best_minilm", "best_general",
        # preset/cold_start with every log, and three novel slots from the top 4 on each split
        "cold_start", "cold_start_novel4x3", "cold_start_novel4x3_n10", "cold_start_novel4x3_holdout",
        # the zero-shot fusion's top m among the candidates (scorer.zero_shot.candidates): tracer_plus with
        # it, the preset on each split, and the preset without it
        "tracer_plus_minilm_zscand_n10", "tracer_plus_minilm_zscand", "tracer_plus_minilm_zscand_holdout",
        "cold_start_n10", "cold_start_holdout", "cold_start_nocand", "cold_start_nocand_n10",
        "cold_start_nocand_holdout")
# the preset's own row on each split, which its variants (three slots, no fusion candidates) are compared with
PRESET_ROW = {"": "cold_start", "_n10": "cold_start_n10", "_holdout": "cold_start_holdout"}


def presented(r, k: int) -> float:
    """The gold among the k presented tools: recall@5 as the model sees it. It equals ``hit_at_k`` (the gold
    ranked in the top k) unless a scorer presents other than its top k, as the novel-tool slot does. A scorer
    presenting more than k (H-EPM: the whole registry; Tracer+G: its global set beside the k) counts its
    ranking's top k, so that no row is recall at more than k."""
    return float(r.gold in r.presented) if len(r.presented) <= k else float(bool(r.hit_at_k))


def run_k(run: Path) -> int:
    """The k a run presented (its ``metrics.json``)."""
    return int(json.loads((run / "metrics.json").read_text())["k"])


def recalls(run: Path) -> dict[str, float | int]:
    """recall@1 and @5 over all held-out steps and over the unseen-gold ones, with their counts."""
    recs, k = read_steps(run / "steps.jsonl"), run_k(run)
    out: dict[str, float | int] = {}
    for part, keep in (("all", recs), ("unseen", [r for r in recs if r.gold_seen is False])):
        out[f"{part}_n"] = len(keep)
        out[f"{part}_r1"] = sum(r.gold_rank == 1 for r in keep) / max(len(keep), 1)
        out[f"{part}_r5"] = sum(presented(r, k) for r in keep) / max(len(keep), 1)
    return out


def paired_on_unseen(run: Path, ref: Path) -> dict:
    """recall@5 of ``run`` against ``ref`` on the steps whose gold ``run``'s training never called (a vector
    search fits nothing, so its own seen/unseen labels are those of all trajectories, not of ``run``'s N)."""
    a = {(r.fold, r.trajectory_id, r.step): r for r in read_steps(run / "steps.jsonl")}
    b = {(r.fold, r.trajectory_id, r.step): r for r in read_steps(ref / "steps.jsonl")}
    keys = sorted(s for s, r in a.items() if r.gold_seen is False)
    ka, kb = run_k(run), run_k(ref)
    return paired_test([presented(a[s], ka) for s in keys], [presented(b[s], kb) for s in keys])


def reference(name: str, r5: dict[str, float]) -> str | None:
    """The run a row is compared with: MiniLM's vector search for the general one and for MiniLM reading
    parameters; preset/best for its general start; the cold-start preset on the same split for its
    three-slot and no-fusion-candidates rows; the default corpora for the rows with NESTFUL and ToolLinkOS
    added; tracer_plus for its zscand rows; for
    tracer_plus and the preset the best of its inputs (vector search with its embedder, BM25) by recall@5."""
    if name == "best_general":
        return "best_minilm"
    if "_chains" in name:  # the same row with the default corpora
        return name.replace("_chains", "")
    for variant in ("cold_start_novel4x3", "cold_start_nocand"):
        if name.startswith(variant):
            return PRESET_ROW[name.removeprefix(variant)]
    if "_zscand" in name:  # the same row with the vector ranking's candidates
        return name.replace("_zscand", "")
    split = "_holdout" if name.endswith("_holdout") else ""  # compared within its own split
    if name in (f"vector_general{split}", f"vector_minilm_params{split}"):
        return f"vector_minilm{split}"
    if name.startswith("tracer_plus_") or name in PRESET_ROW.values():
        general = "_general" in name or name in PRESET_ROW.values()
        emb = "general" if general else "minilm_params" if "_params" in name else "minilm"
        inputs = [r for r in (f"vector_{emb}{split}", f"bm25{split}") if r in r5]
        return max(inputs, key=r5.__getitem__) if inputs else None
    return None


def dataset_table(root: Path) -> list[str]:
    runs = {name: root / name for name in ROWS if (root / name / "metrics.json").is_file()}
    lines = [f"### {root.name}", "",
             ("| run | recall@1 | recall@5 | Δ recall@5 (p) vs | unseen steps | unseen recall@5 "
              "| Δ unseen (p) |"),
             "|---|---:|---:|---|---:|---:|---|"]
    rows = {name: recalls(run) for name, run in runs.items()}
    r5 = {name: r["all_r5"] for name, r in rows.items()}
    for name, run in runs.items():
        r = rows[name]
        ref, delta, delta_u = reference(name, r5), "", ""
        if ref in runs:
            t = paired(run, runs[ref], "correct")  # the oracle's call: the gold among the presented
            delta = f"{t['mean_diff']:+.3f} ({t['p_value']:.3g}) vs {ref}"
            if r["unseen_n"]:
                u = paired_on_unseen(run, runs[ref])
                delta_u = f"{u['mean_diff']:+.3f} ({u['p_value']:.3g})"
        lines.append(f"| {name} | {r['all_r1']:.3f} | {r['all_r5']:.3f} | {delta} | {r['unseen_n']} | "
                     f"{r['unseen_r5']:.3f} | {delta_u} |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("outputs/general"))
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown here (default: print)")
    a = ap.parse_args()
    text = "\n".join(line for d in sorted(p for p in a.root.iterdir() if p.is_dir())
                     for line in dataset_table(d))
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
