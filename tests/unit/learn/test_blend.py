"""The blend head fitted (tracer/learn/blend_fit.py): the state features it reads, what it learns on
synthetic data where the context or the counts decide, inner-fold leakage and determinism. The head itself
(loss, gradients, bounds): test_blend_head.py.

Synthetic data uses :class:`KeywordEmbedder`, which one-hot encodes known keywords (counts, then
L2-normalised), so similarities and priors can be worked out by hand."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
import torch.nn.functional as F
from builders import BLEND_HEAD as HEAD
from builders import call, fitted_scorer

from tracer.build import build_scorer
from tracer.core.folds import assign_folds, inner_seed
from tracer.core.store import current_snapshot
from tracer.core.types import Registry, Tool, Trajectory
from tracer.learn.blend_fit import HeadConfig, StepData, fit_blend_head, inner_fold_data, train_head
from tracer.learn.blend_head import FEATURES, IGNORE, state_features
from tracer.learn.blend_report import evaluate
from tracer.memory.keys import StateKey
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.resources import Resources, training_steps
from tracer.scorers.tracer import TracerScorer

RENDER = build_scorer("tracer_fixed").rendering


class KeywordEmbedder:
    """Counts of known keywords, L2-normalised; texts with none map to a spare dimension."""

    name = "keywords"

    def __init__(self, vocab):
        self.vocab = {w: i for i, w in enumerate(vocab)}
        self.dim = len(self.vocab) + 1

    def encode(self, texts):
        out = torch.zeros(len(texts), self.dim)
        for i, t in enumerate(texts):
            for tok in re.findall(r"[a-z0-9_]+", t.lower()):
                if tok in self.vocab:
                    out[i, self.vocab[tok]] += 1
            if out[i].sum() == 0:
                out[i, -1] = 1
        return F.normalize(out, dim=1)  # [N, dim]


TOOLS = Registry([Tool("tool_a", "first tool"), Tool("tool_b", "second tool"), Tool("tool_c", "third tool")])


def _traj(i, text, tools, group=None, domain="synthetic"):
    msgs = [{"role": "user", "content": text}]
    for j, t in enumerate(tools):
        msgs += [call(t, j), {"role": "tool", "tool_call_id": f"c{j}", "content": "ok"}]
    return Trajectory(id=f"t{i}", group=group or f"g{i}", domain=domain, messages=tuple(msgs))


def context_decides(n, seed):
    """tool_a 80% of the time, but the request says which: 'alpha' -> tool_a, 'beta' -> tool_b.

    Contexts share 'filler filler', so cos(alpha ctx, beta memory) = 4/5 and L is only mildly
    peaked (0.556 vs 0.444); s = P + L then follows the counts and gets every 'beta' step wrong.
    """
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a = rng.random() < 0.8
        out.append(_traj(f"{seed}-{i}", ("alpha" if a else "beta") + " filler filler",
                         ["tool_a" if a else "tool_b"]))
    return out


def counts_decide(n, seed, n_words=16):
    """tool_a 85% of the time; the request is a random word unrelated to the tool, so L is noise
    (and -13.8 for a child whose few training contexts never used the word)."""
    rng = random.Random(seed)
    return [_traj(f"{seed}-{i}", f"w{rng.randrange(n_words)}",
                  ["tool_a" if rng.random() < 0.85 else "tool_b"])
            for i in range(n)]


def _res(vocab, seed=0):
    return Resources.build(TOOLS, KeywordEmbedder(vocab), device="cpu", seed=seed)


EPS = 1e-6


# ---- the state features ---------------------------------------------------------------------------
def test_state_features_by_hand():
    # one node visited 4 times, children tool_a x3, tool_b x1; context parallel to tool_a's memory
    steps = training_steps([_traj(i, "alpha" if i < 3 else "beta", ["tool_a" if i < 3 else "tool_b"])
                            for i in range(4)], TOOLS)
    emb = KeywordEmbedder(["alpha", "beta"])
    ctx = emb.encode([RENDER.render(s.context) for s in steps])
    trie = ExecutionTrie.build(steps, torch.tensor([0, 0, 0, 1]), ctx, len(TOOLS))
    cb = trie.gather(trie.lookup(steps[:1]), ctx[:1])
    f = state_features(cb)[0]
    h_p = (-(0.75 * torch.log(torch.tensor(0.75)) + 0.25 * torch.log(torch.tensor(0.25)))
           / torch.log(torch.tensor(2.0)))
    torch.testing.assert_close(f, torch.tensor([torch.log(torch.tensor(5.0)), 0.0,
                                                torch.log(torch.tensor(3.0)), float(h_p), 0.0]),
                               atol=1e-4, rtol=0)


# ---- what it learns ------------------------------------------------------------------------------
def _heldout_nll(scorer, steps, res):
    """Mean NLL of the gold under the softmax over the state's children (steps whose gold is a child)."""
    sc = scorer.score(steps)
    gold = res.tool_ids([s.gold for s in steps])
    logp = torch.log_softmax(sc.primary, dim=1)
    keep = torch.isfinite(logp.gather(1, gold[:, None]).squeeze(1))
    return float(-logp.gather(1, gold[:, None]).squeeze(1)[keep].mean()), sc


