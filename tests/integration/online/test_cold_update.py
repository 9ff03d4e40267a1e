"""A cold tracer_plus index (no logs) learning its first conversation online, on tau2's real registry and the
real MiniLM: the update gives the tries their first calls, but no fit has trained the candidate model yet, so
the zero-shot fusion must go on serving where the logs hold no evidence, until a refit trains the model and
the guard judges it."""

from __future__ import annotations

import pytest

from tracer.build import build_scorer
from tracer.core.steps import extract_all
from tracer.data import load_dataset
from tracer.data.paths import repo_root
from tracer.online.updater import Updater
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources

TAU2 = repo_root() / ".." / "shared" / "datasets" / "tau2"

pytestmark = pytest.mark.skipif(not TAU2.is_dir(), reason="shared datasets not present")


@pytest.mark.parametrize("usage", [1.0, None])
def test_one_update_keeps_a_cold_index_serving_its_zero_shot_fusion(minilm, usage):
    """With usage vectors (the default) a called tool's vector input moves, and the fusion is by rank, so the
    other tools' order may move by a place too: the presented sets stay. Without them the ranking stays."""
    ds = load_dataset("tau2", domains=("retail", "airline"))
    res = Resources.build(ds.registry, minilm, device="cpu", seed=0)
    zero_shot = {**build_scorer("tracer_plus").zero.config(), "usage": usage}
    scorer = build_scorer("tracer_plus", zero_shot=zero_shot)
    scorer.fit([], res)
    assert scorer.cold and scorer.zero_shot_only
    retail = [t for t in ds.trajectories if t.domain.endswith("retail")]
    airline = [t for t in ds.trajectories if t.domain.endswith("airline")]
    assert retail and airline
    unrelated = extract_all(airline[:5])                      # the logs will hold retail calls only
    before = finalize(scorer.score(unrelated), 5)
    Updater(scorer, refit_every=None, background=False).update(retail[:1])
    assert not scorer.cold                                    # the tries hold the conversation's calls
    assert scorer.zero_shot_only and scorer.history["serves"] == "zero_shot"
    after = finalize(scorer.score(unrelated), 5)
    assert [set(p) for p in after.presented] == [set(p) for p in before.presented]
    if usage is None:
        assert after.ranking.tolist() == before.ranking.tolist()
    contexts = scorer.embed(unrelated)                        # the live path agrees
    assert [scorer.select_one(s, tuple(c[i:i + 1] for c in contexts), 5)
            for i, s in enumerate(unrelated)] == after.presented
