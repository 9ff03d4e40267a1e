"""python -m experiments.real_model.memory_table OUT: H-EPM and Insight with the local model's summaries
beside their offline variants.

Reads OUT/<run>/ (``evaluate.py regime=selection ...`` under the oracle executor, the model writing the
memories through ``executor@memory_executor=openai``, or offline without it) and prints one Markdown row per
run: recall@k of its ranking (the gold among the first k it ranks; H-EPM presents the whole registry, so the
gold among the presented tools would always hold) pooled over the sampled steps with its Wilson 95% interval,
the steps H-EPM summarised (its policy's choice: those rank the last tool's successors by episodic recall),
the prompt tokens per step (an Insight memory adds its lessons to the prompt), who wrote the summaries and how
many model calls that took (fit and test steps, all folds). Then, for each Insight run, the first lessons of
its first fold, as the prompt shows them.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from experiments.real_model.runs_dir import cell, read_runs, step_key
from tracer.eval.pooled import share


def memory(info: list[dict]) -> tuple[str, int]:
    """Who wrote the summaries, and the model calls of all folds (the Insight memory's when there is one)."""
    parts = [fold.get("insight", fold) for fold in info]
    return parts[0]["summaries"], sum(p["model_calls"] for p in parts)


def table(out: Path, lessons: int) -> str:
    runs = read_runs(out)
    if not runs:
        raise SystemExit(f"no run under {out}")
    keys = {name: sorted(step_key(s) for s in run.steps) for name, run in runs.items()}
    if len({tuple(v) for v in keys.values()}) != 1:
        raise SystemExit(f"the runs under {out} were not asked about the same steps")
    header = ("| run | scorer | k | steps | recall@k of the ranking | summarised steps | "
              "prompt tokens (mean) | summaries | model calls |")
    lines = [header, "|---|---|---:|---:|---|---:|---:|---|---:|"]
    for name, run in runs.items():
        steps, scorer, k = run.steps, run.metrics["scorer"], run.metrics["k"]
        hits = share([s["gold"] in s["ranking"][:k] for s in steps if s.get("gold") is not None])
        summarised = sum(bool((s.get("extra") or {}).get("summarised")) for s in steps)
        written_by, calls = memory(run.scorer_info)
        lines.append(f"| {name} | {scorer} | {k} | {len(steps)} | {cell(hits)} | {summarised} | "
                     f"{statistics.mean(s['prompt_tokens'] for s in steps):,.0f} | {written_by} | {calls} |")
    for name, run in runs.items():
        insight = run.scorer_info[0].get("insight")
        if insight is not None:
            shown = insight["lessons"][:lessons]
            lines += ["", f"{name}, fold 0: {insight['k']} clusters; the first {len(shown)} lessons:",
                      *(f"> {lesson}" for lesson in shown)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="a directory of runs, one per memory and summariser")
    parser.add_argument("--lessons", type=int, default=2, help="Insight lessons shown per run")
    args = parser.parse_args(argv)
    print(table(args.out, args.lessons))


if __name__ == "__main__":
    main()
