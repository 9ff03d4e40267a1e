"""Where train.py's and evaluate.py's rank writes (tracer/jobs/ranks.py)."""

import pytest
from omegaconf import OmegaConf

from tracer.jobs import ranks


def test_the_single_process_writes_into_the_run_directory_with_its_logger(tmp_path):
    cfg = OmegaConf.create({"logger": {"name": "wandb"}})
    with ranks.rank_run_dir(tmp_path / "run", cfg) as out:
        assert out == tmp_path / "run"
    assert cfg.logger.name == "wandb"


def test_another_rank_writes_into_a_scratch_directory_it_removes_even_on_error(tmp_path, monkeypatch):
    monkeypatch.setattr(ranks, "is_writer", lambda: False)  # rank 1 of a torchrun job
    cfg = OmegaConf.create({"logger": {"name": "wandb"}})
    failing = pytest.raises(RuntimeError, match="the job failed")
    with failing, ranks.rank_run_dir(tmp_path / "run", cfg) as out:
        assert out != tmp_path / "run" and out.is_dir() and cfg.logger is None
        (out / "metrics.json").write_text("{}")
        raise RuntimeError("the job failed")
    assert not out.exists() and not (tmp_path / "run").exists()
