"""Where a single-text ONNX encode spends its time, per operator type, with and without the skip layer norm
fused.

    OMP_NUM_THREADS=1 python -m experiments.studies.onnx_export.profile_onnx \
        [--model .cache/encoders/finetuned-<a checkpoint>]
        [--variant int8] [--pieces 48] [--runs 400]

Both exports of ``--model`` (``tracer.encode.onnx.export``: the shipped one, whose residual adds stay Add +
LayerNormalization, and ``skip_layer_norm=True``, the optimizer's default SkipLayerNormalization fusion; each
built once into the encoder cache) run one BFCL-like query cut to ``--pieces`` word pieces on one thread, in
alternating blocks of 50 runs (one graph warm at a time, as in a server; host drift hits both alike). Printed
per graph: the session-run median, and ONNX Runtime's profiler's kernel time per operator type (microseconds
per run). Its README ("The skip layer norm left unfused") quotes it for fold 0's 3-layer student.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from tracer.encode.onnx import export, feeds, session

QUERY = ("user: I just graduated and plan on traveling for alumni meetups. I'm really curious which airports "
         "are around cities like Rivermist and Stonebrook, can you find some for me? And then book the "
         "cheapest flight.")


def kernel_us(sess: ort.InferenceSession, inputs: dict, runs: int, warm: int = 30) -> dict[str, float]:
    """Mean kernel microseconds per run of each operator type (summed over its nodes), the first ``warm`` runs
    left out."""
    for _ in range(warm + runs):
        sess.run(None, inputs)
    per_node, op_of = defaultdict(list), {}
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node[e["name"]].append(e["dur"])
            op_of[e["name"]] = e["args"]["op_name"]
    per_op = defaultdict(float)
    for node, durs in per_node.items():
        per_op[op_of[node]] += float(np.mean(durs[warm:]))
    return dict(sorted(per_op.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="a sentence-transformers folder (default: the bundled MiniLM)")
    ap.add_argument("--variant", default="int8", choices=["fp32", "int8"])
    ap.add_argument("--pieces", type=int, default=48, help="word pieces the query is cut to")
    ap.add_argument("--runs", type=int, default=400, help="timed runs per graph (a multiple of 50)")
    a = ap.parse_args()
    graphs = {"Add + LayerNormalization (shipped)": export(a.model),
              "SkipLayerNormalization (fused)": export(a.model, skip_layer_norm=True)}
    tok = Tokenizer.from_file(str(next(iter(graphs.values())) / "tokenizer" / "tokenizer.json"))
    tok.enable_truncation(a.pieces)
    enc = tok.encode(QUERY)
    inputs = feeds([enc])                                                                     # [1, T] each
    sessions = {label: session(d / f"{a.variant}.onnx") for label, d in graphs.items()}
    times = {label: [] for label in sessions}
    for _ in range(30):
        for s in sessions.values():
            s.run(None, inputs)
    for _ in range(a.runs // 50):  # blocks of 50 runs, alternating: one graph warm at a time, as in a server,
        for label, s in sessions.items():  # and a burst of load hits both alike
            s.run(None, inputs)
            for _ in range(50):
                t0 = time.perf_counter()
                s.run(None, inputs)
                times[label].append((time.perf_counter() - t0) * 1000)
    print(f"{a.model or 'all-MiniLM-L6-v2'}, {a.variant}, {len(enc.ids)} word pieces, "
          f"one thread, {a.runs} runs\n")
    with tempfile.TemporaryDirectory() as tmp:
        for label, d in graphs.items():
            ops = kernel_us(session(d / f"{a.variant}.onnx", profile_prefix=str(Path(tmp) / d.name)), inputs,
                            a.runs)
            print(f"{label}: session run p50 {np.median(times[label]):.3f} ms; kernel time "
                  f"{sum(ops.values()):.0f} us:")
            print("  " + ", ".join(f"{op} {us:.1f}" for op, us in ops.items()))


if __name__ == "__main__":
    main()
