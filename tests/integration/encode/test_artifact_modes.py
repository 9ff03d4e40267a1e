"""Cached encoder artifacts are readable as the umask says (issue 56, defect 15), as docs/storage.md promises
for every file tracer creates: safetensors writes ``model.safetensors`` through a 0600 temporary, so a static
table or a fine-tuned checkpoint used to be 0600 under umask 022 (unreadable to the group sharing the cache)
while every other file of the folder was 0644."""

from __future__ import annotations

import os

import pytest
from builders import TINY_TOOLS, tiny_bert, tiny_trajectories

from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.encode.static import distilled
from tracer.learn.encoders import TrainConfig, finetuned, training_pairs

pytest.importorskip("model2vec")

RECIPE = TrainConfig(batch_size=6, lr=1e-3, warmup=0.1, epochs=1, max_seq_length=48, seed=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_built_artifacts_follow_the_umask(tiny, tmp_path, umask, file_mode, dir_mode):
    pairs = training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), ContextRendering(join_users=True))
    old = os.umask(umask)
    try:
        table = distilled(tiny, None, tmp_path)
        checkpoint = finetuned(pairs, RECIPE, tiny, tmp_path, device="cpu")
    finally:
        os.umask(old)
    for artifact in (table, checkpoint):
        entries = [artifact, *artifact.rglob("*")]
        assert any(p.name == "model.safetensors" for p in entries), artifact  # the file safetensors wrote
        modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in entries}
        want = {str(p.relative_to(tmp_path)): oct(dir_mode if p.is_dir() else file_mode) for p in entries}
        assert modes == want
