"""What a run writes to its directory: metrics.json, steps.jsonl, tasks.jsonl, plots; all atomically."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .metrics import StepRecord


def atomic_write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    return atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def metrics_document(*, dataset: str, registry_size: int, scorer: str, k: int, regime: str, executor: str,
                     result) -> dict:
    """The exact top-level keys of metrics.json."""
    return {
        "dataset": dataset, "registry_size": registry_size, "scorer": scorer, "k": k, "regime": regime,
        "executor": executor, "n_steps": result.n_steps, "mean": result.mean, "sd": result.sd,
        "per_fold": result.per_fold,
    }


def read_steps(path: str | Path) -> list[StepRecord]:
    with open(path) as f:
        return [StepRecord(**json.loads(line)) for line in f if line.strip()]
