"""What is trained gives the same bits whichever vector instructions the processor offers: run in fresh
processes whose ATen, MKL, OpenBLAS and NumPy kernels are held to AVX2, or to no vector extension at all,
and in one left to the host's best.

- tracer_plus's MLP candidate model: its float32 weights are bit-identical (fit.py's ``_wide`` fits in
  float64; in float32 the non-convex fit grows the kernels' last bits into other rankings).
- The static encoder: model2vec's distillation (a float16 table) and the table trained from it are
  bit-identical (tracer/encode/static.py runs the forward pass and the PCA in float64, the trainer keeps the
  table in float64; in float32 ~3% of the distilled entries move by a float16 unit).

Real components: torch's CPU kernels under ``ATEN_CPU_CAPABILITY`` and ``MKL_ENABLE_INSTRUCTIONS``, NumPy's
under ``NPY_DISABLE_CPU_FEATURES``, OpenBLAS under ``OPENBLAS_CORETYPE``, model2vec, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from builders import ROOT, tiny_bert

# one fresh interpreter per instruction set, a static table distilled and trained in each: a long run by
# nature, in make test-all; the same-seed determinism within one process is checked fast in
# tests/unit/learn/test_training_stack.py
pytestmark = pytest.mark.slow

# fits a 2-member ensemble on seeded random candidates and prints a digest of its float32 weights
FIT = textwrap.dedent("""
    import hashlib, numpy as np, torch
    from tracer.learn.trainer import TrainConfig
    from tracer.scorers.tracer_plus.fit import train_model
    from tracer.scorers.tracer_plus.inner_folds import CandidateData
    # numpy draws the data: torch's normal_ has its own vectorised kernels, and the data must not differ
    rng = np.random.default_rng(0)
    S, C, F = 300, 16, 12
    feats = torch.from_numpy(rng.normal(size=(S, C, F)) * rng.uniform(size=F) * 5).float()  # [S, C, F]
    mask = torch.from_numpy(rng.uniform(size=(S, C)) < 0.8)
    mask[:, 0] = True
    noise = torch.from_numpy(rng.normal(size=(S, C))).float()
    gold = (feats[..., :4].sum(-1) + noise).masked_fill(~mask, -1e9).argmax(1)
    data = CandidateData(feats, mask, gold, torch.arange(S) % 4)
    cfg = TrainConfig(lr=0.01, weight_decay=1e-4, max_epochs=60, patience=60, batch_size=0, seed=0)
    model, hist = train_model(data, "mlp", 32, cfg, members=2)
    sd = model.state_dict()
    assert all(t.dtype == torch.float32 for t in sd.values()), [t.dtype for t in sd.values()]
    h = hashlib.sha256()
    for name in sorted(sd):
        h.update(sd[name].numpy().tobytes())
    print("mlp", torch.backends.cpu.get_cpu_capability(), hist["best_epoch"], h.hexdigest())
""")

# distils the tiny BERT (argv[1]) into a fresh folder (argv[2]), trains a static table from it on the tiny
# trajectories and prints digests of both tables
STATIC = textwrap.dedent("""
    import hashlib, sys, torch
    from builders import TINY_TOOLS, tiny_trajectories
    from model2vec import StaticModel
    from tracer.core.context import ContextRendering
    from tracer.core.types import Registry
    from tracer.encode.static import distilled
    from tracer.learn.encoders import TrainConfig
    from tracer.learn.encoders.pairs import training_pairs
    from tracer.learn.encoders.static import train_static
    base = StaticModel.from_pretrained(str(distilled(sys.argv[1], 16, sys.argv[2]) / "model"))
    pairs = training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), ContextRendering(join_users=True))
    cfg = TrainConfig(batch_size=6, lr=2e-2, warmup=0.0, epochs=10, max_seq_length=512, seed=0)
    table, _ = train_static(pairs, cfg, base)
    assert base.embedding.dtype.name == "float16" and table.dtype.name == "float32"
    print("static", torch.backends.cpu.get_cpu_capability(), *(hashlib.sha256(t.tobytes()).hexdigest()
                                                               for t in (base.embedding, table)))
""")

PINS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")
NUMPY_NONE = "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR AVX2 FMA3 F16C AVX"
LEVELS = [{}, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
          {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
           "OPENBLAS_CORETYPE": "Nehalem", "NPY_DISABLE_CPU_FEATURES": NUMPY_NONE}]


def run_under(pins: dict, tiny: Path, encoders: Path) -> dict[str, list[str]]:
    """Both scripts in one fresh interpreter with the kernels held to ``pins``: each one's printed words."""
    env = {k: v for k, v in os.environ.items() if k not in PINS}
    proc = subprocess.run([sys.executable, "-c", FIT + STATIC, str(tiny), str(encoders)], check=False,
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**env, **pins, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
                               "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {words[0]: words[1:] for words in map(str.split, proc.stdout.splitlines()) if words}


@pytest.fixture(scope="module")
def levels(tmp_path_factory) -> list[dict[str, list[str]]]:
    """What each level printed, the host's best first, no vector extension last (an interpreter each, in
    turn). On a host whose best is AVX2 the host's level is the AVX2 level, so it runs once."""
    tmp = tmp_path_factory.mktemp("levels")
    # 4,000 word pieces: 64k distilled entries to compare (in float32 ~3% of them moved: thousands)
    tiny = tiny_bert(tmp / "tiny")
    pinned = LEVELS[1:] if torch.backends.cpu.get_cpu_capability() == "AVX2" else LEVELS
    return [run_under(pins, tiny, tmp / f"encoders{i}") for i, pins in enumerate(pinned)]


def same_under_every_level(levels: list[dict[str, list[str]]], part: str) -> None:
    capabilities = [run[part][0] for run in levels]
    assert capabilities[-1] == "DEFAULT", capabilities
    if len(set(capabilities)) < 2:
        pytest.skip(f"this processor offers no vector extension to hold back ({capabilities})")
    assert len({tuple(run[part][1:]) for run in levels}) == 1, [run[part] for run in levels]


def test_the_mlp_trains_to_the_same_weights_under_every_instruction_set(levels):
    same_under_every_level(levels, "mlp")


def test_the_static_table_distils_and_trains_to_the_same_bits_under_every_instruction_set(levels):
    same_under_every_level(levels, "static")
