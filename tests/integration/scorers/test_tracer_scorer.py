"""TracerScorer: the gate, Tracer+G's global set, padding, the learned blend's refusal, the single-step
path against the batched one, persistence (bit-identical after load; a wrong embedder is refused),
and the ranking rules (one definition in tracer.scoring.ranking) against a two-stable-sorts reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import call, fitted_scorer, result

from tracer.build import build_scorer
from tracer.core.folds import kfold
from tracer.core.steps import extract_all
from tracer.core.store import current_snapshot
from tracer.core.types import Registry, Step, Tool, Trajectory
from tracer.encode.index import ToolIndex
from tracer.memory.keys import StateKey
from tracer.memory.trie import ExecutionTrie
from tracer.scorers.tracer import TracerScorer, prefix_entropy
from tracer.scoring.protocol import Scorer
from tracer.scoring.ranking import finalize, rank
from tracer.scoring.records import Scores
from tracer.scoring.resources import Resources, training_steps
from tracer.scoring.single_step import finalize_one, rank_one

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


class NoTextEmbedder:
    """For indexes built from precomputed vectors: a name and a dim, never encodes."""

    def __init__(self, dim, name="random-unit"):
        self.dim, self.name = dim, name

    def encode(self, texts):
        raise AssertionError("this test never embeds text")


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


# ---- the single-step path against the batched one, on BFCL ------------------------------------------
D = 32


@pytest.fixture(scope="module")
def bfcl_split():
    from tracer.data import load_dataset

    ds = load_dataset("bfcl", execute=False)
    split = kfold(ds.trajectories, 5, seed=0)[0]
    train, test = training_steps(split.train, ds.registry), training_steps(split.test, ds.registry)
    g = torch.Generator().manual_seed(0)
    unit = lambda n: torch.nn.functional.normalize(torch.randn(n, D, generator=g), dim=1)
    res = Resources(ds.registry, NoTextEmbedder(D), ToolIndex(ds.registry.names, unit(len(ds.registry))),
                    "cpu")
    return res, train, unit(len(train)), test, unit(len(test))


def fitted(bfcl_split, name: str, **cfg) -> TracerScorer:
    res, train, train_ctx, _, _ = bfcl_split
    sc = build_scorer(name, **cfg)
    trie = ExecutionTrie.build(train, res.tool_ids([s.gold for s in train]), train_ctx, len(res.registry),
                               sc.key, sc.eps)
    return sc.attach(trie, res)


CONFIGS = [("tracer_fixed", {}), ("tracer_fixed", {"pad": False}), ("tracer_g", {}),
           ("tracer_fixed", {"key": {"kind": "last_n", "n": 2, "cross_turn": True}, "tau": 0.05})]


@pytest.mark.parametrize("name, cfg", CONFIGS)
def test_single_step_path_equals_the_batched_path(bfcl_split, name, cfg):
    sc = fitted(bfcl_split, name, **cfg)
    _, _, _, test, test_ctx = bfcl_split
    scores = sc.score_embedded(test, test_ctx)
    assert 0 < int(scores.fell_back.sum()) < len(test)  # both branches of the gate are exercised
    ctx = test_ctx.numpy()
    for k in (1, 5):
        sel = finalize(scores, k, sc.pad)
        for i, st in enumerate(test):
            assert sc.select_one(st, (ctx[i],), k) == sel.presented[i], (k, i)
    ranking = finalize(scores, 5).ranking
    for i, st in enumerate(test):
        assert np.array_equal(sc.rank_one(st, (ctx[i],)), ranking[i].numpy()), i
        assert np.array_equal(sc.rank_one(st, (ctx[i],), top=7), ranking[i, :7].numpy())
        ch, s, fb, fell, kappa = sc.score_one(st, ctx[i])
        assert (fell == bool(scores.fell_back[i])
                and np.float32(kappa) == scores.diagnostics["kappa"][i].item())
        assert np.array_equal(fb, scores.fallback[i].numpy())
        assert np.array_equal(s, scores.primary[i, ch.tool].numpy())


# ---- persistence -----------------------------------------------------------------------------------
def scores_identical(a: Scores, b: Scores) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("primary", "fallback", "fell_back")) \
        and a.diagnostics.keys() == b.diagnostics.keys() \
        and all(torch.equal(a.diagnostics[d], b.diagnostics[d]) for d in a.diagnostics) \
        and a.always_present == b.always_present


def test_a_loaded_index_is_bit_identical(bfcl_split, tmp_path):
    sc = fitted(bfcl_split, "tracer_g", key={"kind": "prefix", "cross_turn": True})
    _, _, _, test, test_ctx = bfcl_split
    sc.save(tmp_path / "index")
    again = TracerScorer.load(tmp_path / "index", NoTextEmbedder(D), device="cpu")
    assert again.config() == sc.config() and again.global_set == sc.global_set
    a, b = sc.score_embedded(test, test_ctx), again.score_embedded(test, test_ctx)
    assert scores_identical(a, b)
    assert torch.equal(finalize(a, 5).ranking, finalize(b, 5).ranking)
    ctx = test_ctx.numpy()
    assert all(sc.select_one(st, (ctx[i],), 5) == again.select_one(st, (ctx[i],), 5)
               for i, st in enumerate(test))
    # saving over an existing index publishes a new snapshot and leaves no temporary directories
    sc.save(tmp_path / "index")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    meta = json.loads((snapshot_of(tmp_path / "index") / "meta.json").read_text())
    assert meta["embedder"] == {"name": "random-unit", "dim": D} and meta["format_version"] == 2


def test_loading_with_another_embedder_or_format_is_refused(bfcl_split, tmp_path):
    sc = fitted(bfcl_split, "tracer_fixed")
    sc.save(tmp_path / "index")
    with pytest.raises(ValueError, match="built with embedder 'random-unit' \\(dim 32\\), not 'other'"):
        TracerScorer.load(tmp_path / "index", NoTextEmbedder(D, name="other"))
    with pytest.raises(ValueError, match="dim 32\\), not 'random-unit' \\(dim 16\\)"):
        TracerScorer.load(tmp_path / "index", NoTextEmbedder(16))
    meta_path = snapshot_of(tmp_path / "index") / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "format_version": 1}))
    with pytest.raises(ValueError, match="format version 1 is not 2"):
        TracerScorer.load(tmp_path / "index", NoTextEmbedder(D), verify="none")  # "sha256" refuses the edit
    with pytest.raises(FileNotFoundError, match="no saved index"):
        TracerScorer.load(tmp_path / "nothing", NoTextEmbedder(D))


def snapshot_of(index: Path) -> Path:
    return index / "snapshots" / current_snapshot(index)


# ---- ranking rules ---------------------------------------------------------------------------------
def two_stable_sorts(primary, fallback, fell_back):
    """The reference: by primary (desc), then fallback (desc), then registry position."""
    by_fallback = torch.sort(fallback, dim=1, descending=True, stable=True).indices
    prim = torch.nan_to_num(torch.where(fell_back[:, None], torch.zeros_like(primary), primary),
                            nan=float("-inf"))
    order = torch.sort(prim.gather(1, by_fallback), dim=1, descending=True, stable=True).indices
    return by_fallback.gather(1, order)


def test_rank_and_its_single_step_version_follow_the_reference_with_ties_and_infinities():
    g = torch.Generator().manual_seed(0)
    vals = torch.tensor([0.0, -0.0, 1.0, -1.0, float("-inf"), float("inf"), 0.5, float("nan"), 2.0])
    for trial in range(120):
        b, n = 6, 700 if trial % 40 == 0 else int(torch.randint(1, 30, (1,), generator=g))
        prim = vals[torch.randint(0, len(vals), (b, n), generator=g)]
        prim[torch.rand(b, n, generator=g) < 0.5] = float("-inf")
        fb = vals[torch.randint(0, len(vals) - 1, (b, n), generator=g)] if trial % 2 else \
            torch.randn(b, n, generator=g).round(decimals=1)
        fell = torch.rand(b, generator=g) < 0.3
        ref = two_stable_sorts(prim, fb, fell)
        assert torch.equal(rank(prim, fb, fell), ref), trial
        scores = Scores(primary=prim, fallback=fb, fell_back=fell, always_present=(0, n - 1))
        for i in range(b):
            prop = torch.nonzero(prim[i] != float("-inf")).squeeze(1)
            args = (prop.numpy(), prim[i, prop].numpy(), fb[i].numpy(), bool(fell[i]))
            assert np.array_equal(rank_one(*args), ref[i].numpy()), (trial, i)
            assert np.array_equal(rank_one(*args, top=3), ref[i, :3].numpy()), (trial, i)
            for k, pad in ((1, True), (3, False), (5, True)):
                assert finalize_one(*args, k, pad, (0, n - 1)) == finalize(scores, k, pad).presented[i]


def test_attach_refuses_a_trie_of_another_shape(bfcl_split):
    res = bfcl_split[0]
    with pytest.raises(ValueError, match="trie is over 3 tools"):
        build_scorer("tracer_fixed").attach(ExecutionTrie(3, D), res)
    with pytest.raises(ValueError, match="built with key"):
        build_scorer("tracer_fixed").attach(ExecutionTrie(len(res.registry), D, StateKey("last_n", 2)), res)


def test_single_step_path_equals_the_batched_path_on_a_large_registry():
    # 3,000 tools: the single-step path finds the fallback's leaders with a float32 pass and rescores them
    n, d = 3000, 24
    g = torch.Generator().manual_seed(3)
    unit = lambda m: torch.nn.functional.normalize(torch.randn(m, d, generator=g), dim=1)
    names = [f"t{i}" for i in range(n)]
    registry = Registry(Tool(x) for x in names)
    res = Resources(registry, NoTextEmbedder(d), ToolIndex(names, unit(n)), "cpu")
    rng = np.random.default_rng(0)
    states, tools = [], []
    for _ in range(3000):
        first = int(rng.integers(0, 40))
        nxt = int(rng.integers(0, n)) if rng.random() < 0.5 else first + 1
        states += [(), (names[first],)]
        tools += [first, nxt]
    trie = ExecutionTrie(n, d).update(states, torch.tensor(tools), unit(len(states)))
    sc = build_scorer("tracer_fixed", tau=0.3).attach(trie, res)
    steps = [Step("q", "q", 0, len(p), p, p, "", ()) for p in [(), (names[3],), ("unseen",)] * 20]
    ctx = unit(len(steps))
    scores = sc.score_embedded(steps, ctx)
    assert 0 < int(scores.fell_back.sum()) < len(steps)
    for k in (1, 5, 12):
        sel = finalize(scores, k)
        for i, st in enumerate(steps):
            assert sc.select_one(st, (ctx[i].numpy(),), k) == sel.presented[i]
            assert np.array_equal(sc.rank_one(st, (ctx[i].numpy(),), top=k), sel.ranking[i, :k].numpy())
