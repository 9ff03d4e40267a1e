"""The blend head's report for ``train.py scorer=tracer``: held-out comparison with a feature ablation over
outer folds, predicted w and T per environment (the paper's Table 13), the w head's coefficients
(Table 14), feature correlations, and a histogram of w and T.

Example::

    ablation = heldout_ablation(trajectories, res, key, rendering, eps, True, head_cfg, folds=5, seed=0)
    report = build_report("bfcl", head, history, data, ablation)
    print(report_markdown(report))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from tracer.core.context import ContextRendering
from tracer.core.folds import inner_seed, kfold
from tracer.core.io import atomic_save, write_json
from tracer.core.types import Trajectory
from tracer.learn.blend_fit import HeadConfig, StepData, inner_fold_data, score_steps, train_head
from tracer.learn.blend_head import FEATURES, BlendHead, fixed_blend
from tracer.learn.nll import masked_log_softmax
from tracer.memory.keys import StateKey
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.resources import Resources, training_steps


@torch.no_grad()
def evaluate(head: BlendHead | None, data: StepData) -> dict[str, float]:
    """Held-out NLL (mean over steps whose gold is a child) and recall@1 among the children
    (over steps whose state is in the trie; a gold that is not a child counts as a miss).
    ``head=None`` evaluates the fixed blend s = P + L."""
    rows = data.in_trie
    d = data.subset(rows)
    if head is None:
        s = fixed_blend(d.log_p, d.log_l, d.mask)
    else:
        s, _, _ = head(d.log_p, d.log_l, d.mask, d.feats)
    logp = masked_log_softmax(s, d.mask)                                                 # [S, C]
    cov = d.covered
    nll = -logp[cov].gather(1, d.gold[cov][:, None]).squeeze(1)
    hit = (s.argmax(1) == d.gold) & cov
    return {"nll_sum": float(nll.sum()), "n_covered": int(cov.sum()), "hits": int(hit.sum()),
            "n_in_trie": len(d), "nll": float(nll.mean()) if len(nll) else float("nan"),
            "recall_at_1": int(hit.sum()) / len(d) if len(d) else float("nan")}


def heldout_ablation(trajectories: Sequence[Trajectory], res: Resources, key: StateKey,
                     rendering: ContextRendering, eps: float, successful_only: bool,
                     head: Mapping[str, Any] | HeadConfig, folds: int,
                     seed: int) -> dict[str, dict[str, float]]:
    """Outer k-fold comparison: fixed blend, the full head, the head with each feature dropped, and
    the head with every feature dropped (``bias_only``: one w and T for all states).

    For every outer fold the head is fitted on the training split's inner-fold data (exactly as
    ``TracerScorer.fit``) and evaluated on the test split's steps against the training split's
    full trie. Returns per variant the pooled held-out NLL and recall@1 (see :func:`evaluate`).
    """
    cfg = HeadConfig.from_config(head, seed=seed)
    variants: dict[str, Sequence[str] | None] = {"fixed": None, "learned": ()}
    variants.update({f"-{f}": (f,) for f in FEATURES})
    variants["bias_only"] = FEATURES  # one global w and T: do the state features matter at all?
    tot = {v: {"nll_sum": 0.0, "n_covered": 0, "hits": 0, "n_in_trie": 0} for v in variants}
    for split in kfold(trajectories, folds, seed):
        data = inner_fold_data(split.train, res, key, rendering, eps, successful_only, cfg.inner_folds,
                               inner_seed(seed, split.fold))
        train_steps = training_steps(split.train, res.registry, successful_only)
        trie = ExecutionTrie.build(train_steps, res.tool_ids([s.gold for s in train_steps]),
                                   res.embed(train_steps, rendering), len(res.registry), key, eps, res.device)
        test_steps = training_steps(split.test, res.registry, True)
        domain_of = {t.id: t.domain for t in split.test}
        test = score_steps(trie, test_steps, res.embed(test_steps, rendering),
                           res.tool_ids([s.gold for s in test_steps]),
                           [domain_of[s.trajectory_id] for s in test_steps])
        for name, drop in variants.items():
            h = None if drop is None else train_head(data, replace(cfg, drop=tuple(drop)))[0]
            m = evaluate(h, test)
            for k in tot[name]:
                tot[name][k] += m[k]
    return {v: {**t, "nll": t["nll_sum"] / max(t["n_covered"], 1),
                "recall_at_1": t["hits"] / max(t["n_in_trie"], 1)} for v, t in tot.items()}


@torch.no_grad()
def wt_summary(head: BlendHead, data: StepData) -> dict[str, Any]:
    """Mean and SD of the predicted w and T over the steps in the trie, overall and per domain
    (the paper's Table 13)."""
    d = data.subset(data.in_trie)
    w, t = head.wt(d.feats)
    w, t = w.cpu().double(), t.cpu().double()

    def stats(idx):
        ww, tt = w[idx], t[idx]
        return {"n": len(ww), "w_mean": float(ww.mean()), "w_sd": float(ww.std(unbiased=False)),
                "T_mean": float(tt.mean()), "T_sd": float(tt.std(unbiased=False))}

    by = {}
    for dom in sorted(set(d.domains)):
        by[dom] = stats(torch.tensor([x == dom for x in d.domains]))
    return {"all": stats(torch.ones(len(d), dtype=torch.bool)) if len(d) else {}, "by_domain": by,
            "w": w.tolist(), "T": t.tolist(), "domains": d.domains}


def build_report(dataset: str, head: BlendHead, history: Mapping, data: StepData,
                 ablation: Mapping | None = None) -> dict[str, Any]:
    """Everything ``train.py`` reports, as one JSON-able dict."""
    wt = wt_summary(head, data)
    # [F, F] Pearson
    corr = torch.corrcoef(data.feats.double().T) if len(data) > 1 else torch.eye(len(FEATURES))
    return {"dataset": dataset, "features": list(FEATURES),
            "wt": {"all": wt["all"], "by_domain": wt["by_domain"]},
            "coefficients": head.coefficients(), "feature_stats": head.feature_stats(),
            "feature_correlation": {f: dict(zip(FEATURES, [round(float(x), 4) for x in row]))
                                    for f, row in zip(FEATURES, corr)},
            "fit": {**{k: v for k, v in history.items() if k != "runs"},
                    "runs": [{k: v for k, v in r.items() if not isinstance(v, list)}
                             for r in history.get("runs", [])]},
            "ablation": ablation}


def report_markdown(report: Mapping[str, Any]) -> str:
    """A human-readable version of :func:`build_report`'s dict."""
    fit, a, nan = report["fit"], report["wt"]["all"], float("nan")
    lines = [f"# Blend head on {report['dataset']}", "",
             (f"Fitted on {fit.get('n_train')} out-of-fold steps whose gold is a child "
              f"({fit.get('n_uncovered')} steps whose gold is not a child carry no gradient): "
              f"{len(fit.get('runs', []))} head(s), each early-stopped on one held-out inner fold "
              f"(best epochs {fit.get('best_epochs')}), parameters averaged; "
              f"held-out inner-fold NLL {fit.get('best_val_loss', nan):.4f}."),
             (f"Fit time beyond embeddings: {fit.get('seconds_fit', nan):.2f} s (inner indexes "
              f"{fit.get('seconds_index', nan):.2f} s, training {fit.get('seconds_train', nan):.2f} s); "
              f"embedding {fit.get('seconds_embed', nan):.2f} s."), "",
             "## Predicted w and T (out-of-fold steps in the trie; Table 13)", "",
             "| environment | steps | w mean | w SD | T mean | T SD |", "|---|---:|---:|---:|---:|---:|",
             (f"| **all** | {a.get('n', 0)} | {a.get('w_mean', nan):.3f} | {a.get('w_sd', nan):.3f} | "
              f"{a.get('T_mean', nan):.3f} | {a.get('T_sd', nan):.3f} |")]
    for dom, s in report["wt"]["by_domain"].items():
        lines.append(f"| {dom} | {s['n']} | {s['w_mean']:.3f} | {s['w_sd']:.3f} | {s['T_mean']:.3f} | "
                     f"{s['T_sd']:.3f} |")
    lines += ["", "## Coefficients over standardised features (w head: Table 14)", "",
              "| head | " + " | ".join(report["features"]) + " | bias |",
              "|---|" + "---:|" * (len(report["features"]) + 1)]
    for h, c in report["coefficients"].items():
        lines.append(f"| {h} | " + " | ".join(f"{c[f]:+.3f}" for f in report["features"])
                     + f" | {c['bias']:+.3f} |")
    if report.get("feature_correlation"):
        fs = report["features"]
        lines += ["", "## Feature correlations (Pearson, out-of-fold steps; read coefficients with care)", "",
                  "| | " + " | ".join(fs) + " |", "|---|" + "---:|" * len(fs)]
        lines += [f"| {f} | " + " | ".join(f"{report['feature_correlation'][f][g]:+.2f}" for g in fs) + " |"
                  for f in fs]
    if report.get("ablation"):
        lines += ["", "## Held-out comparison and feature ablation (outer folds)", "",
                  "| variant | NLL | recall@1 | steps in trie |", "|---|---:|---:|---:|"]
        for v, m in report["ablation"].items():
            lines.append(f"| {v} | {m['nll']:.4f} | {m['recall_at_1']:.4f} | {m['n_in_trie']} |")
    return "\n".join(lines) + "\n"


def plot_wt(w: Sequence[float], t: Sequence[float], path: str | Path) -> Path:
    """Histograms of the predicted w and T, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(8, 3))
    ax[0].hist(w, bins=40, range=(0, 1))
    ax[0].set_xlabel("w (weight of the empirical prior)")
    ax[1].hist(t, bins=40)
    ax[1].set_xlabel("T (temperature)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def blend_head_report(cfg: Mapping[str, Any], ds: Any, res: Resources, scorer: Any, fit: Any, out: Path,
                      logger: Any) -> dict[str, Any]:
    """A fitted TRACER scorer's head into ``out`` (``blend_head.pt``, ``feature_stats.json``,
    ``history.json``, ``wt_hist.png``), its curves and tables to ``logger``; returns :func:`build_report`'s
    dict, with the outer-fold ablation when ``cfg["folds"]``."""
    head, hist = scorer.head, {**fit.history, "seconds_total_fit": fit.seconds}
    atomic_save(head.state_dict(), out / "blend_head.pt")
    write_json(out / "feature_stats.json", head.feature_stats())
    write_json(out / "history.json", hist)
    for run in hist["runs"]:  # one loss curve per early-stopping fold
        v = run["val_fold"]
        for tl, vl, va in zip(run["train_loss"], run["val_loss"], run["val_acc"]):
            logger.log({f"fold{v}/train_loss": tl, f"fold{v}/val_loss": vl, f"fold{v}/val_recall_at_1": va})
    m = cfg["scorer"]
    ablation = heldout_ablation(ds.trajectories, res, scorer.key, scorer.rendering, m["eps"],
                                m["successful_only"], m["head"], cfg["folds"],
                                cfg["seed"]) if cfg["folds"] else None
    report = build_report(ds.name, head, hist, fit.data, ablation)
    wt = wt_summary(head, fit.data)
    logger.log_image("w_T_hist", plot_wt(wt["w"], wt["T"], out / "wt_hist.png"))
    logger.log_table("w_T", ["domain", "w", "T"], list(zip(wt["domains"], wt["w"], wt["T"])))
    logger.log_table("w_coefficients", ["feature", "coefficient"], list(report["coefficients"]["w"].items()))
    logger.log_summary({f"w_T/{k}": v for k, v in report["wt"]["all"].items()} | {
        "fit/seconds": hist["seconds_fit"], "fit/best_val_loss": hist["best_val_loss"]})
    return report
