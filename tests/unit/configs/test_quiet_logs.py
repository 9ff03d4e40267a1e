"""evaluate.py and train.py print their result, not third-party INFO lines: both configs set the root logger
of Hydra's job and of Hydra itself to WARNING, and an override brings INFO back."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from tracer.build import CONFIG_DIR


@pytest.fixture(autouse=True)
def hydra_dir():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("name", ["evaluate", "train"])
def test_third_party_info_lines_are_off_unless_asked_for(name):
    cfg = compose(name, return_hydra_config=True)
    assert cfg.hydra.job_logging.root.level == "WARNING"
    assert cfg.hydra.hydra_logging.root.level == "WARNING"
    assert cfg.hydra.job_logging.loggers.bm25s.level == "WARNING"       # it sets DEBUG on itself
    assert cfg.hydra.job_logging.root.handlers  # Hydra's own handlers are kept: only the level changes
    loud = compose(name, overrides=["hydra.job_logging.root.level=INFO"], return_hydra_config=True)
    assert loud.hydra.job_logging.root.level == "INFO"
