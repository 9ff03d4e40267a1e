"""What a closed-loop run reports (:mod:`tracer.eval.closed_loop`), and the run as ``evaluate.py`` starts it.

Every figure is computed from the step records alone (``steps.jsonl``), over the *counted* steps (those of
successful conversations) in stream order:

- ``stream``: recall@1 (the gold ranked first), recall@k (the gold in the presented set), MRR (1 / the gold's
  rank in the full ranking, 0 when unranked);
- ``windows``: the same over consecutive windows of ``window`` steps (the last one may be shorter), beside the
  learner's *zero-shot start* (the same scorer fitted on no logs, never updated) over the same steps;
- ``second_half``: the same over the counted steps from position ``n // 2`` on;
- ``first_need``: of the tools some counted step needs, how many were presented at the first step that
  needed them;
- ``never_presented``: of those tools, the ones no step of the run presented;
- ``zero_shot_start``: its stream figures, the smallest window gap (learner recall@k minus the zero-shot
  start's) and whether it never fell below ``-TOLERANCE``;
- ``trials``: the trial conversations (:mod:`tracer.scorer_base.trial`), their steps, the tools shown beyond
  the k presented per step of the whole stream (the prompt cost of trials), and the steps served by the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracer.build import build_scorer
from tracer.data import Dataset
from tracer.eval.closed_loop import ClosedLoopConfig, ClosedLoopResult, LoopStep, config_from, run_closed_loop
from tracer.eval.outputs import atomic_write_text, write_json, write_jsonl
from tracer.scorer_base.resources import Resources

TOLERANCE = 0.01   # "never below its zero-shot start by more than 0.01 in any window"


def figures(steps: Sequence[LoopStep], zero_shot: bool = False) -> dict:
    """recall@1, recall@k and MRR of ``steps`` (of their zero-shot start's ranking with ``zero_shot``)."""
    if not steps:
        return {"n_steps": 0, "recall_at_1": None, "recall_at_k": None, "mrr": None}
    ranks = [s.zero_shot_rank if zero_shot else s.gold_rank for s in steps]
    hits = [s.zero_shot_hit if zero_shot else s.hit for s in steps]
    n = len(steps)
    return {"n_steps": n, "recall_at_1": sum(r == 1 for r in ranks) / n,
            "recall_at_k": sum(map(bool, hits)) / n, "mrr": sum(1.0 / r for r in ranks if r) / n}


def stream_report(result: ClosedLoopResult, cfg: ClosedLoopConfig) -> dict:
    counted = [s for s in result.steps if s.counted]
    windows = []
    for lo in range(0, len(counted), cfg.window):
        part = counted[lo: lo + cfg.window]
        own, zs = figures(part), figures(part, zero_shot=True)
        windows.append({"first": lo, **own, "zero_shot_recall_at_1": zs["recall_at_1"],
                        "zero_shot_recall_at_k": zs["recall_at_k"],
                        "gap_recall_at_k": own["recall_at_k"] - zs["recall_at_k"]})
    needed: dict[str, bool] = {}
    for s in counted:
        needed.setdefault(s.gold, s.hit)
    ever_presented = {name for s in result.steps for name in s.presented}
    never = sorted(set(needed) - ever_presented)
    gaps = [w["gap_recall_at_k"] for w in windows]
    convs = result.conversations
    cut = [c for c in convs if c.logged_calls < c.n_calls]
    return {
        "stream": figures(counted),
        "second_half": {"from": len(counted) // 2, **figures(counted[len(counted) // 2:])},
        "windows": windows,
        "zero_shot_start": {**figures(counted, zero_shot=True), "min_window_gap": min(gaps) if gaps else None,
                            "tolerance": TOLERANCE,
                            "never_below": all(g >= -TOLERANCE for g in gaps)},
        "first_need": {"tools": len(needed), "presented": sum(needed.values()),
                       "share": sum(needed.values()) / len(needed) if needed else None},
        "never_presented": {"tools": len(needed), "count": len(never),
                            "share": len(never) / len(needed) if needed else None, "names": never},
        "logged": {"conversations": len(convs),
                   "unpresented": sum(c.cut_at is not None for c in convs),  # a call whose tool was not shown
                   "cut": len(cut), "cut_share": len(cut) / len(convs) if convs else None,
                   "calls": sum(c.n_calls for c in convs), "calls_logged": sum(c.logged_calls for c in convs),
                   "logged_failures": sum(not c.logged_success for c in convs)},
        "trials": {"conversations": sum(c.trial for c in convs),
                   "steps": sum(bool(s.explored) for s in result.steps),
                   "extra_tools_per_step": (sum(len(s.explored) for s in result.steps) / len(result.steps)
                                            if result.steps else None),
                   "model_served_steps": sum(s.serves == "model" for s in result.steps),
                   "all_steps": len(result.steps)},
        "refit_counts": result.refit_counts, "refits": result.refits, "standin": result.standin,
    }


def _f(x: Any) -> str:
    return "–" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def _row(label: str, fig: Mapping[str, Any]) -> str:
    return (f"| {label} | {fig['n_steps']} | {_f(fig['recall_at_1'])} | {_f(fig['recall_at_k'])} | "
            f"{_f(fig['mrr'])} |")


def _refits(doc: Mapping[str, Any]) -> str:
    done = []
    for r in doc["refits"]:
        failed = f", failed: {r['error'][:80]}" if "error" in r else ""
        done.append(f"{r['trajectories']} ({r['seconds']:.1f} s{failed})")
    return ", ".join(done) or "none (nothing learned to refit)"


def markdown(doc: Mapping[str, Any]) -> str:
    """The run's ``report.md``."""
    s, z, lg = doc["stream"], doc["zero_shot_start"], doc["logged"]
    fn, nv = doc["first_need"], doc["never_presented"]
    never = ""
    if nv["count"]:
        never = ": " + ", ".join(nv["names"][:20]) + (" ..." if nv["count"] > 20 else "")
    lines = [
        (f"# Closed loop: {doc['dataset']} ({doc['registry_size']} tools), {doc['scorer']}, "
         f"feedback {doc['feedback']}, k={doc['k']}"),
        "",
        (f"Oracle view (a presented gold is called); {lg['conversations']} conversations in a seeded order "
         f"(seed {doc['seed']}), every step scored before its conversation is learned; "
         f"{s['n_steps']} counted steps."),
        "",
        "| part | steps | recall@1 | recall@k | MRR |",
        "|---|---:|---:|---:|---:|",
        _row("stream", s),
        _row("second half", doc["second_half"]),
        _row("zero-shot start", z),
        "",
        "| window (first step) | steps | recall@1 | recall@k | MRR | zero-shot recall@k | gap |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in doc["windows"]:
        lines.append(f"{_row(str(w['first']), w)} {_f(w['zero_shot_recall_at_k'])} | "
                     f"{w['gap_recall_at_k']:+.3f} |")
    lines += [
        "",
        (f"- never below the zero-shot start by more than {z['tolerance']} in a window: "
         f"**{'yes' if z['never_below'] else 'no'}** (smallest gap {_f(z['min_window_gap'])})"),
        f"- tools presented at their first need: {fn['presented']} of {fn['tools']} ({_f(fn['share'])})",
        f"- tools never presented in the run: {nv['count']} of {nv['tools']} ({_f(nv['share'])}){never}",
        (f"- logged: {lg['unpresented']} of {lg['conversations']} conversations called a tool not presented, "
         f"{lg['cut']} cut ({_f(lg['cut_share'])}), "
         f"{lg['calls_logged']} of {lg['calls']} calls logged, {lg['logged_failures']} logged as failures"),
        f"- refits after {doc['refit_counts']} conversations: {_refits(doc)}",
    ]
    tr = doc.get("trials") or {}
    if tr.get("conversations"):
        lines.append(f"- trials: {tr['conversations']} conversations ({tr['steps']} steps) showed both "
                     f"rankings, {_f(tr['extra_tools_per_step'])} tools beyond k per step of the stream; the "
                     f"model served {tr['model_served_steps']} of {tr['all_steps']} steps")
    if doc.get("standin"):
        lines.append(f"- served {doc['standin']} until a logged conversation held a step it could learn from")
    return "\n".join(lines) + "\n"


def closed_loop_job(cfg: Mapping[str, Any], ds: Dataset, res: Resources, run_dir: Path,
                    executor_label: str) -> dict:
    """Run the closed loop of a composed ``evaluate.yaml`` and write ``metrics.json``, ``steps.jsonl``,
    ``conversations.jsonl`` and ``report.md`` into ``run_dir``."""
    loop_cfg = config_from(cfg)
    result = run_closed_loop(ds, lambda: build_scorer(cfg["scorer"]), res, loop_cfg)
    rep = stream_report(result, loop_cfg)
    doc = {"dataset": ds.name, "registry_size": len(ds.registry), "scorer": cfg["scorer"]["name"],
           "k": loop_cfg.k, "regime": "closed_loop", "feedback": loop_cfg.feedback, "seed": loop_cfg.seed,
           "executor": executor_label, "n_steps": rep["stream"]["n_steps"],
           "mean": {k: rep["stream"][k] for k in ("recall_at_1", "recall_at_k", "mrr")}, **rep,
           "window": loop_cfg.window, "scorer_info": result.scorer_info}
    write_json(run_dir / "metrics.json", doc)
    write_jsonl(run_dir / "steps.jsonl", (s.to_json() for s in result.steps))
    write_jsonl(run_dir / "conversations.jsonl", (c.to_json() for c in result.conversations))
    atomic_write_text(run_dir / "report.md", markdown(doc))
    return doc


def summary(doc: Mapping[str, Any]) -> str:
    """The lines ``evaluate.py`` prints for a closed-loop run."""
    s, h, z = doc["stream"], doc["second_half"], doc["zero_shot_start"]

    def line(label: str, fig: Mapping[str, Any]) -> str:
        return (f"  {label:<16} recall@1 {_f(fig['recall_at_1'])}  recall@k {_f(fig['recall_at_k'])}  "
                f"mrr {_f(fig['mrr'])}")

    return "\n".join([
        (f"{doc['dataset']} ({doc['registry_size']} tools) | scorer {doc['scorer']} | k={doc['k']} | "
         f"closed_loop ({doc['feedback']}) | {doc['n_steps']} steps"),
        line("stream", s), line("second half", h), line("zero-shot start", z),
        f"  never below the zero-shot start by > {z['tolerance']} in a window: {z['never_below']}"])
