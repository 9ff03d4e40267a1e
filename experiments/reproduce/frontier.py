"""The quality/latency frontier over encoders x scorers: tables per dataset, paired tests, and the BFCL plot.

    python -m experiments.reproduce.frontier [--root results/encoders] \
        [--latency results/encoders/frontier_latency.json]

``ROOT/<dataset>/<encoder>_<scorer>/`` are evaluate.py runs (``experiments/reproduce/results_encoders.sh``).
Recall@1/@5 are pooled over all held-out steps (run_info.json's recall curve), MRR the mean over folds; every
row is paired against the zero-shot MiniLM run of the same scorer (``minilm_<scorer>``: sign-flip test and
bootstrap 95% CI of the recall@5 difference over the same steps; needs the runs' steps.jsonl, which is not
committed). Training: the encoder's wall time per outer fold on this machine (mean over folds). The latency
columns come from ``benchmarks/bench_frontier.py`` (every encoder x scorer in one run, one thread, a live step
end to end): interleaved step by step across the models (each one's weights cold in the CPU caches: the
pessimistic figure) and in blocks of consecutive steps (warm, as a server serving one encoder runs it: the
serving figure); the plot puts BFCL recall@5 against the serving p50. Writes ``ROOT/frontier.md`` and
``ROOT/frontier.png``. A row whose steps are not on this machine (steps.jsonl is gitignored; a fresh clone has
none) keeps the paired columns of the ``frontier.md`` it replaces, so rerunning one row does not blank the
others' tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tracer.eval.report import paired

# run-folder encoder name -> (label, the bench_frontier.py label of its latency row)
ENCODERS = {"minilm": ("MiniLM zero-shot (torch)", "MiniLM torch"),
            "onnx_fp32": ("MiniLM zero-shot, ONNX fp32", "ONNX fp32"),
            "onnx_int8": ("MiniLM zero-shot, ONNX int8", "ONNX int8"),
            "static": ("MiniLM zero-shot, static m2v", "static m2v"),
            "mnrl": ("fine-tuned per fold (torch)", "fine-tuned torch"),
            "mnrl_int8": ("fine-tuned per fold, ONNX int8", "fine-tuned ONNX int8"),
            "mnrl_trie": ("fine-tuned per fold, trie hard negatives (torch)", "fine-tuned torch"),
            # tracer_plus with the best preset's candidate model (the mean of 10 MLPs); not in the latency
            # bench
            "minilm_mlp10": ("MiniLM zero-shot (torch), candidate model: 10 MLPs", None),
            "mnrl_mlp10": ("fine-tuned per fold (torch), candidate model: 10 MLPs (`preset/best`)", None),
            "mnrl_l3_int8_mlp10": ("3-layer student fine-tuned per fold, ONNX int8, candidate model: 10 MLPs",
                                   None),
            "mnrl_static": ("fine-tuned per fold, static m2v", "fine-tuned static m2v"),
            "mnrl_l4_int8": ("4-layer student fine-tuned per fold, ONNX int8",
                             "4-layer fine-tuned ONNX int8"),
            "mnrl_l3_int8": ("3-layer student fine-tuned per fold, ONNX int8",
                             "3-layer fine-tuned ONNX int8"),
            "mnrl_l2_int8": ("2-layer student fine-tuned per fold, ONNX int8",
                             "2-layer fine-tuned ONNX int8"),
            "mnrl_l3_trie_int8": ("3-layer student, trie hard negatives, ONNX int8",
                                  "3-layer fine-tuned ONNX int8"),
            "mnrl_l3_distill_int8": ("3-layer student, distilled from the 6-layer encoder, ONNX int8",
                                     "3-layer fine-tuned ONNX int8"),
            "mnrl_l3_cut_int8": ("3-layer student cut from the fine-tuned 6-layer encoder, ONNX int8",
                                 "3-layer fine-tuned ONNX int8"),
            "mnrl_l4_ffn384_cut_int8": (("4-layer student, feed-forward 384 wide, cut from the fine-tuned "
                                        "6-layer encoder, ONNX int8"), "4-layer narrow (384) ONNX int8"),
            "mnrl_l4_ffn768_cut_int8": (("4-layer student, feed-forward 768 wide, cut from the fine-tuned "
                                        "6-layer encoder, ONNX int8"), "4-layer narrow (768) ONNX int8"),
            # a live step runs the same 3-layer graph (the tools were embedded at fit time): the same latency
            # row; frontier_latency_query.json times both side by side
            "mnrl_l3_query_int8": ("3-layer query student, ONNX int8, tools by the 6-layer encoder",
                                   "3-layer fine-tuned ONNX int8"),
            "mnrl_l3_query_distill_int8": (
                "3-layer query student, contexts distilled, ONNX int8, tools by the 6-layer encoder",
                "3-layer fine-tuned ONNX int8"),
            # the general encoder (MiniLM's graph, nothing trained per fold), the novel slots, the fusion
            "general_cold_start": ("general encoder (`preset/cold_start`)", "MiniLM torch"),
            "static_mnrl": ("static m2v trained per fold", "trained static m2v"),
            "static_mnrl_inner": ("static m2v trained per fold, clean inner folds", "trained static m2v"),
            # the same table shape, so the same latency row
            "static_registry": ("static m2v trained per fold, registry negatives", "trained static m2v"),
            "static_registry_inner": ("static m2v trained per fold, registry negatives, clean inner folds",
                                      "trained static m2v"),
            "static_mnrl_ctx05_inner": ("static m2v trained per fold, + context loss 0.5, clean inner folds",
                                        "trained static m2v"),
            # timed in its own bench run (frontier_latency_static_query.json), not in this table's
            "static_query": ("static m2v query encoder trained per fold, tools by the 6-layer encoder", None),
            # scorer=cascade (run folder cascade_cascade): two encoders; timed in its own bench runs
            # (frontier_latency_cascade*.json), paired against zero-shot MiniLM's tracer_plus
            "cascade": (("cascade: static m2v trained per fold for every step, fine-tuned ONNX int8 where "
                         "unsure (`preset/cascade`)"), None)}
TRANSFER = "transfer"  # transfer_<scorer>: an encoder fine-tuned on the other datasets only


def row(run: Path, latency: dict) -> dict:
    info = json.loads((run / "run_info.json").read_text())
    doc = json.loads((run / "metrics.json").read_text())
    enc, scorer = (run.name.rsplit("_", 1) if not run.name.endswith("tracer_plus")
                   else (run.name[:-12], "tracer_plus"))
    label, bench = ENCODERS.get(enc, (f"fine-tuned on the other datasets ({enc})", None))
    # a cascade's fold trained both its encoders (the slow one's time under "slow")
    trained = [h["train_seconds"] + (h.get("slow") or {}).get("train_seconds", 0)
               for h in info.get("encoder_training") or [] if h.get("inner_of") is None]
    lat = latency.get((bench, scorer), {})
    out = {"encoder": enc, "label": label, "scorer": scorer, "steps": doc["n_steps"],
           "recall@1": info["recall_curve"][0], "recall@5": info["recall_curve"][4],
           "mrr": doc["mean"]["mrr"], "train_s": sum(trained) / len(trained) if trained else None,
           "p50": lat.get("e2e_p50_ms"), "p95": lat.get("e2e_p95_ms"), "tps": lat.get("texts_per_s_batch64"),
           "serve50": lat.get("serving_p50_ms"), "serve95": lat.get("serving_p95_ms")}
    # a cascade is tracer_plus twice
    base = run.parent / f"minilm_{'tracer_plus' if scorer == 'cascade' else scorer}"
    if enc != "minilm" and (run / "steps.jsonl").is_file() and (base / "steps.jsonl").is_file():
        out["paired"] = {m: paired(run, base, metric=m) for m in ("hit_at_k", "top1")}
    return out


def fmt_delta(t: dict | None) -> str:
    if not t:
        return ""
    p = "< 0.001" if t["p_value"] < 0.001 else f"{t['p_value']:.3f}"
    return f"{t['mean_diff']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}] p {p}"


def previous_tests(path: Path) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(dataset, label, scorer) -> the two paired columns as an earlier ``frontier.md`` printed them."""
    out, ds = {}, None
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.startswith("### "):
            ds = line[4:].split(" ", 1)[0]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (ds and len(cells) in (10, 11) and cells[5] and not cells[5].startswith("Δ")
            and not set(cells[5]) <= set("-:")):
            out[ds, cells[0], cells[1]] = (cells[5], cells[6])
    return out


