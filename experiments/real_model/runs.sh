#!/usr/bin/env bash
# bash experiments/real_model/runs.sh [STEPS] [OUT] [OVERRIDE ...]
# Teacher-forced selection by Qwen2.5-Coder-1.5B on the same STEPS sampled BFCL steps (seed 0, registry large, 5
# folds by group) for tracer_plus at k = 3 and 5 and vector search at k = 5, one run after the other (the
# server answers one request at a time, so each request's wall time is its own). Needs the model server:
#   nice -n 5 python -m tracer.models serve --model qwen-coder --port 8077
# BASE_URL overrides its address. Writes OUT/<config>/ (metrics.json, steps.jsonl) and OUT/load.txt (the
# load average every 60 s); `python -m experiments.real_model.table OUT` prints the table. Any OVERRIDE
# (e.g. paths.datasets=DIR) goes to every evaluate.py.
set -euo pipefail
STEPS=${1:-12}
OUT=${2:-outputs/real_model}
shift $(($# < 2 ? $# : 2))
BASE_URL=${BASE_URL:-http://127.0.0.1:8077/v1}
mkdir -p "$OUT"
(while true; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 60; done) >>"$OUT/load.txt" &
LOAD_PID=$!
trap 'kill $LOAD_PID' EXIT
for config in tracer_plus:5 vector:5 tracer_plus:3; do
  scorer=${config%:*}
  k=${config#*:}
  python evaluate.py regime=selection regime.steps="$STEPS" scorer="$scorer" k="$k" \
    executor=openai executor.base_url="$BASE_URL" executor.model=qwen-coder executor.api_key_env=null \
    executor.calls_in_text=true executor.concurrency=1 executor.max_tokens=128 executor.timeout_s=900 \
    executor.max_retries=1 latency_sample=0 progress=false hydra.run.dir="$OUT/${scorer}_k$k" "$@"
done
