#!/usr/bin/env bash
# Reproduces the README's BFCL results tables (oracle executor, 5 folds by task, registry large = 240 tools).
#   bash experiments/reproduce/results_bfcl.sh [OUTDIR]          (default results/bfcl)
# Teacher-forcing at k = 1, 3, 5, 10 for every scorer, one free-running row per scorer at k = 5,
# then one report (report.md, report.csv, plots) over both sweeps.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-results/bfcl}
PY=${PY:-.venv/bin/python}
SCORERS=${SCORERS:-tracer_plus,tracer,tracer_fixed,tracer_g,llm_only,vector,tool2vec,toolnet,autotool,hepm,insight}
COMMON="dataset=bfcl registry=large folds=5 seed=0 latency_sample=${LATENCY_SAMPLE:-20} progress=false"
SECONDS=0
$PY evaluate.py -m scorer=$SCORERS k=${KS:-1,3,5,10} $COMMON hydra.sweep.dir=$OUT/teacher_forcing
echo "teacher-forcing sweep: ${SECONDS} s wall"
SECONDS=0
$PY evaluate.py -m scorer=$SCORERS k=5 regime=free_running $COMMON hydra.sweep.dir=$OUT/free_running
echo "free-running sweep: ${SECONDS} s wall"
$PY -m tracer.eval.report $OUT/teacher_forcing $OUT/free_running --out $OUT
