"""The scorer YAMLs (``tracer/configs/scorer/*.yaml``) are the scorer catalogue: one per scorer, named after
its file, opening with the command that runs it, built by ``build_scorer(name)`` with overrides merged in."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from tracer.build import CONFIG_DIR, build_scorer, names
from tracer.core.locate import locate
from tracer.scorer_base.persist import saved_config
from tracer.scorer_base.protocol import Scorer
from tracer.scorers.tracer import TracerScorer
from tracer.scorers.tracer_plus import TracerPlusScorer

YAMLS = sorted((CONFIG_DIR / "scorer").glob("*.yaml"))
BASELINES = ("toolnet", "autotool", "hepm", "insight")


def test_every_scorer_of_the_readme_has_a_yaml():
    assert names("scorer") == sorted(["tracer_plus", "tracer", "tracer_fixed", "tracer_g", "llm_only",
                                      "vector", "toolnet", "autotool", "hepm", "insight", "cascade", "bm25",
                                      "hybrid", "tool2vec"])


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_yaml_names_its_own_scorer_and_builds(path: Path):
    cfg = yaml.safe_load(path.read_text())
    assert cfg["name"] == path.stem and cfg["_target_"].startswith("tracer.scorers.")
    scorer = build_scorer(path.stem)
    assert isinstance(scorer, Scorer) and scorer.name == path.stem


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_yaml_opens_with_its_command(path: Path):
    assert f"python evaluate.py scorer={path.stem}" in path.read_text().splitlines()[0]


def test_overrides_merge_into_the_yaml_key_by_key():
    yaml_head = yaml.safe_load((CONFIG_DIR / "scorer" / "tracer_plus.yaml").read_text())["head"]
    scorer = build_scorer("tracer_plus", head={"max_epochs": 3}, keys=["prefix"])
    assert isinstance(scorer, TracerPlusScorer)
    assert scorer.head_cfg == {**yaml_head, "max_epochs": 3}         # the rest of head: the YAML's
    assert [k.label for k in scorer.keys] == ["prefix"]                # a list is replaced


def test_unknown_scorer_error_lists_every_valid_name():
    with pytest.raises(KeyError) as err:
        build_scorer("no_such_scorer")
    for name in names("scorer"):
        assert name in str(err.value)


def test_nested_head_overrides_merge_key_by_key_for_tracer():
    yaml_head = yaml.safe_load((CONFIG_DIR / "scorer" / "tracer.yaml").read_text())["head"]
    scorer = build_scorer("tracer", head={"max_epochs": 1})
    assert scorer.head_cfg == {**yaml_head, "max_epochs": 1}
    assert scorer.head_config.max_epochs == 1 and scorer.head_config.patience == yaml_head["patience"]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_every_yaml_key_is_a_required_keyword_of_its_class(path: Path):
    """The YAML is the one place for a scorer's values: no Python default repeats one, no catch-all hides a
    typo."""
    cfg = yaml.safe_load(path.read_text())
    params = inspect.signature(locate(cfg["_target_"])).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    # defaults: the cascade's stages, composed from tracer_plus.yaml
    for key in set(cfg) - {"_target_", "defaults"}:
        assert params[key].kind is params[key].KEYWORD_ONLY and params[key].default is params[key].empty, key
    if "memory" in cfg:  # insight: the memory node is built from its own _target_, every key required too
        memory = inspect.signature(locate(cfg["memory"]["_target_"])).parameters
        assert all(memory[k].default is memory[k].empty for k in set(cfg["memory"]) - {"_target_"})
    with pytest.raises(TypeError, match="no_such_key"):
        build_scorer(path.stem, no_such_key=1)


def test_saved_config_missing_keys_come_from_the_yaml():
    """An index saved before a key existed (here: most of tracer's head) loads with the YAML's values."""
    yaml_cfg = yaml.safe_load((CONFIG_DIR / "scorer" / "tracer.yaml").read_text())
    old = {"name": "tracer", "blend": "learned", "head": {"max_epochs": 7}}
    cfg = saved_config(old, "tracer")
    assert cfg == {**{k: v for k, v in yaml_cfg.items() if k != "_target_"},
                   "head": {**yaml_cfg["head"], "max_epochs": 7}}
    assert TracerScorer(**cfg).head_config.max_epochs == 7
