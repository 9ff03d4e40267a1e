"""The presets (tracer/configs/experiment/preset/): what each composes to under Hydra, and the same
from plain Python (tracer.build.load_preset, what Retriever.from_dataset(preset=...) builds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from tracer.build import CONFIG_DIR, PRESET_GROUPS, build_scorer, load_config, load_preset, names
from tracer.learn.encoders.general import DATASETS, sources_without

# every preset and every config option as tracer.build composed them from the configs of commit 1625619 with
# its defaults-list merger written by hand, before Hydra's compose API replaced it (issue 57): the
# replacement gave the same file, byte for byte. After a deliberate change of a config, rewrite it with
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
    # the best preset's candidate model is the mean of 10 MLPs, and its toolkit in use's never-called tools
    # get no wider top than the others'; the other presets keep the linear model and the wider top of 5
    best = ["scorer.model=mlp", "scorer.head.members=10", "scorer.zero_shot.novel_toolkit=0"]
    assert cfg.scorer == evaluate("scorer=tracer_plus", *(best if preset == "best" else [])).scorer
    scorer = build_scorer(cfg.scorer)
    assert scorer.members == (10 if preset == "best" else 1)
    assert scorer.zero.novel_toolkit == (0 if preset == "best" else 5)
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
                                  "scorer.zero_shot.candidates=true", "scorer.zero_shot.usage=null",
                                  "scorer.zero_shot.novel_toolkit=0").scorer
    sc = build_scorer(cfg.scorer)
    assert (sc.zero.novel, sc.zero.slots, sc.zero.candidates, sc.zero.usage) == (3, 2, True, None)
    assert sc.zero.novel_toolkit == 0
    request = sc.request.features  # the request's features close the row, after the fusion's
    assert request == ("req_bm25", "req_top", "req_name", "never_called",
                       "req_cos", "req_open", "req_open_top")
    assert sc.feature_names[-len(request) - 3:] == ("zs_score", "zs_rank", "zs_top", *request)
    # trained without the dataset under test (leave-one-dataset-out); nothing trained per fold
    assert cfg.embedder == evaluate("embedder=general", "dataset=tau2").embedder
    assert cfg.embedder.exclude == "tau2" and cfg.get("encoder_training") is None
    # outside a run there is no dataset under test: every source trains it
    assert load_config("embedder", "general").exclude is None


@pytest.mark.parametrize("preset", names("experiment/preset"))
def test_a_preset_loads_from_plain_python_as_train_py_composes_it(preset):
    cfg = compose("train", overrides=[f"experiment=preset/{preset}", "dataset=jsonl", "seed=3"])
    got = load_preset(preset, seed=3)
    for group in PRESET_GROUPS:
        want = OmegaConf.to_container(cfg[group], resolve=True) if cfg.get(group) is not None else None
        have = OmegaConf.to_container(got[group]) if got[group] is not None else None
        if group == "embedder" and "exclude" in want:
            # train.py's dataset under test, here a directory of yours (no source of the general encoder's);
            # from plain Python there is none: neither leaves a source out
            assert (want.pop("exclude"), have.pop("exclude")) == ("jsonl", None)
            corpora = want["corpora"]
            assert sources_without("jsonl", corpora) == sources_without(None, corpora)
            assert sources_without(None, corpora) == (*corpora, *DATASETS)
        assert have == want, group


@pytest.mark.parametrize("preset", names("experiment/preset"))
def test_a_preset_changes_only_the_groups_load_preset_returns(preset):
    """load_preset returns the nodes of PRESET_GROUPS: a preset that set anything else (k, folds, the
    registry) would run differently under train.py than under Retriever.from_dataset(preset=...)."""
    cfg = compose("train", overrides=[f"experiment=preset/{preset}"])
    plain_train = compose("train", overrides=["~experiment"])
    assert {key: cfg[key] for key in cfg if key not in PRESET_GROUPS} == {
        key: plain_train[key] for key in plain_train if key not in PRESET_GROUPS}


# an app as train.py and evaluate.py are: each job of a sweep composes the scorer of a preset and a config
EVALUATE_LIKE = textwrap.dedent("""
    import hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from tracer.build import CONFIG_DIR, load_config, load_preset

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
    def main(cfg):
        app = GlobalHydra.instance().hydra
        best, fast = load_preset("best")["scorer"], load_config("embedder", "fast")
        print(cfg.k, best.head.members, fast.variant, HydraConfig.get().job.name,
              GlobalHydra.instance().hydra is app)

    main()
""")


def test_presets_load_inside_a_hydra_app_and_leave_its_initialisation_as_it_was(tmp_path):
    """Hydra holds one initialisation per process; inside train.py's or evaluate.py's app load_preset and
    load_config compose at tracer/configs and put the app's back, its job name kept for the next job."""
    script = tmp_path / "evaluate_like.py"
    script.write_text(EVALUATE_LIKE)
    sweep = [sys.executable, str(script), "-m", "k=3,5", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    run = subprocess.run(sweep, capture_output=True, text=True, check=True)
    assert run.stdout.splitlines()[-2:] == ["3 10 int8 evaluate_like True", "5 10 int8 evaluate_like True"]


def test_an_unknown_preset_is_named_with_the_valid_ones():
    with pytest.raises(KeyError) as err:
        load_preset("nope")
    valid = "best, cascade, cold_start, fast, fastest, zero_shot"
    assert err.value.args == (f"unknown preset 'nope'; valid names: {valid}",)


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
