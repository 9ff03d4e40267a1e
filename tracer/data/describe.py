"""Dataset statistics: conversations, turns, steps and how calls spread over turns.

Run as::

    python -m tracer.data.describe bfcl tau2 apibank jsonl:DIR
        [--tau2-domains retail,telecom] [--registry large]

It prints one Markdown row per dataset; tau2 gets one row per domain and one for the pooled
domains, API-Bank one per level and one for the pooled levels.

Turns follow :func:`tracer.core.steps.turns_of`: every user message opens a turn, and calls made before
the first user message form a turn of their own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from tracer.core.errors import DataError
from tracer.core.steps import turns_of
from tracer.data import Dataset, load_dataset
from tracer.data.pool import apply_preset

COLUMNS = (
    ("name", "dataset"),
    ("conversations", "conversations"),
    ("groups", "groups"),
    ("turns", "turns"),
    ("steps", "steps"),
    ("tools", "tools"),
    ("steps_per_active_turn", "steps/turn (turns with calls)"),
    ("steps_per_turn", "steps/turn (all)"),
    ("opening_share", "turn-opening steps"),
    ("max_calls_per_turn", "max calls in a turn"),
    ("toolkit_share", "same toolkit as the last call"),
    ("repeat_share", "repeats the turn's last call"),
    ("skipped", "skipped"),
)


def describe(dataset: Dataset) -> dict[str, Any]:
    """Counts and ratios of one dataset.

    Returns a dict with ``name``, ``conversations``, ``groups``, ``turns``, ``active_turns`` (turns
    with at least one call), ``steps``, ``tools`` (registry size), ``tools_called`` (distinct gold
    names), ``steps_per_active_turn`` (mean over active turns), ``steps_per_turn`` (mean over all
    turns), ``opening_share`` (share of steps with ``position == 0``), ``max_calls_per_turn``,
    ``toolkit_share`` (of the steps after a conversation's first call, the share whose tool has the
    toolkit, a non-empty ``Tool.source``, of the call before it), ``repeat_share`` (the share of steps whose
    tool is the previous call of their turn) and ``skipped`` (the loader's counts).
    """
    turns = [t for traj in dataset.trajectories for t in turns_of(traj)]
    steps = dataset.steps()
    active = [t for t in turns if t]
    n_steps = len(steps)
    kit = {t.name: t.source for t in dataset.registry}
    later = [s for s in steps if s.history]
    same = sum(bool(kit.get(s.gold)) and kit.get(s.gold) == kit.get(s.history[-1]) for s in later)
    return {
        "name": dataset.name,
        "conversations": len(dataset.trajectories),
        "groups": len({t.group for t in dataset.trajectories}),
        "turns": len(turns),
        "active_turns": len(active),
        "steps": n_steps,
        "tools": len(dataset.registry),
        "tools_called": len({s.gold for s in steps}),
        "steps_per_active_turn": n_steps / len(active) if active else 0.0,
        "steps_per_turn": n_steps / len(turns) if turns else 0.0,
        "opening_share": sum(s.position == 0 for s in steps) / n_steps if n_steps else 0.0,
        "max_calls_per_turn": max((len(t) for t in turns), default=0),
        "toolkit_share": same / len(later) if later else 0.0,
        "repeat_share": sum(bool(s.prefix) and s.prefix[-1] == s.gold for s in steps) / n_steps if n_steps
        else 0.0,
        "skipped": dict(dataset.skipped),
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {v}" for k, v in value.items()) or "–"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of :func:`describe` rows (floats to two decimals)."""
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "|".join("---" if key in ("name", "skipped") else "---:" for key, _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key, "")) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def _datasets(spec: str, tau2_domains: Sequence[str]) -> list[tuple[str, Dataset]]:
    """(preset family, dataset) pairs to describe for one command-line name."""
    if spec.startswith("jsonl:"):
        return [("jsonl", load_dataset("jsonl", path=spec[len("jsonl:"):]))]
    if spec == "tau2":
        parts = [("tau2", load_dataset("tau2", domains=(d,))) for d in tau2_domains]
        return parts + ([("tau2", load_dataset("tau2", domains=tuple(tau2_domains)))]
                        if len(tau2_domains) > 1 else [])
    if spec == "apibank":
        levels = [replace(load_dataset("apibank", levels=(lv,)), name=f"apibank-l{lv}") for lv in (1, 2, 3)]
        return [("apibank", ds) for ds in levels] + [("apibank", load_dataset("apibank"))]
    if spec == "bfcl":
        return [("bfcl", load_dataset("bfcl", execute=False))]
    return [(spec, load_dataset(spec))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracer.data.describe",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="+", help="bfcl, tau2, apibank or jsonl:DIR")
    parser.add_argument("--tau2-domains", default="retail,airline,telecom",
                        help="comma-separated tau2 domains")
    parser.add_argument("--registry", default="small", choices=("small", "medium", "large"),
                        help="registry preset (tracer.data.pool.REGISTRY_PRESETS); "
                             "jsonl datasets stay native")
    parser.add_argument("--seed", type=int, default=0, help="seed of the distractor draw")
    args = parser.parse_intermixed_args(argv)
    domains = [d.strip() for d in args.tau2_domains.split(",") if d.strip()]

    rows, notes, errors = [], [], []
    for spec in args.datasets:
        try:
            for family, ds in _datasets(spec, domains):
                if args.registry != "small" and family != "jsonl":
                    ds = apply_preset(family, ds, args.registry, seed=args.seed)
                rows.append(describe(ds))
        except KeyError as e:
            if not str(e.args[0]).startswith("unknown dataset"):
                raise
            notes.append(f"{spec}: not described: no loader registered ({e.args[0]})")
        except (DataError, ValueError) as e:
            errors.append(f"{spec}: failed: {e}")
    if rows:
        print(format_table(rows))
    for note in notes:
        print(note)
    for err in errors:
        print(err, file=sys.stderr)
    return 1 if errors else 0

if __name__ == "__main__":
    sys.exit(main())