def table(rows: list[dict], kept: dict[tuple[str, str], tuple[str, str]] | None = None) -> str:
    """The Markdown table; ``kept``: (label, scorer) -> paired columns for rows that have no steps to test
    here."""
    kept = kept or {}
    lines = [("| encoder | scorer | recall@1 | recall@5 | MRR | Δ recall@5 vs zero-shot [95% CI] | Δ "
              "recall@1 | training s/fold | step p50 / p95 ms interleaved | step p50 / p95 ms serving | "
              "texts/s |"),
             "|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["scorer"], list(ENCODERS).index(r["encoder"])
                                         if r["encoder"] in ENCODERS else 99)):
        pr = r.get("paired", {})
        d5, d1 = ((fmt_delta(pr.get("hit_at_k")), fmt_delta(pr.get("top1"))) if pr
                  else kept.get((r["label"], r["scorer"]), ("", "")))
        lat = f"{r['p50']:.2f} / {r['p95']:.2f}" if r["p50"] is not None else ""
        serve = f"{r['serve50']:.2f} / {r['serve95']:.2f}" if r["serve50"] is not None else ""
        train = "" if r["train_s"] is None else f"{r['train_s']:.0f}"
        tps = "" if r["tps"] is None else f"{r['tps']:.0f}"
        lines.append(f"| {r['label']} | {r['scorer']} | {r['recall@1']:.3f} | {r['recall@5']:.3f} | "
                     f"{r['mrr']:.3f} | {d5} | {d1} | "
                     f"{train} | {lat} | {serve} | {tps} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scorer, marker in (("tracer_plus", "o"), ("vector", "s"), ("cascade", "*")):
        pts = [r for r in rows if r["scorer"] == scorer and r["serve50"] is not None]
        ax.scatter([r["serve50"] for r in pts], [r["recall@5"] for r in pts], marker=marker, label=scorer)
        for r in pts:
            ax.annotate(r["encoder"], (r["serve50"], r["recall@5"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("live step p50 serving, ms (one thread, embedding included; log scale)")
    ax.set_ylabel("recall@5 (BFCL, 5 folds)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("results/encoders"))
    ap.add_argument("--latency", type=Path, default=Path("results/encoders/frontier_latency.json"))
    a = ap.parse_args()
    lat = {}
    if a.latency.is_file():
        lat = {(r["encoder"], r["scorer"]): r for r in json.loads(a.latency.read_text())["rows"]}
    parts, old = [], previous_tests(a.root / "frontier.md")
    for ds in ("bfcl", "tau2", "apibank"):
        runs = sorted(d for d in (a.root / ds).glob("*_*")
                      if (d / "metrics.json").is_file() and not d.name.startswith("finetuned_fold"))
        if not runs:
            continue
        rows = [row(d, lat if ds == "bfcl" else {}) for d in runs]
        parts.append(f"### {ds} (registry large, k = 5, 5 folds, seed 0, oracle; {rows[0]['steps']} held-out "
                     "steps)\n\n"
                     + table(rows, {(lab, sc): v for (d, lab, sc), v in old.items() if d == ds}))
        if ds == "bfcl" and any(r["p50"] is not None for r in rows):
            plot(rows, a.root / "frontier.png")
    text = "\n\n".join(parts) + "\n"
    (a.root / "frontier.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
