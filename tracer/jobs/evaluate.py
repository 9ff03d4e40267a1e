"""One evaluation job from a config: build everything, run the folds, write and log the results."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracer.build import (
    build_dataset,
    build_embedder,
    build_executor,
    build_fold_encoders,
    build_insight_memory,
    build_logger,
    build_scorer,
    plain,
)
from tracer.core.folds import check_folds
from tracer.core.validate import EVAL_INTS, check_config, check_int
from tracer.eval import plots
from tracer.eval.closed_loop import config_from
from tracer.eval.closed_loop_report import closed_loop_job, summary
from tracer.eval.metrics import METRICS, StepRecord, outcome_rates
from tracer.eval.outputs import metrics_document, write_json, write_jsonl
from tracer.eval.pooled import pooled_lines, pooled_outcomes
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.eval.tokens import LOCAL_TOKENIZER
from tracer.scorer_base.resources import Resources


def summary_table(doc: Mapping[str, Any]) -> str:
    if doc.get("regime") == "closed_loop":
        return summary(doc)
    n, over = doc.get("folds"), doc.get("folds_in_mean", {})
    lines = [(f"{doc['dataset']} ({doc['registry_size']} tools) | scorer {doc['scorer']} | k={doc['k']} | "
              f"{doc['regime']} | executor {doc['executor']} | {doc['n_steps']} steps | "
              f"mean ± SD over {n} folds")]
    if doc.get("folds_without_test_steps"):
        lines.append(f"  folds without test steps (in no mean): {doc['folds_without_test_steps']}")
    for m in METRICS:
        mu, sd = doc["mean"][m], doc["sd"][m]
        note = f"  (over {over[m]} of {n} folds)" if mu is not None and over.get(m, n) != n else ""
        lines.append(f"  {m:<26} {'–' if mu is None else f'{mu:.4f} ± {sd:.4f}'}{note}")
    seen = doc.get("by_gold_seen") or {}
    if seen:  # pooled over steps: a tool the fold's training never called is "unseen"
        parts = [f"{k} {v['n_steps']} steps "
                 f"{'–' if v['recall_at_k'] is None else format(v['recall_at_k'], '.4f')}"
                 for k, v in seen.items()]
        lines.append(f"  {'recall_at_k by gold tool':<26} {', '.join(parts)} (pooled)")
    if doc.get("pooled"):
        lines.extend(pooled_lines(doc["pooled"]))
    return "\n".join(lines)


class ExecutorFailure(RuntimeError):
    """Most steps of a run failed at the executor: its numbers say nothing about the scorer."""


def tokenizer_label(records: Sequence[StepRecord], server: str | None) -> str:
    """Whose tokens the prompt counts are in, from what each step actually used."""
    local = f"{LOCAL_TOKENIZER} (local, offline)"
    n_server = sum(r.prompt_tokens_by == "server" for r in records)
    if n_server == 0 or server is None:
        return local
    if n_server == len(records):
        return server
    return (f"{server} on {n_server} steps, {local} on {len(records) - n_server} steps "
            "(no usage from the server)")


def check_executor_errors(records: Sequence[StepRecord], max_rate: float, run_dir: Path) -> None:
    """Raise :class:`ExecutorFailure` when more than ``max_rate`` of the steps failed at the executor."""
    rate = outcome_rates(records)["executor_error_rate"] or 0.0
    if rate > max_rate:
        first = next(r.error for r in records if r.error is not None)
        raise ExecutorFailure(f"{rate:.1%} of {len(records)} steps failed at the executor "
                              f"(max_executor_error_rate={max_rate}); first error: {first}. "
                              f"Outputs are in {run_dir}.")


def check_closed_loop(cfg: Mapping[str, Any]) -> None:
    """``regime=closed_loop``: its settings, and the options it has no use for refused by their override."""
    config_from(cfg)
    executor = str((cfg.get("executor") or {}).get("_target_", ""))
    refused = {"train_trajectories": cfg.get("train_trajectories") is not None,
               "holdout_tools": bool(cfg.get("holdout_tools")), "insight": bool(cfg.get("insight")),
               "encoder_training": bool(cfg.get("encoder_training")),
               "executor": not executor.endswith(".OracleExecutor")}
    for key, bad in refused.items():
        if bad:
            raise ValueError(f"regime=closed_loop starts from no logs under the oracle: {key} (override "
                             f"{key}=...) must stay at its default, got {cfg.get(key)!r}")


def run_job(cfg: Mapping[str, Any], run_dir: str | Path) -> dict:
    """Run the evaluation described by ``cfg`` (the composed ``configs/evaluate.yaml``) into ``run_dir``."""
    cfg = plain(cfg)
    check_config(cfg, EVAL_INTS)
    if cfg.get("train_trajectories") is not None:
        check_int(cfg["train_trajectories"], "train_trajectories (override train_trajectories=...)", 0)
    if not isinstance(cfg.get("holdout_tools", False), bool):
        raise TypeError(f"holdout_tools (override holdout_tools=...) must be true or false, "
                        f"got {cfg['holdout_tools']!r}")
    if (cfg.get("regime") or {}).get("max_steps_per_turn") is not None:
        check_int(cfg["regime"]["max_steps_per_turn"],
                  "regime.max_steps_per_turn (override regime.max_steps_per_turn=...)", 1)
    if (cfg.get("regime") or {}).get("steps") is not None:  # regime=selection's sample
        check_int(cfg["regime"]["steps"], "regime.steps (override regime.steps=...)", 1)
    if (cfg.get("regime") or {}).get("tasks") is not None:  # regime=free_running's sample
        check_int(cfg["regime"]["tasks"], "regime.tasks (override regime.tasks=...)", 1)
    regime = cfg.get("regime") or {"name": "teacher_forcing"}
    if regime["name"] == "closed_loop":
        check_closed_loop(cfg)
    run_dir = Path(run_dir)
    ds = build_dataset(cfg["dataset"], cfg.get("registry"), cfg.get("seed", 0))
    if regime["name"] != "closed_loop":  # one stream, no folds
        check_folds(cfg["folds"], ds.trajectories)
    embedder = build_embedder(cfg["embedder"])
    executor = build_executor(cfg["executor"])
    # the summaries' model: memory_executor when set (the oracle may choose meanwhile), else the step executor
    memory = build_executor(cfg["memory_executor"]) if cfg.get("memory_executor") else executor
    res = Resources.build(ds.registry, embedder, device=cfg.get("device"), seed=cfg.get("seed", 0),
                          executor=None if memory.is_oracle else memory)
    if regime["name"] == "closed_loop":
        return closed_loop_job(cfg, ds, res, run_dir, f"{executor.name} (oracle: a presented gold is called)")
    scorer_cfg = cfg["scorer"]
    # insight=true: the memory of configs/scorer/insight.yaml's memory: node, a fresh one per outer fold
    insight_factory = build_insight_memory if cfg.get("insight") else None
    ecfg = EvalConfig(k=cfg["k"], folds=cfg["folds"], seed=cfg["seed"], regime=regime["name"],
                      max_steps_per_turn=regime.get("max_steps_per_turn", 20),
                      test_successful_only=cfg.get("test_successful_only", True),
                      latency_sample=cfg.get("latency_sample", 50), progress=cfg.get("progress", True),
                      train_trajectories=cfg.get("train_trajectories"),
                      holdout_tools=cfg.get("holdout_tools", False),
                      sample_steps=regime.get("steps") if regime["name"] == "selection" else None,
                      sample_tasks=regime.get("tasks") if regime["name"] == "free_running" else None)
    logger = build_logger(cfg.get("logger"), run_dir, f"{ds.name}-{scorer_cfg['name']}-k{cfg['k']}")
    logger.log_config(cfg)
    # encoder_training: each outer fold fine-tunes its own encoder on its training trajectories only
    fold_encoders = None
    if cfg.get("encoder_training"):
        fold_encoders = build_fold_encoders(ds.registry, cfg["encoder_training"],
                                            (cfg.get("embedder") or {}).get("cache_dir", ".cache/embeddings"),
                                            device=res.device, seed=res.seed, executor=res.executor)
    result = Evaluator(ds, lambda: build_scorer(scorer_cfg), res, executor, ecfg, insight_factory,
                       fold_resources=fold_encoders).run()

    scorer_label = scorer_cfg["name"] + ("+insight" if cfg.get("insight") else "")
    executor_label = executor.name + (" (oracle: selection bounded by coverage)" if executor.is_oracle
                                      else "")
    doc = metrics_document(dataset=ds.name, registry_size=len(ds.registry), scorer=scorer_label, k=cfg["k"],
                           regime=ecfg.regime, executor=executor_label, result=result)
    if ecfg.regime == "selection":  # a sample of a few dozen steps: shares over all of them, with intervals
        doc["pooled"] = pooled_outcomes(result.records)
    elif ecfg.regime == "free_running":  # as few tasks as a real model's budget allows: the same
        doc["pooled"] = pooled_outcomes(result.records, result.tasks)
    if doc["folds_without_test_steps"]:
        warnings.warn(f"folds {doc['folds_without_test_steps']} had no test steps: the means are over "
                      f"{doc['folds'] - len(doc['folds_without_test_steps'])} of {doc['folds']} folds",
                      stacklevel=2)
    write_json(run_dir / "metrics.json", doc)
    write_jsonl(run_dir / "steps.jsonl", (r.to_json() for r in result.records))
    if result.tasks:
        write_jsonl(run_dir / "tasks.jsonl", result.tasks)
    write_json(run_dir / "run_info.json", {
        "config": cfg, "recall_curve": result.recall_curve, "fit_seconds": result.fit_seconds,
        "tokenizer": tokenizer_label(result.records, executor.tokenizer_name),
        "embeddings_encoded": embedder.n_encoded, "skipped": dict(ds.skipped),
        "scorer_info": result.scorer_info,
        "encoder_training": [{k: v for k, v in h.items() if k != "trajectory_ids"}
                             for h in (fold_encoders.history if fold_encoders else [])],
    })
    rows = [doc]
    plots.cost_accuracy(rows, run_dir / "cost_accuracy.png")
    plots.recall_vs_k({scorer_label: result.recall_curve}, run_dir / "recall_vs_k.png")
    if result.trie_based:
        plots.out_of_trie(rows, run_dir / "out_of_trie.png")
    encoder_history = fold_encoders.outer if fold_encoders else [{}] * len(result.per_fold)
    for f, (m, enc) in enumerate(zip(result.per_fold, encoder_history)):
        logger.log({f"fold/{k}": v for k, v in m.items() if v is not None}
                   | {f"fold/encoder_{k}": enc[k]
                      for k in ("train_seconds", "teacher_train_seconds", "final_loss")
                      if enc.get(k) is not None}, step=f)
    if fold_encoders:  # the loss curves, logged once the per-fold steps are written (W&B steps only go up)
        logger.log_table("encoder_loss", ["fold", "step", "loss"],
                         [[f, i, v] for f, h in enumerate(fold_encoders.outer)
                          for i, v in enumerate(h["loss"])])
    logger.log_summary({f"{k}_mean": v for k, v in result.mean.items() if v is not None}
                       | {f"{k}_sd": v for k, v in result.sd.items() if v is not None}
                       | {"n_steps": result.n_steps})
    cols = ["fold", "trajectory_id", "step", "gold", "gold_rank", "selected", "correct", "in_trie",
            "fell_back", "kappa", "prompt_tokens", "presented"]
    logger.log_table("steps", cols, [[json.dumps(getattr(r, c)) if c == "presented" else getattr(r, c)
                                      for c in cols]
                                     for r in result.records])
    for png in sorted(run_dir.glob("*.png")):
        logger.log_image(png.stem, png)
    logger.finish()
    check_executor_errors(result.records, cfg.get("max_executor_error_rate", 0.5), run_dir)
    return doc