def _learned_vs_fixed(train, test, res):
    """Held-out NLL of the learned and the fixed blend fitted on ``train``; the learned one's scores."""
    steps = training_steps(test, TOOLS)
    nll_l, sc = _heldout_nll(fitted_scorer(build_scorer("tracer", head=HEAD), train, res), steps, res)
    nll_f, _ = _heldout_nll(fitted_scorer(build_scorer("tracer_fixed"), train, res), steps, res)
    return nll_l, nll_f, sc


def test_context_decides_drives_w_down_and_beats_fixed():
    res = _res(["alpha", "beta", "filler"])
    nll_l, nll_f, sc = _learned_vs_fixed(context_decides(200, seed=1), context_decides(200, seed=2), res)
    # fixed: p(beta step right) = 0.24 -> NLL ~ 0.8*0.18 + 0.2*1.43 = 0.43; learned: w -> 0, T -> floor
    assert nll_f > 0.35
    assert nll_l < 0.5 * nll_f, (nll_l, nll_f)
    assert float(sc.diagnostics["w"].mean()) < 0.2
    assert float(sc.diagnostics["T"].mean()) < 0.3


def test_counts_decide_drives_w_up():
    res = _res([f"w{i}" for i in range(16)])
    nll_l, nll_f, sc = _learned_vs_fixed(counts_decide(300, seed=3), counts_decide(200, seed=4), res)
    assert float(sc.diagnostics["w"].mean()) > 0.8
    assert nll_l < nll_f


# what these two check (save/load, the report) needs a head, not a converged one: 20 epochs, not 500
SHORT = {**HEAD, "max_epochs": 20}


def test_saved_index_with_head_scores_the_same(tmp_path):
    res = _res(["alpha", "beta", "filler"])
    scorer = build_scorer("tracer", head=SHORT)
    scorer.fit(context_decides(60, seed=5), res)
    scorer.save(tmp_path / "index")
    assert (tmp_path / "index" / "snapshots" / current_snapshot(tmp_path / "index")
            / "blend_head.pt").exists()
    again = TracerScorer.load(tmp_path / "index", res.embedder, device="cpu")
    steps = training_steps(context_decides(20, seed=6), TOOLS)
    a, b = scorer.score(steps), again.score(steps)
    torch.testing.assert_close(a.primary, b.primary)
    torch.testing.assert_close(a.diagnostics["w"], b.diagnostics["w"])


def test_fit_reports_the_curves_and_data_and_the_scorer_keeps_neither():
    res = _res(["alpha", "beta", "filler"])
    trajs = context_decides(60, seed=5)
    scorer = build_scorer("tracer", head=SHORT)
    report = scorer.fit(trajs, res)
    assert report.scorer == "tracer" and report.n_trajectories == len(trajs)
    assert (isinstance(report.data, StepData)
            and len(report.data) == report.n_steps == len(training_steps(trajs, TOOLS)))
    assert len(report.history["runs"]) == HEAD["inner_folds"] and report.history["runs"][0]["val_loss"]
    # a deployed scorer holds the trie and the head, never the out-of-fold steps or the loss curves
    assert not any(isinstance(v, (StepData, FitReport)) for v in vars(scorer).values())
    assert scorer.describe()["head_fit"]["best_val_loss"] == report.history["best_val_loss"]


