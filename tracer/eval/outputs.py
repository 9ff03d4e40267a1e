"""What a run writes to its directory: metrics.json, steps.jsonl, tasks.jsonl, plots; all atomically."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tracer.core.io import atomic_write_text, write_json
from tracer.eval.metrics import StepRecord, by_gold_seen, folds_in_mean

__all__ = ["atomic_write_text", "metrics_document", "read_steps", "write_json", "write_jsonl"]


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    return atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def metrics_document(*, dataset: str, registry_size: int, scorer: str, k: int, regime: str, executor: str,
                     result) -> dict:
    """The exact top-level keys of metrics.json. ``folds_in_mean`` says how many folds each mean is over;
    ``folds_without_test_steps`` lists the folds that had nothing to test (left out of every mean)."""
    tested = {r.fold for r in result.records}
    return {
        "dataset": dataset, "registry_size": registry_size, "scorer": scorer, "k": k, "regime": regime,
        "executor": executor, "n_steps": result.n_steps, "mean": result.mean, "sd": result.sd,
        "per_fold": result.per_fold, "folds": len(result.per_fold),
        "folds_in_mean": folds_in_mean(result.per_fold),
        "folds_without_test_steps": [f for f in range(len(result.per_fold)) if f not in tested],
        "by_gold_seen": by_gold_seen(result.records),
    }


def read_steps(path: str | Path) -> list[StepRecord]:
    with open(path) as f:
        return [StepRecord(**json.loads(line)) for line in f if line.strip()]
