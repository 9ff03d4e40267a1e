#!/usr/bin/env bash
# Ablation of tracer_plus, one evaluate.py run per row (5 folds, oracle, teacher forcing), then a table.
#
#   scripts/ablate_tracer_plus.sh                       # every row on BFCL (registry large)
#   DATASET=tau2 ROWS="full toolnet tracer" scripts/ablate_tracer_plus.sh
#   ROWS="full no_vector mlp" OUT=outputs/abl scripts/ablate_tracer_plus.sh
#
# A row whose run directory already holds metrics.json is not run again (delete it to rerun).
# Each row is `python evaluate.py scorer=tracer_plus k=5 dataset=$DATASET <overrides>`; the table gives
# recall@1/3/5/10 (mean ± SD over folds, from each step's gold rank), MRR, candidate coverage and a
# paired sign-flip test of hit@5 against the `full` row (tracer.eval.report.paired). Latency is timed
# for the reference rows only (ablation rows run with latency_sample=0).
set -euo pipefail
cd "$(dirname "$0")/.."

DATASET=${DATASET:-bfcl}
OUT=${OUT:-outputs/ablate_tracer_plus/$DATASET}
PY=${PY:-.venv/bin/python}
# the paper's rendering (whole conversation, results truncated to 200 characters) and the user message alone
paper() { echo "scorer.$1.window=all scorer.$1.results=truncated"; }
user() { echo "scorer.$1.calls=none"; }

declare -A ARGS=(
  [full]=""
  [toolnet]="scorer=toolnet"
  [tracer]="scorer=tracer"
  [tracer_fixed]="scorer=tracer_fixed"
  [vector]="scorer=vector"
  [only_prefix]="scorer.keys=[prefix]"
  [no_prefix]="scorer.keys=[last_2+cross_turn,last_1+cross_turn]"
  [no_last2]="scorer.keys=[prefix,last_1+cross_turn]"
  [no_last1]="scorer.keys=[prefix,last_2+cross_turn]"
  [no_vector]="scorer.vector_candidates=0"
  [drop_member]="scorer.features.drop=[member]"
  [drop_log_p]="scorer.features.drop=[log_p]"
  [drop_log_r]="scorer.features.drop=[log_r]"
  [drop_edge_cos]="scorer.features.drop=[edge_cos]"
  [drop_state]="scorer.features.drop=[state]"
  [drop_vector]="scorer.features.drop=[vector]"
  [drop_tool]="scorer.features.drop=[tool]"
  [drop_history]="scorer.features.drop=[history]"
  [drop_tool_history]="scorer.features.drop=[tool,history]"
  [mlp]="scorer.model=mlp"
  [query_all]="$(paper query_context)"
  [memory_all]="$(paper memory_context)"
  [both_all]="$(paper query_context) $(paper memory_context)"
  [query_user]="$(user query_context)"
  [memory_user]="$(user memory_context)"
  [no_join_users]="scorer.query_context.join_users=false scorer.memory_context.join_users=false"
  [vector_join_users]="scorer=vector +scorer.context.join_users=true"
)
ORDER="full toolnet tracer only_prefix no_prefix no_last2 no_last1 no_vector drop_member drop_log_p drop_log_r \
drop_edge_cos drop_state drop_vector drop_tool drop_history drop_tool_history mlp query_all memory_all both_all \
query_user memory_user no_join_users vector vector_join_users"
ROWS=${ROWS:-$ORDER}
REFERENCE="full toolnet tracer tracer_fixed vector"
mkdir -p "$OUT/logs"

for row in $ROWS; do
  [[ -v "ARGS[$row]" ]] || { echo "unknown row $row; rows: ${!ARGS[*]}" >&2; exit 2; }
  dir="$OUT/$row"
  if [[ -f "$dir/metrics.json" ]]; then echo "== $row: done ($dir)"; continue; fi
  args=${ARGS[$row]}
  [[ "$args" == scorer=* ]] || args="scorer=tracer_plus $args"
  # latency (one step at a time, real encodes) is timed for the reference rows only
  case " $REFERENCE " in *" $row "*) ;; *) args="$args latency_sample=0" ;; esac
  echo "== $row: python evaluate.py $args k=5 dataset=$DATASET"
  # shellcheck disable=SC2086
  $PY evaluate.py $args k=5 "dataset=$DATASET" progress=false "hydra.run.dir=$dir" > "$OUT/logs/$row.log" 2>&1 \
    || { echo "   failed, see $OUT/logs/$row.log" >&2; continue; }
done

$PY - "$OUT" $ROWS <<'PY'
import json, sys
from pathlib import Path

import numpy as np

from tracer.eval.outputs import read_steps
from tracer.eval.report import fmt, paired

out, rows = Path(sys.argv[1]), sys.argv[2:]
ref = out / "full"
print(f"\n{out} (k = 5 runs; recall@j from the gold ranks; mean ± SD over folds)\n")
print("| row | scorer | recall@1 | recall@3 | recall@5 | recall@10 | MRR | coverage | Δhit@5 vs full (p) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for row in rows:
    run = out / row
    if not (run / "metrics.json").exists():
        print(f"| {row} | (not run) |")
        continue
    m = json.loads((run / "metrics.json").read_text())
    recs = read_steps(run / "steps.jsonl")
    folds = sorted({r.fold for r in recs})
    cells = []
    for j in (1, 3, 5, 10):
        per = [np.mean([bool(r.gold_rank) and r.gold_rank <= j for r in recs if r.fold == f]) for f in folds]
        cells.append(fmt(float(np.mean(per)), float(np.std(per, ddof=1)) if len(per) > 1 else 0.0))
    cov = [r.extra["in_candidates"] for r in recs if "in_candidates" in r.extra]
    cells.append(fmt(m["mean"]["mrr"], m["sd"]["mrr"]))
    cells.append(f"{np.mean(cov):.3f}" if cov else "–")
    test = ""
    if row != "full" and (ref / "steps.jsonl").exists():
        t = paired(run, ref)
        test = f"{t['mean_diff']:+.3f} (p={t['p_value']:.4f})"
    print(f"| {row} | {m['scorer']} | " + " | ".join(cells) + f" | {test} |")
PY
if $PY -m tracer.eval.report "$OUT" --out "$OUT" > /dev/null; then echo "tracer.eval.report: $OUT/report.md"; fi
