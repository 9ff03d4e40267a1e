"""Where a model that took over in the closed loop hits and misses: steps whose turn prefix the logs held
before the step's conversation arrived, against the others.

    python evaluate.py regime=closed_loop regime.feedback=presented_success dataset=tau2 scorer=tracer_plus \
        scorer.zero_shot.trial=0.3 scorer.zero_shot.gate=false hydra.run.dir=RUN
    python -m experiments.closed_loop.state_split RUN tau2

For every step the model served (``steps.jsonl``: ``serves == "model"``): whether an earlier conversation's
logged part (``conversations.jsonl``: its first ``logged_calls`` calls) holds a step with the same turn
prefix (the first key's state, :class:`tracer.core.types.Step`.prefix), and whether the model and the
zero-shot start presented the gold there. Prints the share of each.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from tracer.build import build_dataset
from tracer.core.steps import extract_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a closed-loop run directory")
    ap.add_argument("dataset", help="the run's dataset (its conversations, registry large)")
    args = ap.parse_args()
    by_id = {t.id: t for t in build_dataset(args.dataset, "large", 0).trajectories}
    conversations = [json.loads(line) for line in
                     (args.run / "conversations.jsonl").read_text().splitlines()]
    records: dict[tuple[int, int], dict] = {}
    for line in (args.run / "steps.jsonl").read_text().splitlines():
        r = json.loads(line)
        records[r["conversation"], r["step"]] = r
    logged_states: set[tuple[str, ...]] = set()
    counts: Counter = Counter()
    for c in conversations:
        steps = extract_steps(by_id[c["trajectory_id"]])
        for s in steps:
            r = records.get((c["conversation"], s.index))
            if r is not None and r["serves"] == "model":
                known = s.prefix in logged_states
                counts[known, "steps"] += 1
                counts[known, "model"] += r["gold"] in r["presented"]
                counts[known, "zero_shot"] += bool(r["zero_shot_hit"])
        logged_states.update(s.prefix for s in steps[:c["logged_calls"]])
    for known in (True, False):
        n = counts[known, "steps"]
        if n:
            where = "held" if known else "not held"
            print(f"state {where} by the logs: {n} steps, model {counts[known, 'model'] / n:.2f}, "
                  f"zero-shot start {counts[known, 'zero_shot'] / n:.2f}")


if __name__ == "__main__":
    main()
