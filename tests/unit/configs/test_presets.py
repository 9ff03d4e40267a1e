"""The presets (tracer/configs/experiment/preset/): what each composes to under Hydra, and the same
without Hydra (tracer.build.load_preset, what Retriever.from_dataset(preset=...) builds)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from tracer.build import CONFIG_DIR, PRESET_GROUPS, build_scorer, load_config, load_preset, names
from tracer.learn.encoders.general import DATASETS, sources_without

# every preset and every config option as tracer.build composes them from the configs of commit 6519e62 with
# its defaults-list merger written by hand, kept to show that replacing it by Hydra's compose API (issue 57)
# changes none of them. After a deliberate change of a config, rewrite it with
# `python tests/unit/configs/test_presets.py` and read the diff.
COMPOSED = Path(__file__).with_name("composed_configs.json")
# dataset=jsonl also overrides the registry group: it composes only inside evaluate.yaml or train.yaml
ENTRY_ONLY = {("dataset", "jsonl")}


@pytest.fixture(scope="module", autouse=True)
def hydra_configs():
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        yield


def evaluate(*overrides: str):
    return compose("evaluate", overrides=list(overrides))


@pytest.mark.parametrize("preset,recipe,inner", [("best", "mnrl", False), ("fast", "mnrl_l3_cut_int8", False),
                                                 ("fastest", "static_contexts", True)])
def test_presets_pick_tracer_plus_over_a_trained_encoder(preset, recipe, inner):
    cfg = evaluate(f"experiment=preset/{preset}")
    # the best preset's candidate model is the mean of 10 MLPs; the others keep the linear one
    ensemble = ["scorer.model=mlp", "scorer.head.members=10"] if preset == "best" else []
    assert cfg.scorer == evaluate("scorer=tracer_plus", *ensemble).scorer
    assert build_scorer(cfg.scorer).members == (10 if preset == "best" else 1)
    # the fastest preset's static encoder trains in seconds, so its inner folds get clean encoders too
    assert cfg.encoder_training == evaluate(
        f"encoder_training={recipe}", f"encoder_training.inner_encoders={str(inner).lower()}"
    ).encoder_training


def test_the_cascade_preset_pairs_the_cascade_scorer_with_its_two_encoders():
    cfg = evaluate("experiment=preset/cascade")
    assert cfg.scorer == evaluate("scorer=cascade").scorer and cfg.scorer.escalate == 0.3
    assert cfg.scorer.fast.head == cfg.scorer.slow.head == evaluate("scorer=tracer_plus").scorer.head
    assert cfg.encoder_training == evaluate("encoder_training=cascade").encoder_training
    assert cfg.encoder_training.slow == evaluate("encoder_training=mnrl_int8").encoder_training


def test_the_cold_start_preset_is_tracer_plus_with_the_novel_slots_over_the_general_encoder():
    cfg = evaluate("experiment=preset/cold_start", "dataset=tau2")
    assert cfg.scorer == evaluate("scorer=tracer_plus", "scorer.zero_shot.novel=3",
                                  "scorer.zero_shot.slots=2", "scorer.zero_shot.novel_from=zero_shot",
                                  "scorer.zero_shot.candidates=true", "scorer.zero_shot.usage=null").scorer
    sc = build_scorer(cfg.scorer)
    assert (sc.zero.novel, sc.zero.slots, sc.zero.candidates, sc.zero.usage) == (3, 2, True, None)
    assert sc.feature_names[-7:-4] == ("zs_score", "zs_rank", "zs_top")  # the fusion's features
    assert sc.feature_names[-4:] == ("req_bm25", "req_top", "req_name", "never_called")  # the request's
    # trained without the dataset under test (leave-one-dataset-out); nothing trained per fold
    assert cfg.embedder == evaluate("embedder=general", "dataset=tau2").embedder
    assert cfg.embedder.exclude == "tau2" and cfg.get("encoder_training") is None
    # outside a run there is no dataset under test: every source trains it
    assert load_config("embedder", "general").exclude is None


@pytest.mark.parametrize("preset", names("experiment/preset"))
def test_a_preset_loads_without_hydra_as_train_py_composes_it(preset):
    cfg = compose("train", overrides=[f"experiment=preset/{preset}", "dataset=jsonl", "seed=3"])
    got = load_preset(preset, seed=3)
    for group in PRESET_GROUPS:
        want = OmegaConf.to_container(cfg[group], resolve=True) if cfg.get(group) is not None else None
        have = OmegaConf.to_container(got[group]) if got[group] is not None else None
        if group == "embedder" and "exclude" in want:
            # train.py's dataset under test, here a directory of yours (no source of the general encoder's);
            # without Hydra there is none: neither leaves a source out
            assert (want.pop("exclude"), have.pop("exclude")) == ("jsonl", None)
            corpora = want["corpora"]
            assert sources_without("jsonl", corpora) == sources_without(None, corpora)
            assert sources_without(None, corpora) == (*corpora, *DATASETS)
        assert have == want, group
    with pytest.raises(KeyError, match="unknown preset 'nope'; valid names: best, cascade, cold_start"):
        load_preset("nope")


def test_a_preset_that_sets_a_group_it_does_not_choose_is_refused(tmp_path, monkeypatch):
    import tracer.build as build_module

    (tmp_path / "experiment" / "preset").mkdir(parents=True)
    bad = tmp_path / "experiment" / "preset" / "bad.yaml"
    bad.write_text("defaults:\n  - override /scorer: tracer_plus\n  - override /embedder: minilm\n"
                   "  - override /encoder_training: null\nencoder_training:\n  lr: 0.1\n")
    monkeypatch.setattr(build_module, "CONFIG_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"bad.yaml: encoder_training is null but the file sets \['lr'\]"):
        load_preset("bad")


def composed_now() -> dict:
    """What tracer.build composes from plain Python: each preset (``load_preset``, seed 3) per group, and each
    option of every group but experiment (``load_config``; a recipe with seed 3, as a run passes it)."""
    presets = {name: {group: None if cfg is None else OmegaConf.to_container(cfg)
                      for group, cfg in load_preset(name, seed=3).items()}
               for name in names("experiment/preset")}
    groups = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name != "experiment")
    options = {f"{group}/{option}": OmegaConf.to_container(
                   load_config(group, option, **({"seed": 3} if group == "encoder_training" else {})))
               for group in groups for option in names(group) if (group, option) not in ENTRY_ONLY}
    return {"presets": presets, "options": options}


def test_every_preset_and_option_composes_to_its_reference(monkeypatch):
    monkeypatch.delenv("TRACER_MIRRORS", raising=False)  # paths.mirrors: its default, data/mirrors
    reference = json.loads(COMPOSED.read_text())
    assert sorted(reference["presets"]) == ["best", "cascade", "cold_start", "fast", "fastest", "zero_shot"]
    assert composed_now() == reference


if __name__ == "__main__":
    os.environ.pop("TRACER_MIRRORS", None)
    COMPOSED.write_text(json.dumps(composed_now(), indent=2) + "\n")
