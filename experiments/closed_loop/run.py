"""The closed-loop matrix (issue 55): datasets x feedback variants x scorers, one table.

    nice -n 5 python -m experiments.closed_loop.run                          # bfcl, tau2, apibank: everything
    nice -n 5 python -m experiments.closed_loop.run --datasets tau2 --scorers tracer_plus vector bm25 hybrid

Each cell is ``evaluate.py regime=closed_loop regime.feedback=F dataset=D scorer=S`` (composed and run in this
process, :func:`tracer.jobs.evaluate.run_job`) into ``<out>/<dataset>/<scorer>_<feedback>/``; a cell whose
``metrics.json`` exists is not run again (``--force`` reruns it). The zero-shot scorers (vector, bm25, hybrid)
learn nothing, so every feedback gives the same numbers: they run once, as ``<scorer>_any``. Then
``<out>/closed_loop.md`` is written from every cell found under ``<out>`` (``--table-only``: just that).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hydra import compose, initialize_config_dir

from tracer.build import CONFIG_DIR
from tracer.eval.closed_loop import FEEDBACK
from tracer.jobs.evaluate import run_job

ROOT = Path(__file__).resolve().parents[2]
SCORERS = ("tracer_plus", "autotool", "toolnet", "vector", "bm25", "hybrid")
ZERO_SHOT = {"vector", "bm25", "hybrid"}    # nothing to learn: one run stands for every feedback variant


def cells(datasets, scorers, feedback):
    for d in datasets:
        for s in scorers:
            for f in (["presented_success"] if s in ZERO_SHOT else feedback):
                yield d, s, f, f"{s}_any" if s in ZERO_SHOT else f"{s}_{f}"


def overrides(dataset: str, scorer: str, feedback: str, seed: int, k: int) -> list[str]:
    extra = ["dataset.execute=false"] if dataset == "bfcl" else []   # teacher forcing needs no BFCL backend
    return ["regime=closed_loop", f"regime.feedback={feedback}", f"dataset={dataset}", f"scorer={scorer}",
            f"seed={seed}", f"k={k}", "progress=false", *extra]


def run_cell(args, dataset: str, scorer: str, feedback: str, name: str) -> None:
    run_dir = args.out / dataset / name
    if (run_dir / "metrics.json").exists() and not args.force:
        return
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=overrides(dataset, scorer, feedback, args.seed, args.k))
    t0 = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = run_job(cfg, run_dir)
    seconds = time.perf_counter() - t0
    cmd = "python evaluate.py " + " ".join(overrides(dataset, scorer, feedback, args.seed, args.k)
                                            + [f"hydra.run.dir={run_dir.relative_to(ROOT)}"])
    (run_dir / "command.json").write_text(json.dumps({"command": cmd, "seconds": round(seconds, 1)}) + "\n")
    print(f"{dataset} {name}: recall@k {doc['stream']['recall_at_k']:.3f} ({seconds:.0f} s)", flush=True)


def _f(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def table(out: Path, command: str) -> str:
    rows = []
    for path in sorted(out.glob("*/*/metrics.json")):
        d = json.loads(path.read_text())
        s, h, z = d["stream"], d["second_half"], d["zero_shot_start"]
        fn, nv, lg = d["first_need"], d["never_presented"], d["logged"]
        feedback = "any (learns nothing)" if path.parent.name.endswith("_any") else d["feedback"]
        tr = d.get("trials") or {}
        trials = (f"{tr['conversations']} ({_f(tr['extra_tools_per_step'])})" if tr.get("conversations")
                  else "–")
        timing = json.loads((path.parent / "command.json").read_text()) if (path.parent / "command.json"
                                                                            ).exists() else {}
        rows.append(f"| {d['dataset']} | {d['scorer']} | {feedback} | {s['n_steps']} | "
                    f"{_f(s['recall_at_1'])} | {_f(s['recall_at_k'])} | {_f(s['mrr'])} | "
                    f"{_f(h['recall_at_k'])} | {_f(z['recall_at_k'])} | {z['min_window_gap']:+.3f} | "
                    f"{'yes' if z['never_below'] else '**no**'} | "
                    f"{fn['presented']}/{fn['tools']} | {nv['count']}/{nv['tools']} | "
                    f"{lg['unpresented']}/{lg['conversations']} | {lg['calls_logged']}/{lg['calls']} | "
                    f"{trials} | {timing.get('seconds', '–')} |")
    head = ("| dataset | scorer | feedback | steps | recall@1 | recall@k | MRR | 2nd half recall@k | "
            "zero-shot start recall@k | min window gap | never below start by > 0.01 | "
            "first need presented | never presented | conversations calling an unpresented tool | "
            "calls logged | trial conversations (tools beyond k per step) | seconds |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    return (f"# Closed loop: learning from one's own presentations\n\nCommand: `{command}` "
            "(each cell's `evaluate.py` command: `<dataset>/<cell>/command.json`). k = 5, registry large, "
            "MiniLM, seed 0 (the arrival order), oracle view (a presented gold is called), windows of 200 "
            "steps; columns: `docs/evaluation.md`, \"The closed loop\".\n\n"
            + head + "\n" + "\n".join(rows) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["bfcl", "tau2", "apibank"])
    p.add_argument("--scorers", nargs="+", default=list(SCORERS))
    p.add_argument("--feedback", nargs="+", default=list(FEEDBACK), choices=FEEDBACK)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "closed_loop")
    p.add_argument("--force", action="store_true", help="rerun cells whose metrics.json exists")
    p.add_argument("--table-only", action="store_true", help="only write the table from the cells found")
    args = p.parse_args()
    args.out = args.out.resolve()
    if not args.table_only:
        for cell in cells(args.datasets, args.scorers, args.feedback):
            run_cell(args, *cell)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT,
                         capture_output=True,
                         text=True).stdout.strip()
    command = "python -m experiments.closed_loop.run " + " ".join(
        [f"--datasets {' '.join(args.datasets)}", f"--scorers {' '.join(args.scorers)}"])
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "tracer"], check=False, cwd=ROOT,
                         capture_output=True,
                           text=True).stdout.strip()
    md = table(args.out, command) + (f"\nWritten at commit {rev or 'unknown'}"
                                     + (" with uncommitted changes under tracer/" if dirty else "") + ".\n")
    (args.out / "closed_loop.md").write_text(md)
    print(args.out / "closed_loop.md")


if __name__ == "__main__":
    main()
