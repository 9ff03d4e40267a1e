"""Reading evaluate.py's run directories, and the cells every real-model table prints.

A run directory (``hydra.run.dir``) holds ``metrics.json`` and ``steps.jsonl``; a free-running run adds
``tasks.jsonl``, and ``run_info.json`` carries each fold's ``scorer_info``. The tables in this folder read
them here, so that a share is printed the same way in all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Run:
    path: Path
    metrics: dict
    steps: list[dict]

    @cached_property
    def tasks(self) -> list[dict]:
        """Free-running: one line per task, with bfcl_eval's verdict in ``success``."""
        return _lines(self.path / "tasks.jsonl")

    @cached_property
    def scorer_info(self) -> list[dict]:
        """One entry per fold, as the scorer described itself after the fold's test steps."""
        return json.loads((self.path / "run_info.json").read_text())["scorer_info"]

    @property
    def label(self) -> tuple[str, str]:
        """(scorer, k), where the whole registry's k reads ``all N``."""
        doc = self.metrics
        k = f"all {doc['registry_size']}" if doc["scorer"] == "llm_only" else str(doc["k"])
        return doc["scorer"], k


def read_run(path: Path) -> Run:
    return Run(path, json.loads((path / "metrics.json").read_text()), _lines(path / "steps.jsonl"))


def read_runs(out: Path, names: tuple[str, ...] | None = None) -> dict[str, Run]:
    """The finished runs under ``out`` (those with a metrics.json), by directory name: all of them in
    name order, or only ``names`` in their order."""
    dirs = [out / name for name in names] if names is not None else sorted(out.iterdir())
    return {p.name: read_run(p) for p in dirs if (p / "metrics.json").exists()}


def step_key(step: dict) -> tuple[str, int]:
    """What identifies a step across runs of the same seed: its conversation and its index there."""
    return step["trajectory_id"], step["step"]


def cell(share: dict) -> str:
    """A share of :func:`tracer.eval.pooled.share` as ``rate [low, high] (successes/n)``."""
    low, high = share["wilson95"]
    return f"{share['rate']:.2f} [{low:.2f}, {high:.2f}] ({share['successes']}/{share['n']})"
