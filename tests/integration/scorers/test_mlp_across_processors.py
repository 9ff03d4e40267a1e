"""tracer_plus's MLP candidate model trains to the same weights whichever vector instructions the processor
offers: fitted in fresh processes whose ATen and MKL kernels are held to AVX2, or to no vector extension at
all, and in one left to the host's best, the float32 weights are bit-identical (fit.py's ``_wide``). In
float32 the same fits differ in their last bits, which the non-convex fit grows into other rankings.

Real components: torch's CPU kernels under ``ATEN_CPU_CAPABILITY`` and ``MKL_ENABLE_INSTRUCTIONS``, real
processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from builders import ROOT

# fits a 2-member ensemble on seeded random candidates and prints a digest of its float32 weights
FIT = textwrap.dedent("""
    import hashlib, numpy as np, torch
    from tracer.learn.trainer import TrainConfig
    from tracer.scorers.tracer_plus.fit import CandidateData, train_model
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
    print(torch.backends.cpu.get_cpu_capability(), hist["best_epoch"], h.hexdigest())
""")

LEVELS = [{}, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
          {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}]


def fit_under(pins: dict) -> tuple[str, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    proc = subprocess.run([sys.executable, "-c", FIT], check=False, cwd=ROOT, capture_output=True, text=True,
                          env={**env, **pins, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    capability, epoch, digest = proc.stdout.split()
    return capability, epoch, digest


@pytest.mark.heavy(seconds=15)  # three fresh interpreters fit in turn
def test_the_mlp_trains_to_the_same_weights_under_every_instruction_set():
    runs = [fit_under(pins) for pins in LEVELS]
    capabilities = [c for c, _, _ in runs]
    assert capabilities[2] == "DEFAULT", capabilities
    if len(set(capabilities)) < 2:
        pytest.skip(f"this processor offers no vector extension to hold back ({capabilities})")
    assert len({(epoch, digest) for _, epoch, digest in runs}) == 1, runs
