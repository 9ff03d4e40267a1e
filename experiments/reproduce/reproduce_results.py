"""Re-run the committed BFCL results and diff them against the committed metrics (issue 13, "Done when").

    python -m experiments.reproduce.reproduce_results                 # both parts (~2 h on 2 cores), exact
    python -m experiments.reproduce.reproduce_results --only ablation --rows full,mlp --out /tmp/repro
    python -m experiments.reproduce.reproduce_results --reuse /tmp/repro # diff runs already there, run
    nothing
    python -m experiments.reproduce.reproduce_results --tol 1e-12     # allow float differences up to 1e-12
    python -m experiments.reproduce.reproduce_results --only presets --rows best,zero_shot  # hours: encoders
    python -m experiments.reproduce.reproduce_results --diff RUN_DIR results/encoders/bfcl/mnrl_vector

Parts (each an experiment group in tracer/configs/experiment/, run as one Hydra multirun, k = 5,
5 folds, seed 0, registry large, latency_sample=0):

- ``table``: ``+experiment/bfcl_table=<scorer>`` for every scorer, diffed against
  ``results/bfcl/teacher_forcing/dataset=bfcl,folds=5,k=5,*,scorer=<scorer>,seed=0/metrics.json``;
- ``ablation``: ``+experiment/tracer_plus_ablation=<row>`` for every row, diffed against
  ``results/bfcl/ablation/<row>/metrics.json``;
- ``presets`` (not run unless asked: each fine-tuned preset trains five encoders, about an hour of a 2-core
  CPU; cached checkpoints are reused): ``experiment=preset/<name>`` on BFCL, one run each with one thread
  (as ``results_encoders.sh`` ran them), diffed against the run of ``results/encoders/bfcl/`` that
  ``PRESET_RUNS`` names. The int8 presets (``fast``, the slow stage of ``cascade``) reproduce only on
  processors with the committed rows' vector instructions, AVX-512 (``results/encoders/README.md``).

Every run embeds into an empty cache of its own (``paths.embeddings`` under its run directory): MiniLM's
vector of a text moves in the seventh decimal with the other texts of the batch it was encoded in, so a run
over a cache that other commands filled can flip near-ties, and a row whose model trains on the vectors
(the ablation's ``mlp``) can move a fold by 0.01. Each row's own cold cache makes the rerun a function of the
code and the machine alone; the table's and the ablation's references equal such runs (docs/results.md; the
ablation's 26 rows take about 100 minutes on 2 cores). Of the presets', `fastest`'s does; the fine-tuned ones
(hours each) have not been rerun so.

Compared, exactly unless ``--tol``: the run's identity (dataset, registry size, scorer, k, regime, number of
steps) and ``mean`` and every fold of ``per_fold`` for the quality metrics (latency is a timing, not a
result). Any difference, missing run or missing reference exits 1 with one line per difference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # experiments/reproduce/ -> the repository
EXPERIMENTS = ROOT / "tracer" / "configs" / "experiment"
PARTS = {"table": "bfcl_table", "ablation": "tracer_plus_ablation", "presets": "preset"}
DEFAULT_PARTS = ("table", "ablation")
# a preset -> its committed run in results/encoders/bfcl/ (experiments/reproduce/results_encoders.sh)
PRESET_RUNS = {"best": "mnrl_mlp10_tracer_plus", "cascade": "cascade_cascade",
               "fast": "mnrl_l3_cut_int8_tracer_plus", "fastest": "static_mnrl_ctx05_inner_tracer_plus",
               "zero_shot": "minilm_tracer_plus", "cold_start": "general_cold_start_tracer_plus"}
QUALITY = ("recall_at_k", "mrr", "selection_accuracy", "cic_tokens", "cic_full_registry_tokens",
           "cic_reduction", "out_of_trie_rate", "fallback_rate", "recall_out_of_trie")
# each run's embeddings in an empty cache under its run directory (the module docstring says why)
OWN_CACHE = "paths.embeddings=${hydra:runtime.output_dir}/embeddings"
IDENTITY = ("dataset", "registry_size", "scorer", "k", "regime", "n_steps")


def rows_of(group: str) -> list[str]:
    return sorted(p.stem for p in (EXPERIMENTS / group).glob("*.yaml"))


def reference(part: str, row: str, table_dir: Path, ablation_dir: Path,
              preset_dir: Path = ROOT / "results" / "encoders" / "bfcl") -> Path | None:
    """The committed metrics.json of a row (None when there is none, or more than one candidate)."""
    if part == "presets" and row not in PRESET_RUNS:
        return None
    if part in ("ablation", "presets"):
        path = (ablation_dir / row if part == "ablation" else preset_dir / PRESET_RUNS[row]) / "metrics.json"
        return path if path.is_file() else None
    found = sorted(table_dir.glob(f"dataset=bfcl,folds=5,k=5,*,scorer={row},seed=0/metrics.json"))
    return found[0] if len(found) == 1 else None


def run(group: str, rows: list[str], out: Path) -> int:
    """One multirun over the rows of an experiment group into ``out/<group>/<row>`` (the presets: one run
    each, on one thread); its exit status."""
    if group == PARTS["presets"]:
        codes = []
        for row in rows:
            cmd = [sys.executable, str(ROOT / "evaluate.py"), f"experiment=preset/{row}", "dataset=bfcl",
                   "registry=large", "k=5", "folds=5", "seed=0", "progress=false", "latency_sample=0",
                   f"hydra.run.dir={out / group / row}", OWN_CACHE]
            print("$ OMP_NUM_THREADS=1", " ".join(cmd), flush=True)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            codes.append(subprocess.run(cmd, check=False, cwd=ROOT, env=env).returncode)
        return max(codes, default=0)
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "-m", f"+experiment/{group}={','.join(rows)}",
           "latency_sample=0", f"hydra.sweep.dir={out}", OWN_CACHE]
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=False, cwd=ROOT).returncode


def close(a, b, tol: float) -> bool:
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tol)


def diff(got: dict, ref: dict, tol: float) -> list[str]:
    """Differences of a run's metrics.json from the reference, one readable line each."""
    lines = [f"{f}: reference {ref.get(f)!r}, got {got.get(f)!r}"
             for f in IDENTITY if got.get(f) != ref.get(f)]
    if len(got["per_fold"]) != len(ref["per_fold"]):
        return lines + [f"folds: reference {len(ref['per_fold'])}, got {len(got['per_fold'])}"]
    where = [("mean", got["mean"], ref["mean"])]
    where += [(f"fold {i}", g, r) for i, (g, r) in enumerate(zip(got["per_fold"], ref["per_fold"]))]
    for label, g, r in where:
        for m in QUALITY:
            if not close(g.get(m), r.get(m), tol):
                d = abs(g[m] - r[m]) if isinstance(g.get(m), float) and isinstance(r.get(m), float) else None
                lines.append(f"{label} {m}: reference {r.get(m)!r}, got {g.get(m)!r}"
                             + (f" (|diff| {d:.3g})" if d is not None else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "reproduce",
                   help="where the runs are written")
    p.add_argument("--reuse", type=Path, default=None,
                   help="diff the runs already in this directory; run nothing")
    p.add_argument("--diff", type=Path, nargs=2, metavar=("RUN", "REFERENCE"), default=None,
                   help="diff one run directory against one reference directory (any evaluate.py run, such "
                        "as the rows of results/encoders/); run nothing")
    p.add_argument("--only", choices=sorted(PARTS), default=None, help="one part only")
    p.add_argument("--rows", default=None,
                   help="comma-separated rows (scorers of the table, ablation rows, presets)")
    p.add_argument("--tol", type=float, default=0.0,
                   help="largest allowed |difference| of a metric (default: exact)")
    p.add_argument("--table-reference", type=Path, default=ROOT / "results" / "bfcl" / "teacher_forcing")
    p.add_argument("--ablation-reference", type=Path, default=ROOT / "results" / "bfcl" / "ablation")
    a = p.parse_args(argv)
    if a.diff is not None:
        got, ref = (json.loads((d / "metrics.json").read_text()) for d in a.diff)
        lines = diff(got, ref, a.tol)
        print(f"{'DIFF' if lines else 'same'} {a.diff[0]} (reference {a.diff[1]}, tolerance {a.tol:g})",
              *(f"    {line}" for line in lines), sep="\n")
        return 1 if lines else 0

    parts = [a.only] if a.only else list(DEFAULT_PARTS)
    wanted = set(a.rows.split(",")) if a.rows else None
    plan = {part: [r for r in rows_of(PARTS[part]) if wanted is None or r in wanted] for part in parts}
    if wanted is not None and (unknown := wanted - {r for rows in plan.values() for r in rows}):
        valid = {part: rows_of(PARTS[part]) for part in parts}
        p.error(f"unknown rows {', '.join(sorted(unknown))}; valid: {json.dumps(valid)}")
    out = a.reuse or a.out

    failed_runs = []
    if a.reuse is None:
        for part, rows in plan.items():
            if rows and run(PARTS[part], rows, out) != 0:
                failed_runs.append(part)

    problems = 0
    for part, rows in plan.items():
        for row in rows:
            name = f"{PARTS[part]}/{row}"
            got_path = out / PARTS[part] / row / "metrics.json"
            ref_path = reference(part, row, a.table_reference, a.ablation_reference)
            if ref_path is None or not got_path.is_file():
                problems += 1
                missing = "reference" if ref_path is None else f"run ({got_path})"
                print(f"MISSING {name}: no {missing}")
                continue
            lines = diff(json.loads(got_path.read_text()), json.loads(ref_path.read_text()), a.tol)
            problems += bool(lines)
            print(f"{'DIFF' if lines else 'same'} {name} (reference "
                  f"{ref_path.relative_to(ref_path.parents[1])})")
            for line in lines:
                print(f"    {line}")
    n = sum(len(rows) for rows in plan.values())
    print(f"\n{n - problems} of {n} runs reproduce the reference (tolerance {a.tol:g})"
          + (f"; multirun failed: {', '.join(failed_runs)}" if failed_runs else ""))
    return 1 if problems or failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