# ---- no leakage ----------------------------------------------------------------------------------
def _unique_context_trajectories():
    """24 groups of 2 trials; each group's request is its own word, so contexts of different groups
    are orthogonal and a step can only match an edge memory that holds its own group's contexts."""
    trajs = []
    for g in range(24):
        tools = ["tool_a", "tool_c"] if g % 3 else ["tool_b", "tool_a"]
        for trial in range(2):
            trajs.append(_traj(f"{g}-{trial}", f"u{g}", tools, group=f"g{g}"))
    return trajs


def test_inner_folds_never_see_their_own_trajectory():
    trajs = _unique_context_trajectories()
    res = _res([f"u{g}" for g in range(24)])
    data = inner_fold_data(trajs, res, StateKey(), RENDER, EPS, True, inner_folds=4, seed=7)
    steps = training_steps(trajs, TOOLS)
    assert len(data) == len(steps)
    rows = data.in_trie
    assert rows.sum() > 0.9 * len(data)
    # own edge-memory contribution absent: every similarity is 0, so L is exactly uniform over the children
    n = data.mask.sum(1, keepdim=True).clamp_min(1)
    uniform = torch.log(1.0 / n + 1e-6).expand_as(data.log_l)
    torch.testing.assert_close(data.log_l[data.mask], uniform[data.mask])
    # own count absent: N(S) counts only the steps of the other inner folds
    fold_of = assign_folds(sorted({s.group for s in steps}), 4, 7)
    for i, s in enumerate(data.steps):
        assert int(data.fold[i]) == fold_of[s.group]
        visits = sum(1 for o in steps if o.prefix == s.prefix and fold_of[o.group] != fold_of[s.group])
        assert float(data.feats[i, 0]) == pytest.approx(torch.log1p(torch.tensor(float(visits))).item())
    # the check can fail: a trie that saw the steps themselves makes L peaked on the gold child
    ctx = res.embed(steps, RENDER)
    leaky = ExecutionTrie.build(steps, res.tool_ids([s.gold for s in steps]), ctx, len(TOOLS))
    cb = leaky.gather(leaky.lookup(steps), ctx)
    assert (cb.log_l.max(1).values > -0.01).all() and (cb.n_children > 1).any()


# ---- determinism ---------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [0, 32])
def test_same_seed_same_weights(batch_size):
    trajs = context_decides(120, seed=8)
    res = _res(["alpha", "beta", "filler"])
    cfg = {**HEAD, "batch_size": batch_size, "max_epochs": 20}  # the same ops each epoch: 20 show it
    a, ha, da = fit_blend_head(trajs, res, StateKey(), RENDER, EPS, True,
                               HeadConfig.from_config(cfg, seed=11))
    b, hb, db = fit_blend_head(trajs, res, StateKey(), RENDER, EPS, True,
                               HeadConfig.from_config(cfg, seed=11))
    assert torch.equal(da.gold, db.gold) and torch.equal(da.fold, db.fold)  # the same inner folds
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert [r["val_loss"] for r in ha["runs"]] == [r["val_loss"] for r in hb["runs"]]
    assert len(ha["runs"]) == 5  # rotated early stopping: one head per inner fold
    json.dumps({k: v for k, v in ha.items()})  # the history is JSON-able


def test_train_head_without_covered_steps_keeps_the_fixed_blend():
    trajs = _unique_context_trajectories()
    res = _res([f"u{g}" for g in range(24)])
    data = inner_fold_data(trajs, res, StateKey(), RENDER, EPS, True, inner_folds=4, seed=0)
    data.gold[:] = IGNORE
    head, hist = train_head(data, HeadConfig.from_config(HEAD, seed=0))
    assert hist["runs"] == [] and hist["n_uncovered"] == len(data)
    w, t = head.wt(data.feats)
    assert torch.allclose(w, torch.full_like(w, 0.5)) and torch.allclose(t, torch.full_like(t, 0.5))


def test_train_head_drop_feature_zeroes_it():
    trajs = _unique_context_trajectories()
    res = _res([f"u{g}" for g in range(24)])
    data = inner_fold_data(trajs, res, StateKey(), RENDER, EPS, True, inner_folds=4, seed=inner_seed(0, 0))
    head, hist = train_head(data, HeadConfig.from_config(HEAD, seed=0, max_epochs=30, drop=("depth",)))
    assert hist["dropped"] == ["depth"]
    assert float(head.w_head.weight.detach()[0, FEATURES.index("depth")]) == 0.0
    m = evaluate(head, data)
    assert 0 <= m["recall_at_1"] <= 1 and m["n_in_trie"] == int(data.in_trie.sum())
