"""Per-step outcomes and the metrics computed from them.

Every metric is computed per outer fold and reported as mean and SD over folds (sample SD,
ddof=1; 0 for a single fold). A metric that does not apply is ``None`` (null in JSON).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from tracer.scorer_base.ranking import finalize

METRICS = (
    "recall_at_1", "recall_at_k", "mrr", "selection_accuracy", "cic_tokens", "cic_full_registry_tokens",
    "cic_reduction", "out_of_trie_rate", "fallback_rate", "recall_out_of_trie", "task_success",
    "latency_ms_p50", "latency_ms_p95",
)
# what went wrong at the executor, as shares of all steps (a step is at most one of them)
OUTCOME_RATES = ("unpresented_call_rate", "malformed_rate", "executor_error_rate", "no_call_rate")
METRICS = METRICS + OUTCOME_RATES


@dataclass
class StepRecord:
    """One test step's outcome (one line of ``steps.jsonl``)."""

    fold: int
    trajectory_id: str
    group: str
    step: int
    turn: int
    position: int
    gold: str | None
    gold_rank: int | None          # 1-based rank of the gold tool in the full ranking
    ranking: list[str]             # top 10
    presented: list[str]
    in_trie: bool | None
    fell_back: bool | None
    kappa: float | None
    selected: str | None
    correct: bool | None
    hit_at_k: bool | None
    prompt_tokens: int             # cic as counted for this run (server's when reported)
    prompt_tokens_local: int       # the same prompt, local tokenizer
    full_registry_tokens: int      # the same step with the whole registry presented, local tokenizer
    malformed: bool = False
    error: str | None = None      # executor transport/server error after retries (the step made no call)
    extra: dict = field(default_factory=dict)
    unpresented: bool = False      # the call named a tool that was not presented (never a correct selection)
    no_call: bool = False          # the executor answered without a call (no error, nothing malformed)
    prompt_tokens_by: str = "local"  # who counted prompt_tokens: "server" (its usage) or "local"
    # gold_seen: the gold tool was called in the fold's training trajectories (None: no gold)
    gold_seen: bool | None = None
    executor_seconds: float | None = None  # the model request's wall time (None: the oracle, no request)

    def to_json(self) -> dict:
        return asdict(self)


def step_outcome(decision, presented: Sequence[str], gold: str | None) -> dict:
    """The outcome fields of a step's record from the executor's ``Decision``: ``correct`` only when
    the call names a presented tool and equals the gold (None when the step has no gold)."""
    call = decision.call
    unpresented = call is not None and call.name not in presented
    return {"correct": None if gold is None else (call is not None and not unpresented and call.name == gold),
            "unpresented": unpresented, "malformed": bool(decision.malformed), "error": decision.error,
            "no_call": call is None and not decision.malformed and decision.error is None}


def outcome_rates(records: Sequence[StepRecord]) -> dict[str, float | None]:
    """Shares of all steps that called an unpresented tool, were malformed, failed at the executor, made no
    call."""
    return {"unpresented_call_rate": _mean([r.unpresented for r in records]),
            "malformed_rate": _mean([r.malformed for r in records]),
            "executor_error_rate": _mean([r.error is not None for r in records]),
            "no_call_rate": _mean([r.no_call for r in records])}


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def ranking_metrics(gold_steps: Sequence[StepRecord]) -> dict[str, float | None]:
    """Recall at 1 (the gold first in the ranking, whatever k presents), recall at k (among the presented)
    and MRR of steps that have a gold."""
    return {"recall_at_1": _mean([r.gold_rank == 1 for r in gold_steps]),
            "recall_at_k": _mean([bool(r.hit_at_k) for r in gold_steps]),
            "mrr": _mean([1.0 / r.gold_rank if r.gold_rank else 0.0 for r in gold_steps])}


