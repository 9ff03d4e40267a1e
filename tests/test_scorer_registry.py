"""The scorer registry and ``configs/scorer/*.yaml`` stay in step: one YAML per registered name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tracer.build import build_scorer_cfg
from tracer.scorers import SCORERS, Scorer, build_scorer

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "scorer"
YAMLS = sorted(CONFIGS.glob("*.yaml"))
BASELINES = ("toolnet", "autotool", "hepm", "insight")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def test_every_registered_scorer_has_a_yaml_and_every_yaml_is_registered():
    stems = {p.stem for p in YAMLS}
    assert set(SCORERS) - stems == set(), "registered scorers without configs/scorer/<name>.yaml"
    assert stems - set(SCORERS) == set(), "YAMLs whose scorer is not registered (missing from _MODULES?)"


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_yaml_names_its_own_scorer_and_builds(path):
    cfg = load(path)
    assert cfg.get("name") == path.stem
    scorer = build_scorer_cfg(cfg)
    assert isinstance(scorer, Scorer)
    assert scorer.name == path.stem


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_yaml_opens_with_a_comment(path):
    assert path.read_text().startswith("#")


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_yaml_opens_with_its_command(name):
    first = (CONFIGS / f"{name}.yaml").read_text().splitlines()[0]
    assert first.startswith("#") and f"python evaluate.py scorer={name}" in first


def test_unknown_scorer_error_lists_every_valid_name():
    with pytest.raises(KeyError) as err:
        build_scorer("no_such_scorer")
    for name in SCORERS:
        assert name in str(err.value)
