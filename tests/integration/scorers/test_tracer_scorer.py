"""TracerScorer: the gate, Tracer+G's global set, padding, the learned blend's refusal, every variant a
Scorer, on corpora small enough to work out by hand. Its two paths and its saved index against each
other, and the ranking rules against a reference: test_tracer_equivalence.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from builders import call, fitted_scorer, result

from tracer.build import build_scorer
from tracer.core.steps import extract_all
from tracer.core.types import Registry, Step, Tool, Trajectory
from tracer.scorer_base.protocol import Scorer
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources
from tracer.scorers.tracer import prefix_entropy

EPS = 1e-6


class KeywordUnit:
    """Normalised indicator of the keywords a text contains (the last axis when it has none)."""

    def __init__(self, keywords, name="keywords"):
        self.keywords, self.name, self.dim = tuple(keywords), name, len(keywords) + 1

    def encode(self, texts):
        out = torch.zeros(len(texts), self.dim)
        for i, t in enumerate(texts):
            hits = [j for j, k in enumerate(self.keywords) if k in t.lower()] or [self.dim - 1]
            out[i, hits] = 1.0
        return torch.nn.functional.normalize(out, dim=1)  # [N, dim]


def traj(tid: str, request: str, turns: list[list[str]]) -> Trajectory:
    msgs, i = [], 0
    for t, calls in enumerate(turns):
        msgs.append({"role": "user", "content": request if t == 0 else f"{request} again"})
        for name in calls:
            msgs += [call(name, i), result(i, "")]
            i += 1
    return Trajectory(id=tid, group=tid, domain="test", messages=tuple(msgs))


def live_step(prefix: tuple[str, ...], request: str = "anything") -> Step:
    msgs = [{"role": "user", "content": request}]
    for i, name in enumerate(prefix):
        msgs += [call(name, i), result(i, "")]
    return extract_all([Trajectory("q", "q", "test", tuple(msgs) + (call("zz", 99), result(99, "")))])[-1]


# ---- the gate --------------------------------------------------------------------------------------
GATE_TOOLS = Registry(Tool(n, f"{n} tool")
                      for n in ["f", "p", "q", "r", "x1", "x2", "x3", "x4", "x5", "x6", "zz"])


@pytest.fixture(scope="module")
def gate_scorer():
    # node (f,): six children seen once each, identical contexts -> flat (kappa = 1/6 < 0.2)
    # node (p,): q nine times, r once, identical contexts -> peaked (kappa = 0.9)
    trajs = [traj(f"flat{i}", "flat case", [["f", f"x{i}"]]) for i in range(1, 7)]
    trajs += [traj(f"peak{i}", "peak case", [["p", "q" if i < 9 else "r"]]) for i in range(10)]
    emb = KeywordUnit(["flat", "peak", "tool"])
    res = Resources.build(GATE_TOOLS, emb, device="cpu")
    return fitted_scorer(build_scorer("tracer_fixed"), trajs, res)


def test_gate_fires_on_an_unseen_prefix_and_a_flat_node_but_not_a_peaked_one(gate_scorer):
    steps = [live_step(("q",)), live_step(("f",), "flat case"), live_step(("p",), "peak case")]
    s = gate_scorer.score(steps)
    assert s.diagnostics["in_trie"].tolist() == [False, True, True]
    assert s.fell_back.tolist() == [True, True, False]
    assert s.diagnostics["n_children"].tolist() == [0, 6, 2]
    # flat: six equal scores; peaked: s = log(N/N(S) + eps) + log(1/2 + eps), softmax over two
    s_q, s_r = math.log(0.9 + EPS) + math.log(0.5 + EPS), math.log(0.1 + EPS) + math.log(0.5 + EPS)
    kappa_peak = 1 / (1 + math.exp(s_r - s_q))
    torch.testing.assert_close(s.diagnostics["kappa"], torch.tensor([0.0, 1 / 6, kappa_peak]), atol=1e-6,
                               rtol=0)
    for i, st in enumerate(steps):
        ctx = gate_scorer.res.embedder.encode([gate_scorer.rendering.render(st.context)])[0]
        _, _, _, fell, kappa = gate_scorer.score_one(st, ctx)
        assert fell == bool(s.fell_back[i]) and np.float32(kappa) == s.diagnostics["kappa"][i].item()


def test_fallback_ranks_by_vector_search_alone():
    # an unseen prefix: the ranking is the cosine of the request with each tool's text, ties in registry order
    names = ["t_c", "t_a", "t_b", "t_ab", "t_p", "f", "zz"]
    desc = {"t_c": "cherry", "t_a": "apple", "t_b": "banana", "t_ab": "apple and banana", "t_p": "plain",
            "f": "first", "zz": "last"}
    res = Resources.build(Registry(Tool(n, desc[n]) for n in names),
                          KeywordUnit(["apple", "banana", "cherry"]), device="cpu")
    scorer = build_scorer("tracer_fixed")
    scorer.fit([traj("t1", "plain request", [["f", "zz"]])], res)
    s = scorer.score([live_step(("zz",), "apple and banana please")])
    assert s.fell_back.tolist() == [True] and s.diagnostics["in_trie"].tolist() == [False]
    # cosines: t_ab 1, t_a = t_b = 1/sqrt(2), the rest 0
    assert [names[i] for i in finalize(s, 3).ranking[0].tolist()] == ["t_ab", "t_a", "t_b", "t_c", "t_p",
                                                                      "f", "zz"]


def test_pad_fills_k_from_the_fallback_and_no_pad_presents_only_children(gate_scorer):
    st = live_step(("p",), "peak case")
    q, r = GATE_TOOLS.id("q"), GATE_TOOLS.id("r")
    padded = finalize(gate_scorer.score([st]), 4, pad=True).presented[0]
    assert padded[:2] == (q, r) and len(padded) == 4 and len(set(padded)) == 4
    assert finalize(gate_scorer.score([st]), 4, pad=False).presented[0] == (q, r)
    assert finalize(gate_scorer.score([st]), 1, pad=False).presented[0] == (q,)
    ctx = gate_scorer.res.embedder.encode([gate_scorer.rendering.render(st.context)])[0]
    assert gate_scorer.select_one(st, (ctx,), 4, pad=True) == padded
    assert gate_scorer.select_one(st, (ctx,), 4, pad=False) == (q, r)
    nopad = build_scorer("tracer_fixed", pad=False).attach(gate_scorer.trie, gate_scorer.res)
    assert nopad.select_one(st, (ctx,), 4) == (q, r)  # the scorer's own pad setting


def test_learned_blend_without_a_head_refuses_clearly(gate_scorer):
    learned = build_scorer("tracer").attach(gate_scorer.trie, gate_scorer.res)
    with pytest.raises(RuntimeError, match="no blend head is trained"):
        learned.score([live_step(("p",))])
    with pytest.raises(RuntimeError, match="no blend head is trained"):
        learned.select_one(live_step(("p",)), (torch.zeros(1, gate_scorer.res.embedder.dim),), 3)


def test_every_tracer_variant_is_a_scorer_and_unfitted_ones_say_so():
    for name in ("tracer_fixed", "tracer", "tracer_g"):
        sc = build_scorer(name)
        assert isinstance(sc, Scorer)
        with pytest.raises(RuntimeError, match="not fitted"):
            sc.score([live_step(())])


# ---- Tracer+G --------------------------------------------------------------------------------------
G_TOOLS = Registry(Tool(n, n) for n in "abcxy")


def test_global_set_is_the_three_tools_of_highest_prefix_entropy():
    # states from which each tool was called:
    #   a: () x2 -> H = 0          b: () x1 -> H = 0
    #   x: () x2, (a,) x2 -> ln 2   y: (b,) x1, () x3 -> -(1/4 ln 1/4 + 3/4 ln 3/4)
    #   c: (a, x), (b, y), (y,) once each -> ln 3
    trajs = [traj("t1", "r", [["x"]]), traj("t2", "r", [["x"]]), traj("t3", "r", [["a", "x", "c"]]),
             traj("t4", "r", [["a", "x"]]), traj("t5", "r", [["b", "y", "c"]]), traj("t6", "r", [["y", "c"]]),
             traj("t7", "r", [["y"]]), traj("t8", "r", [["y"]])]
    res = Resources.build(G_TOOLS, KeywordUnit(["a", "b"]), device="cpu")
    sc = build_scorer("tracer_g")
    sc.fit(trajs, res)
    h_y = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    want = {"a": 0.0, "b": 0.0, "c": math.log(3), "x": math.log(2), "y": h_y}
    h = prefix_entropy(sc.trie)
    for name, value in want.items():
        assert h[G_TOOLS.id(name)].item() == pytest.approx(value, abs=1e-6)
    assert sc.global_set == tuple(G_TOOLS.id(n) for n in ("c", "x", "y"))
    st = live_step(("a",))
    presented = finalize(sc.score([st]), 1).presented[0]
    assert presented[0] == G_TOOLS.id("x") and set(sc.global_set) <= set(presented)
    assert len(presented) == 1 + len(set(sc.global_set) - {presented[0]})
    ctx = res.embedder.encode([sc.rendering.render(st.context)])[0]
    assert sc.select_one(st, (ctx,), 1) == presented
