"""Wall-clock time of ``python evaluate.py`` on its defaults, cold and warm.

    python -m benchmarks.bench_evaluate [--repeats 1] [extra Hydra overrides ...]

Cold: a new, empty embedding cache (every context and tool description is encoded). Warm: the same
command again on that cache. Each run is a fresh process, so imports and model loading are
counted. The machine's load average is printed beside each time, because on a shared 2-core
machine it decides the figure more than anything in the code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_run(cache: Path, run_dir: Path, overrides: list[str]) -> tuple[float, float, dict]:
    load = os.getloadavg()[0]
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "progress=false", f"embedder.cache_dir={cache}",
           f"hydra.run.dir={run_dir}", *overrides]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"evaluate.py failed ({out.returncode}):\n{out.stderr[-3000:]}")
    info = json.loads((run_dir / "run_info.json").read_text())
    return seconds, load, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1, help="cold+warm pairs, each on its own new cache")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides passed to evaluate.py")
    args = ap.parse_args()
    print(f"python evaluate.py {' '.join(args.overrides)}  ({os.cpu_count()} CPUs)")
    print("| run | wall | texts encoded | load average (1 min) before |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench_evaluate_") as tmp:
        for r in range(args.repeats):
            cache = Path(tmp) / f"cache{r}"
            for label in ("cold", "warm"):
                s, load, info = timed_run(cache, Path(tmp) / f"run{r}_{label}", args.overrides)
                print(f"| {label} | {s:.1f} s | {info.get('embeddings_encoded')} | {load:.2f} |", flush=True)


if __name__ == "__main__":
    main()
