"""A separate process for the storage tests: saves or loads a small TRACER index in a loop.

    python tests/storage_worker.py write DIR SECONDS   # save variants 0, 1, 2, 0, ... until SECONDS pass
    python tests/storage_worker.py read DIR SECONDS    # load until SECONDS pass; one JSON line per load

Variants differ in every file (registry, trie, vectors, config), so a load that mixed files of two
saves would match none of their fingerprints. Prints "ready" once imports and fits are done, then
waits for a line on stdin before it starts.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from builders import TINY_TOOLS, KeywordEmbedder, tiny_trajectories

from tracer.build import build_scorer
from tracer.core.types import Registry, Tool
from tracer.scorer_base.resources import Resources
from tracer.scorers.tracer import TracerScorer

N_VARIANTS = 3


def build(i: int) -> TracerScorer:
    """Variant ``i``: one extra tool, the first ``3 + i`` trajectories, eps ``0.1 * (i + 1)``."""
    registry = Registry([*TINY_TOOLS, Tool(f"extra_{i}", f"an extra tool number {i} about email")])
    res = Resources.build(registry, KeywordEmbedder(), device="cpu", seed=0)
    scorer = build_scorer("tracer_fixed", eps=0.1 * (i + 1))
    scorer.fit(tiny_trajectories()[:3 + i], res)
    return scorer


def fingerprint(s: TracerScorer) -> str:
    """SHA-256 over what a load reads back: registry, config, global set, trie tensors, tool vectors."""
    h = hashlib.sha256(json.dumps([s.res.registry.names, s.eps, list(s.global_set)]).encode())
    for name, t in sorted(s.trie.state_dict().items()):
        h.update(name.encode())
        h.update(repr(t).encode() if not hasattr(t, "numpy") else t.contiguous().numpy().tobytes())
    h.update(s.res.tool_index.vectors.tobytes())
    return h.hexdigest()


def main(mode: str, directory: str, seconds: float) -> None:
    emb = KeywordEmbedder()
    scorers = [build(i) for i in range(N_VARIANTS)] if mode == "write" else []
    print("ready", flush=True)
    sys.stdin.readline()  # "go": the test starts the writer and the reader together
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        if mode == "write":
            scorers[n % N_VARIANTS].save(directory)
        else:
            try:
                print(json.dumps({"ok": fingerprint(TracerScorer.load(directory, emb, device="cpu"))}),
                      flush=True)
            except Exception as e:  # noqa: BLE001 - reported to the test, which fails on any error
                print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        n += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