def fold_metrics(records: Sequence[StepRecord], *, trie_based: bool,
                 task_success: Sequence[bool] | None = None,
                 latencies_ms: Sequence[float] | None = None) -> dict[str, float | None]:
    """Metrics of one fold from its step records."""
    gold_steps = [r for r in records if r.gold is not None]
    sel = [bool(r.correct) for r in gold_steps if r.correct is not None]
    cic = _mean([r.prompt_tokens for r in records])
    cic_local = _mean([r.prompt_tokens_local for r in records])
    full = _mean([r.full_registry_tokens for r in records])
    out = {m: None for m in METRICS}
    out.update(
        **ranking_metrics(gold_steps), selection_accuracy=_mean(sel), cic_tokens=cic,
        cic_full_registry_tokens=full,
        # reduction in one tokenizer on both sides (the local one), whatever cic_tokens was counted in
        cic_reduction=(1.0 - cic_local / full) if full else None,
    )
    out.update(outcome_rates(records))
    if trie_based and gold_steps:
        oot = [r for r in gold_steps if r.in_trie is False]
        out["out_of_trie_rate"] = len(oot) / len(gold_steps)
        out["fallback_rate"] = _mean([bool(r.fell_back) for r in gold_steps])
        out["recall_out_of_trie"] = _mean([bool(r.hit_at_k) for r in oot])
    if task_success is not None:
        out["task_success"] = _mean([bool(x) for x in task_success])
    if latencies_ms:
        out["latency_ms_p50"] = float(np.percentile(latencies_ms, 50))
        out["latency_ms_p95"] = float(np.percentile(latencies_ms, 95))
    return out


def aggregate(per_fold: Sequence[Mapping[str, float | None]]) -> tuple[dict, dict]:
    """Mean and sample SD (ddof=1) over the folds where a metric is defined; None where no fold defines it.

    (A fold can leave a metric undefined, e.g. recall on out-of-trie steps when it has none.)
    """
    mean, sd = {}, {}
    for m in METRICS:
        vals = [f.get(m) for f in per_fold if f.get(m) is not None]
        if not vals:
            mean[m] = sd[m] = None
            continue
        mean[m] = float(np.mean(vals))
        sd[m] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
    return mean, sd


def folds_in_mean(per_fold: Sequence[Mapping[str, float | None]]) -> dict[str, int]:
    """How many folds each mean of :func:`aggregate` is over (the folds that define the metric)."""
    return {m: sum(f.get(m) is not None for f in per_fold) for m in METRICS}


def by_gold_seen(records: Sequence[StepRecord]) -> dict[str, dict[str, float | int | None]]:
    """Recall at 1 and at k and MRR pooled over the steps whose gold tool the fold's training trajectories
    called (``seen``) and over the others (``unseen``: a tool the scorer never saw used)."""
    out = {}
    for label, want in (("seen", True), ("unseen", False)):
        rs = [r for r in records if r.gold is not None and r.gold_seen is want]
        out[label] = {"n_steps": len(rs), **ranking_metrics(rs)}
    return out


def recall_curve(records: Iterable[StepRecord], max_k: int = 10) -> list[float]:
    """Recall at j for j = 1..max_k from the gold ranks."""
    ranks = [r.gold_rank for r in records if r.gold is not None]
    return [float(np.mean([bool(x) and x <= j for x in ranks])) if ranks else 0.0
            for j in range(1, max_k + 1)]


def paired_test(a: Sequence[float], b: Sequence[float], n_resamples: int = 10000, seed: int = 0) -> dict:
    """Paired sign-flip permutation test and bootstrap 95% CI of mean(a - b).

    ``a`` and ``b`` are per-step outcomes of two runs on the same steps in the same order.
    """
    if len(a) != len(b):
        raise ValueError(f"paired test needs the same steps: {len(a)} vs {len(b)} outcomes")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    obs = float(d.mean()) if n else 0.0
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], size=(n_resamples, n))
    perm = (signs * d).mean(1)
    p = float((np.sum(np.abs(perm) >= abs(obs) - 1e-12) + 1) / (n_resamples + 1))
    boots = d[rng.integers(0, n, size=(n_resamples, n))].mean(1) if n else np.zeros(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"n": n, "mean_diff": obs, "p_value": p, "ci95": [float(lo), float(hi)]}


def teacher_forced_outcomes(scorer, steps: Sequence, k: int) -> dict[str, list[float]]:
    """Per step (teacher forcing, every step's gold in the registry): recall@1, recall@k and the reciprocal
    rank of the gold tool in the fitted ``scorer``'s ranking, for scripts that score a fit outside the
    runner."""
    sel = finalize(scorer.score(steps), k, scorer.pad)
    gold = scorer.res.tool_ids([s.gold for s in steps])                                  # [S]
    # rank: 1-based; the ranking is [S, N]
    rank = (sel.ranking == gold[:, None]).float().argmax(1) + 1                          # [S]
    return {"recall@1": (rank == 1).float().tolist(), f"recall@{k}": (rank <= k).float().tolist(),
            "mrr": (1.0 / rank).tolist()}
