"""evaluate.py and train.py print their result, not third-party INFO lines: both configs set the root logger
of Hydra's job and of Hydra itself to WARNING, and an override brings INFO back; a library that sets its own
logger's level on import (bm25s) is handed back to that configuration."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
    assert cfg.hydra.job_logging.root.handlers  # Hydra's own handlers are kept: only the level changes
    loud = compose(name, overrides=["hydra.job_logging.root.level=INFO"], return_hydra_config=True)
    assert loud.hydra.job_logging.root.level == "INFO"


BM25_BUILD = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=getattr(logging, sys.argv[1]), stream=sys.stdout, format="%(name)s %(message)s")
    from tracer.scorers.bm25 import BM25Scorer
    from types import SimpleNamespace
    from tracer.core.types import Registry, Tool
    tools = Registry([Tool(name="ls", description="list the files of a folder", parameters={})])
    BM25Scorer(name="bm25", context={}, k1=1.5, b=0.75).fit([], SimpleNamespace(registry=tools))
""")


@pytest.mark.parametrize(("level", "printed"),
                         [("WARNING", []), ("DEBUG", ["bm25s Building index from tokens"])])
def test_bm25s_logs_at_the_level_the_application_chose(level, printed):
    # bm25s sets its logger to DEBUG on import: at WARNING an index build printed a line in every run
    out = subprocess.run([sys.executable, "-c", BM25_BUILD, level], capture_output=True, text=True,
                         check=True)
    assert [line for line in out.stdout.splitlines() if line.startswith("bm25s")] == printed
