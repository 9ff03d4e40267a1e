"""A run's outcomes pooled over its steps, each share with its Wilson 95% interval.

The ``selection`` regime asks a real model about a few dozen sampled steps, spread over five folds: a mean
and SD over folds of six steps each says little, a share of all the steps with its binomial interval says
what the sample can. The Wilson score interval (Wilson, 1927; the one Brown, Cai and DasGupta, 2001,
recommend for small n) stays inside [0, 1] and is not degenerate at 0 or n successes, as the normal
approximation is; ``scipy.stats.binomtest(...).proportion_ci(method="wilson")`` computes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracer.eval.metrics import StepRecord

CONFIDENCE = 0.95


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> list[float] | None:
    """The Wilson score interval ``[low, high]`` of ``successes`` out of ``n`` trials; None when n is 0."""
    if n == 0:
        return None
    # imported here: scipy.stats takes nearly 2 s to import, which every train.py and evaluate.py process
    # would pay at start, one that fails on a bad argument included
    from scipy.stats import binomtest

    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return [float(ci.low), float(ci.high)]


def share(flags: Sequence[bool]) -> dict:
    """``{"successes", "n", "rate", "wilson95"}`` of a list of per-step outcomes (rate None when empty)."""
    n, hits = len(flags), int(sum(bool(f) for f in flags))
    return {"successes": hits, "n": n, "rate": hits / n if n else None, "wilson95": wilson(hits, n)}


def _stats(values: Sequence[float]) -> dict:
    if not values:
        return {"n": 0, "mean": None, "median": None}
    return {"n": len(values), "mean": float(np.mean(values)), "median": float(np.median(values))}


def pooled_outcomes(records: Sequence[StepRecord], tasks: Sequence[dict] | None = None) -> dict:
    """Shares over all of a run's steps (each with its Wilson interval) and the per-step costs; with the
    free-running regime's ``tasks`` (each with ``success``), the share of tasks solved too.

    ``selection_accuracy`` and ``recall_at_k`` are over the steps with a gold call; the outcome shares over
    all steps, as :func:`tracer.eval.metrics.outcome_rates` counts them. ``prompt_tokens`` are as the run
    counted them (the server's ``usage`` where it reported one); ``executor_seconds`` is each request's wall
    time (None under the oracle, which makes no request)."""
    gold = [r for r in records if r.gold is not None]
    seconds = [r.executor_seconds for r in records if r.executor_seconds is not None]
    solved = {} if tasks is None else {"task_success": share([bool(t["success"]) for t in tasks])}
    return {
        "n_steps": len(records),
        **solved,
        "selection_accuracy": share([bool(r.correct) for r in gold]),
        "recall_at_k": share([bool(r.hit_at_k) for r in gold]),
        "unpresented_call_rate": share([r.unpresented for r in records]),
        "malformed_rate": share([r.malformed for r in records]),
        "no_call_rate": share([r.no_call for r in records]),
        "executor_error_rate": share([r.error is not None for r in records]),
        "prompt_tokens": _stats([r.prompt_tokens for r in records]),
        "prompt_tokens_by_server": sum(r.prompt_tokens_by == "server" for r in records),
        "executor_seconds": _stats(seconds),
    }


def pooled_lines(pooled: dict) -> list[str]:
    """The summary table's lines for :func:`pooled_outcomes`."""
    lines = [f"  pooled over {pooled['n_steps']} steps (Wilson 95% intervals):"]
    shares = ("selection_accuracy", "recall_at_k", "unpresented_call_rate", "malformed_rate", "no_call_rate",
              "executor_error_rate")
    if "task_success" in pooled:  # the free-running regime's
        shares = ("task_success", *shares)
    for key in shares:
        s = pooled[key]
        if s["rate"] is None:
            lines.append(f"    {key:<24} –")
            continue
        low, high = s["wilson95"]
        lines.append(f"    {key:<24} {s['rate']:.3f} [{low:.3f}, {high:.3f}]  ({s['successes']}/{s['n']})")
    for key, unit in (("prompt_tokens", "tokens"), ("executor_seconds", "s")):
        s = pooled[key]
        if s["mean"] is not None:
            lines.append(f"    {key:<24} mean {s['mean']:.1f} {unit}, median {s['median']:.1f} {unit}")
    return lines
