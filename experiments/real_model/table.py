"""python -m experiments.real_model.table OUT: the table of experiments/real_model/runs.sh's runs.

Reads OUT/<scorer>_k<k>/metrics.json and steps.jsonl (regime=selection), checks that every run asked about
the same steps or a part of them (a smaller regime.steps with the same seed draws the first of the same
steps), and prints one Markdown row per run: the model's selection accuracy and the oracle's (the gold among
the presented tools, recall@k on the same steps), each with its Wilson 95% interval, the outcome shares, the
server's prompt tokens and the wall seconds per step; the same rows on the steps every run was asked about,
when some run was asked about fewer; then the paired comparisons on the steps both runs share (steps one run
got right and the other wrong, with the exact McNemar p-value) and the load average during the runs
(OUT/load.txt).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from scipy.stats import binomtest

from experiments.real_model.runs_dir import Run, cell, read_runs, step_key
from tracer.eval.pooled import share

# llm_only_small_k5: the whole registry (BFCL's own 128 tools, registry=small) presented at every step
RUNS = ("tracer_plus_k3", "tracer_plus_k5", "vector_k5", "llm_only_small_k5")
PAIRS = (("tracer_plus_k5", "vector_k5"), ("tracer_plus_k3", "tracer_plus_k5"),
         ("tracer_plus_k3", "vector_k5"), ("tracer_plus_k5", "llm_only_small_k5"),
         ("vector_k5", "llm_only_small_k5"))


def load_runs(out: Path) -> dict[str, Run]:
    runs = read_runs(out, RUNS)
    for run in runs.values():
        run.steps.sort(key=step_key)
    keys = {name: {step_key(s) for s in run.steps} for name, run in runs.items()}
    largest = max(keys.values(), key=len, default=set())
    if any(not k <= largest for k in keys.values()):
        raise SystemExit(f"the runs in {out} were not asked about the same steps: {keys}")
    return runs


def pooled(steps: list[dict]) -> dict:
    """The shares and costs of ``metrics.json``'s pooled block, from the step lines."""
    seconds = [s["executor_seconds"] for s in steps]
    return {"n_steps": len(steps),
            **{name: share([bool(s[field]) for s in steps]) for name, field in (
                ("selection_accuracy", "correct"), ("recall_at_k", "hit_at_k"),
                ("unpresented_call_rate", "unpresented"), ("malformed_rate", "malformed"),
                ("no_call_rate", "no_call"))},
            "prompt_tokens": {"mean": statistics.mean(s["prompt_tokens"] for s in steps)},
            "executor_seconds": {"mean": statistics.mean(seconds), "median": statistics.median(seconds)}}


def rows(runs: dict[str, Run], only: set | None = None) -> list[str]:
    head = ("| scorer | k | steps | Qwen: gold called | oracle (gold presented) | unpresented call | "
            "malformed | no call | prompt tokens (mean) | wall s per step (mean / median) |")
    out = [head, "|---|---:|---:|---|---|---|---|---|---:|---|"]
    for run in runs.values():
        p = pooled([s for s in run.steps if only is None or step_key(s) in only])
        secs = p["executor_seconds"]
        shares = [cell(p[name]) for name in ("selection_accuracy", "recall_at_k", "unpresented_call_rate",
                                             "malformed_rate", "no_call_rate")]
        out.append(f"| {' | '.join(run.label)} | {p['n_steps']} | {' | '.join(shares)} | "
                   f"{p['prompt_tokens']['mean']:.0f} | {secs['mean']:.0f} / {secs['median']:.0f} |")
    return out


def paired(runs: dict[str, Run]) -> list[str]:
    out = []
    for a, b in PAIRS:
        if a not in runs or b not in runs:
            continue
        common = {step_key(s) for s in runs[a].steps} & {step_key(s) for s in runs[b].steps}
        pairs = list(zip(*([s for s in runs[name].steps if step_key(s) in common] for name in (a, b))))
        only_a = sum(bool(x["correct"]) and not y["correct"] for x, y in pairs)
        only_b = sum(bool(y["correct"]) and not x["correct"] for x, y in pairs)
        p = binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0
        out.append(f"- {a} against {b} on their {len(pairs)} common steps: {only_a} right only with {a}, "
                   f"{only_b} only with {b} (exact McNemar p = {p:.2f})")
    return out


def load_line(out: Path) -> str:
    path = out / "load.txt"
    if not path.exists():
        return "load average: not recorded"
    one_minute = [float(line.split()[1]) for line in path.read_text().splitlines() if line.strip()]
    mean = sum(one_minute) / len(one_minute)
    return (f"1-minute load average over {len(one_minute)} samples (one a minute): "
            f"min {min(one_minute):.1f}, mean {mean:.1f}, max {max(one_minute):.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the OUT directory of runs.sh")
    args = parser.parse_args(argv)
    runs = load_runs(args.out)
    if not runs:
        raise SystemExit(f"no run under {args.out} (looked for {', '.join(RUNS)})")
    lines = rows(runs)
    common = set.intersection(*({step_key(s) for s in run.steps} for run in runs.values()))
    if any(len(run.steps) > len(common) for run in runs.values()):
        lines += ["", f"On the {len(common)} steps every run was asked about:", "", *rows(runs, common)]
    print("\n".join([*lines, "", *paired(runs), "", load_line(args.out)]))


if __name__ == "__main__":
    main()
