"""Recall of the cascade against the share of steps it escalates, from two evaluate.py runs on the same folds.

    python evaluate.py experiment=preset/fastest ... hydra.run.dir=FAST          # the fast stage alone
    python evaluate.py experiment=preset/cascade scorer.escalate=1.0 ... hydra.run.dir=ALL
                                                                                 # every step escalated
    python -m experiments.studies.cascade.cascade_curve --fast FAST --all ALL [--preset CASCADE_RUN] \
        [--out results/encoders/cascade_curve_bfcl.md]

A cascade answers each step with exactly one stage, as that stage fitted alone answers it (tests/unit/scorers/
test_cascade.py), and escalates a step when the fast stage's gate is below the threshold its fit set. So for
any share ``e`` the outcome of every step is known from the two runs: ``ALL`` records each step's gate
(``extra.gate``) and the slow stage's answer, ``FAST`` the fast stage's answer, and each fold's fit recorded
the threshold that ``e`` sets on its out-of-fold training steps (``run_info.json``:
``scorer_info[fold].fit.thresholds``). No threshold is read off a test step. ``--preset``: a cascade run with
its own escalate (the preset), checked against the curve's row for it step by step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tracer.eval.metrics import StepRecord
from tracer.eval.outputs import read_steps


def outcomes(run: Path) -> dict[tuple, StepRecord]:
    return {(r.fold, r.trajectory_id, r.step): r for r in read_steps(run / "steps.jsonl")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", type=Path, required=True,
                    help="the fast stage alone (experiment=preset/fastest)")
    ap.add_argument("--all", type=Path, required=True, help="the cascade with escalate=1.0")
    ap.add_argument("--preset", type=Path, default=None, help="a cascade run to check against its row")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    fast, slow = outcomes(a.fast), outcomes(a.all)
    if fast.keys() != slow.keys():
        raise SystemExit(f"{a.fast} and {a.all} hold different steps: not the same folds and seed")
    fits = [f["fit"] for f in json.loads((a.all / "run_info.json").read_text())["scorer_info"]]
    keys = sorted(fast)
    gate = np.array([slow[k].extra["gate"] for k in keys])
    fold = np.array([k[0] for k in keys])
    rank = {name: np.array([run[k].gold_rank or 10**9 for k in keys])
            for name, run in (("fast", fast), ("slow", slow))}
    rows = []
    for e in ["0.00", *fits[0]["thresholds"], "1.00"]:
        tau = np.array([{"0.00": -np.inf, "1.00": np.inf}.get(e) or fits[f]["thresholds"][e] for f in fold])
        up = gate < tau
        r = np.where(up, rank["slow"], rank["fast"])
        rows.append({"escalate": float(e), "escalated": float(up.mean()),
                     "recall_at_1": float((r == 1).mean()),
                     "recall_at_5": float((r <= 5).mean()),
                     "mrr_pooled": float(np.mean(np.where(r < 10**9, 1.0 / r, 0.0)))})
    head = ("| escalate (fit) | share of test steps escalated | recall@1 | recall@5 | MRR (pooled) |   "
            f"({len(keys)} steps; fast {a.fast}, all escalated {a.all})")
    lines = [head, "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['escalate']:.2f} | {r['escalated']:.3f} | {r['recall_at_1']:.4f} | "
              f"{r['recall_at_5']:.4f} | {r['mrr_pooled']:.4f} |" for r in rows]
    if a.preset is not None:  # the preset's own run: the same answer at every step as its row here
        run = outcomes(a.preset)
        e = json.loads((a.preset / "run_info.json").read_text())["config"]["scorer"]["escalate"]
        row = next(r for r in rows if abs(r["escalate"] - e) < 1e-9)
        up = np.array([run[k].extra["escalated"] for k in keys]) > 0
        r = np.array([run[k].gold_rank or 10**9 for k in keys])
        agree = (r <= 5).mean() == row["recall_at_5"] and (r == 1).mean() == row["recall_at_1"]
        lines.append(f"\npreset run {a.preset} (escalate {e}): {up.mean():.3f} escalated, recall@1 "
                     f"{(r == 1).mean():.4f}, recall@5 {(r <= 5).mean():.4f}; "
                     f"{'equal to' if agree else 'DIFFERENT FROM'} its row above")
    print("\n".join(lines))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")
        a.out.with_suffix(".json").write_text(
            json.dumps({"fast": str(a.fast), "all": str(a.all), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
