#!/usr/bin/env bash
# The encoder x scorer table of docs/encoders.md: BFCL, registry large (240 tools), k=5, 5 folds, oracle.
#   bash scripts/results_encoders.sh [OUTDIR]          (default results/encoders/bfcl)
# One evaluate.py run per (embedder, scorer); latency_ms_p50/p95 there are per step, one thread, embedding included.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/encoders/bfcl}
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
for emb in ${EMBEDDERS:-onnx_int8 static minilm onnx_fp32}; do
  for sc in ${SCORERS:-vector tracer_plus}; do
    SECONDS=0
    $PY evaluate.py embedder=$emb scorer=$sc dataset=bfcl registry=large k=5 folds=5 seed=0 progress=false \
      hydra.run.dir=$OUT/${emb}_${sc} > /dev/null
    echo "$emb $sc: ${SECONDS} s wall"
  done
done
$PY scripts/encoders_table.py $OUT/*_*/ > $OUT/table.md
