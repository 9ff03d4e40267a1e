"""Gather runs into one table, plots and paired tests.

    python -m tracer.eval.report DIR [DIR ...] [--out OUT]       # every metrics.json under the DIRs
    python -m tracer.eval.report --paired RUN_A RUN_B [--metric hit_at_k] [--gold unseen]
    python -m tracer.eval.report --ablation DIR [--reference full]  # one row per run directory under DIR

The table is Markdown and CSV (mean ± SD over folds); the plots are the cost–accuracy figure,
recall against k and the out-of-trie rates. The paired test compares two runs' per-step outcomes on
the same steps (same dataset, folds and seed): a seeded sign-flip permutation test and a bootstrap
95% interval of the mean difference.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tracer.data.native import iter_jsonl
from tracer.eval import plots
from tracer.eval.metrics import OUTCOME_RATES, paired_test, recall_curve
from tracer.eval.outputs import atomic_write_text, read_steps

COLUMNS = ("recall_at_k", "mrr", "selection_accuracy", "cic_tokens", "cic_reduction", "out_of_trie_rate",
           "fallback_rate", "recall_out_of_trie", "task_success", "latency_ms_p50")


def find_runs(dirs: Sequence[str | Path]) -> list[Path]:
    out = []
    for d in dirs:
        d = Path(d)
        out.extend(sorted(p.parent for p in d.rglob("metrics.json")) if d.is_dir() else [])
    return out


def load_run(run: Path) -> dict:
    m = json.loads((run / "metrics.json").read_text())
    m["run_dir"] = str(run)
    info = run / "run_info.json"
    m["tokenizer"] = json.loads(info.read_text()).get("tokenizer") if info.exists() else None
    return m


def notes(rows: Sequence[dict]) -> str:
    """What every reader of the table must know: the executors (oracle numbers labelled) and the tokenizer."""
    lines = []
    for ex in sorted({r["executor"] for r in rows}):
        lines.append(f"- executor: {ex}")
        if ex.startswith("oracle"):
            lines.append("  - oracle numbers: the executor picks the gold tool whenever it is presented, "
                         "so selection accuracy is the coverage of the presented set and task success "
                         "measures retrieval alone, not a model")
    for tok in sorted({r["tokenizer"] for r in rows if r.get("tokenizer")}):
        lines.append(f"- prompt tokens counted with: {tok}")
    return "\n".join(lines) + "\n" if lines else ""


def category_table(rows: Sequence[dict]) -> str:
    """Free-running task success per task category (pooled over folds), from each run's ``tasks.jsonl``, and
    on how many tasks our state comparison agrees with the checker that decided ``success`` (BFCL's own)."""
    per_run, agree = {}, {}
    for r in rows:
        path = Path(r["run_dir"]) / "tasks.jsonl"
        if not path.exists():
            continue
        by_cat: dict[str, list[bool]] = {}
        key = (r["dataset"], r["registry_size"], r["scorer"], r["k"])
        both = []
        for _, t in iter_jsonl(path):
            by_cat.setdefault(t.get("category") or "all", []).append(bool(t["success"]))
            if "state_success" in t:
                both.append(bool(t["success"]) == bool(t["state_success"]))
        per_run[key], agree[key] = by_cat, both
    cats = sorted({c for by in per_run.values() for c in by})
    if not per_run or cats == ["all"]:
        return ""
    md = ["| scorer | k | " + " | ".join(cats) + " | all | state check agrees |",
          "|" + "---|" * (len(cats) + 4)]
    for key, by in sorted(per_run.items()):
        cells = [f"{sum(by[c]) / len(by[c]):.3f} ({len(by[c])})" if c in by else "–" for c in cats]
        every = [x for c in cats for x in by.get(c, [])]
        same = f"{sum(agree[key])}/{len(agree[key])}" if agree[key] else "–"
        md.append(f"| {key[2]} | {key[3]} | " + " | ".join(cells)
                  + f" | {sum(every) / len(every):.3f} ({len(every)}) | {same} |")
    return ("Task success by category (tasks pooled over folds; task count in brackets; on BFCL, success is "
            "bfcl_eval's own multi_turn_checker, and the last column counts the tasks where our turn-by-turn "
            "state comparison gives the same verdict):\n\n" + "\n".join(md) + "\n")


def outcome_table(rows: Sequence[dict]) -> str:
    """What the executor did with the presented tools, per run (runs written before these rates are left
    out)."""
    rows = sorted((r for r in rows if all(r["mean"].get(c) is not None for c in OUTCOME_RATES)),
                  key=lambda r: (r["dataset"], r["registry_size"], r["regime"], r["scorer"], r["k"]))
    if not rows:
        return ""
    cols = ("selection_accuracy", *OUTCOME_RATES)
    md = ["| regime | executor | scorer | k | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 4)]
    for r in rows:
        md.append(f"| {r['regime']} | {r['executor']} | {r['scorer']} | {r['k']} | "
                  + " | ".join(fmt(r["mean"].get(c), r["sd"].get(c)) for c in cols) + " |")
    return ("Executor outcomes (shares of all steps; a selection is correct only when the call names "
            "a presented tool and equals the gold):\n\n" + "\n".join(md) + "\n")


def fmt(mean, sd, digits=3) -> str:
    if mean is None:
        return "–"
    if abs(mean) >= 100:
        return f"{mean:.0f} ± {sd:.0f}"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def table(rows: Sequence[dict], columns: Sequence[str] = COLUMNS, compact: bool = False) -> tuple[str, str]:
    """(Markdown, CSV) of the runs, sorted by dataset, registry size, regime, scorer, k.

    ``compact`` drops the dataset/tools/regime/executor columns from the Markdown (say them in the
    table's heading instead); the CSV always keeps them.
    """
    rows = sorted(rows, key=lambda r: (r["dataset"], r["registry_size"], r["regime"], r["scorer"], r["k"]))
    head = ["dataset", "tools", "regime", "executor", "scorer", "k", "steps", *columns]
    cut = 4 if compact else 0
    md = ["| " + " | ".join(head[cut:]) + " |", "|" + "---|" * len(head[cut:])]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(head + [f"{c}_sd" for c in columns])
    for r in rows:
        base = [r["dataset"], r["registry_size"], r["regime"], r["executor"], r["scorer"], r["k"],
                r["n_steps"]]
        md.append("| " + " | ".join(map(str, (base + [fmt(r["mean"][c], r["sd"][c]) for c in columns])[cut:]))
                  + " |")
        w.writerow(base + [r["mean"][c] for c in columns] + [r["sd"][c] for c in columns])
    return "\n".join(md) + "\n", buf.getvalue()


def report(dirs: Sequence[str | Path], out: str | Path, columns: Sequence[str] = COLUMNS,
           compact: bool = False) -> dict:
    runs = find_runs(dirs)
    if not runs:
        raise FileNotFoundError(f"no metrics.json under {', '.join(map(str, dirs))}")
    rows = [load_run(r) for r in runs]
    out = Path(out)
    md, csv_text = table(rows, columns, compact)
    md = "\n".join(x for x in (md, category_table(rows), outcome_table(rows), notes(rows)) if x)
    atomic_write_text(out / "report.md", md)
    atomic_write_text(out / "report.csv", csv_text)
    curves = {}
    for r in rows:
        steps = Path(r["run_dir"]) / "steps.jsonl"
        if steps.exists():
            curves[f"{r['scorer']} ({r['regime']}, {r['registry_size']} tools)"] = recall_curve(
                read_steps(steps))
    plots.cost_accuracy(rows, out / "cost_accuracy.png")
    plots.recall_vs_k(curves, out / "recall_vs_k.png")
    plots.out_of_trie(rows, out / "out_of_trie.png")
    return {"runs": len(rows), "markdown": md, "out": str(out)}


def paired(run_a: str | Path, run_b: str | Path, metric: str = "hit_at_k", seed: int = 0,
           folds: Sequence[int] | None = None, gold: str | None = None) -> dict:
    """Paired test of a per-step outcome (``hit_at_k``, ``correct``, ``top1`` for recall@1, or ``rr`` for
    reciprocal rank), over the steps of ``folds`` only when given (e.g. a checkpoint trained for one outer
    fold), and only over the steps whose gold tool the fold's training called (``gold="seen"``) or never
    called (``"unseen"``: ``gold_seen`` in steps.jsonl) when ``gold`` is given."""
    if gold not in (None, "seen", "unseen"):
        raise ValueError(f"gold must be 'seen' or 'unseen', got {gold!r}")

    def outcomes(run):
        recs = read_steps(Path(run) / "steps.jsonl")
        if gold is not None and all(r.gold_seen is None for r in recs):
            raise ValueError(f"{run}/steps.jsonl records no gold_seen (a run older than the seen/unseen "
                             "split)")
        return {(r.fold, r.trajectory_id, r.step): r for r in recs if (folds is None or r.fold in folds)
                and (gold is None or r.gold_seen is (gold == "seen"))}

    a, b = outcomes(run_a), outcomes(run_b)
    if set(a) != set(b):
        raise ValueError(f"{run_a} and {run_b} are not on the same steps (different dataset, folds or seed?)")
    keys = sorted(a)

    def val(r):
        if metric == "rr":
            return 1.0 / r.gold_rank if r.gold_rank else 0.0
        if metric == "top1":  # recall@1
            return float(r.gold_rank == 1)
        return float(bool(getattr(r, metric)))

    va, vb = [val(a[k]) for k in keys], [val(b[k]) for k in keys]
    res = paired_test(va, vb, seed=seed)
    res.update(metric=metric, a=str(run_a), b=str(run_b),
               mean_a=sum(va) / max(len(va), 1), mean_b=sum(vb) / max(len(vb), 1),
               **({"folds": sorted(folds)} if folds is not None else {}),
               **({"gold": gold} if gold is not None else {}))
    return res


def ablation_table(root: str | Path, reference: str = "full") -> str:
    """Markdown: one row per run directory under ``root`` (``reference`` first): recall@1/3/5/10 from the gold
    ranks and MRR (mean ± SD over folds), candidate coverage, and a paired sign-flip test of hit@k against
    ``reference`` (``python evaluate.py -m '+experiment/tracer_plus_ablation=glob(*)'`` writes such a DIR)."""
    root = Path(root)
    runs = sorted((p.parent for p in root.glob("*/metrics.json")),
                  key=lambda p: (p.name != reference, p.name))
    if not runs:
        raise FileNotFoundError(f"no <row>/metrics.json under {root}")
    lines = [f"{root} (recall@j from the gold ranks; mean ± SD over folds)\n",
             ("| row | scorer | recall@1 | recall@3 | recall@5 | recall@10 | MRR | coverage "
              f"| Δhit@k vs {reference} (p) |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        m = json.loads((run / "metrics.json").read_text())
        recs = read_steps(run / "steps.jsonl")
        per_fold = np.array([recall_curve([r for r in recs if r.fold == f])
                             for f in sorted({r.fold for r in recs})])
        sd = per_fold.std(0, ddof=1) if len(per_fold) > 1 else np.zeros(per_fold.shape[1])  # [10]
        cells = [fmt(float(per_fold[:, j - 1].mean()), float(sd[j - 1])) for j in (1, 3, 5, 10)]
        cov = [r.extra["in_candidates"] for r in recs if "in_candidates" in r.extra]
        cells += [fmt(m["mean"]["mrr"], m["sd"]["mrr"]), f"{np.mean(cov):.3f}" if cov else "–"]
        test = ""
        if run.name != reference and (root / reference / "steps.jsonl").exists():
            t = paired(run, root / reference)
            test = f"{t['mean_diff']:+.3f} (p={t['p_value']:.4f})"
        lines.append(f"| {run.name} | {m['scorer']} | " + " | ".join(cells) + f" | {test} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tracer.eval.report", description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", help="run or sweep directories")
    p.add_argument("--out", default=None,
                   help="where to write report.md/csv and plots (default: the first DIR)")
    p.add_argument("--paired", nargs=2, metavar=("RUN_A", "RUN_B"))
    p.add_argument("--ablation", metavar="DIR", help="one table row per run directory under DIR")
    p.add_argument("--reference", default="full",
                   help="with --ablation: the row the others are tested against")
    p.add_argument("--metric", default="hit_at_k", choices=["hit_at_k", "correct", "top1", "rr"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--folds", type=lambda v: [int(f) for f in v.split(",")], default=None,
                   help="with --paired: only the steps of these outer folds (comma-separated)")
    p.add_argument("--gold", choices=["seen", "unseen"], default=None,
                   help="with --paired: only the steps whose gold tool the fold's training called "
                        "(seen) or never called (unseen)")
    p.add_argument("--columns", default=",".join(COLUMNS), help="comma-separated metric names for the table")
    p.add_argument("--compact", action="store_true",
                   help="leave dataset/tools/regime/executor out of the Markdown")
    a = p.parse_args(argv)
    if a.paired:
        res = paired(*a.paired, metric=a.metric, seed=a.seed, folds=a.folds, gold=a.gold)
        print(json.dumps(res, indent=2))
        return
    if a.ablation:
        print(ablation_table(a.ablation, a.reference))
        return
    if not a.dirs:
        p.error("give run directories, or --paired RUN_A RUN_B")
    res = report(a.dirs, a.out or a.dirs[0], [c for c in a.columns.split(",") if c], a.compact)
    print(res["markdown"])
    print(f"{res['runs']} runs -> {res['out']}/report.md, report.csv, *.png")


if __name__ == "__main__":
    main()
