"""The scorer YAMLs (``tracer/configs/scorer/*.yaml``) are the scorer catalogue: one per scorer, named after
its file, opening with the command that runs it, built by ``build_scorer(name)`` with overrides merged in."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tracer.build import CONFIG_DIR, build_scorer, names
from tracer.scorers.tracer_plus import TracerPlusScorer
from tracer.scoring.protocol import Scorer

YAMLS = sorted((CONFIG_DIR / "scorer").glob("*.yaml"))
BASELINES = ("toolnet", "autotool", "hepm", "insight")


def test_every_scorer_of_the_readme_has_a_yaml():
    assert names("scorer") == sorted(["tracer_plus", "tracer", "tracer_fixed", "tracer_g", "llm_only", "vector",
                                      "toolnet", "autotool", "hepm", "insight"])


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
