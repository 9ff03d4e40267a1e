#!/usr/bin/env bash
# The general encoder's evaluation (issue 35): every run below, into outputs/general/<dataset>/<name>/, skipped
# when its metrics.json exists. Registry large, k = 5, 5 folds by group, seed 0, oracle executor (teacher
# forcing). embedder=general leaves the dataset under test out of its training (tracer/learn/encoders/general.py).
#   bash experiments/studies/general_encoder/runs.sh [DATASET ...] [-- EXTRA OVERRIDES]
#   SKIP_GENERAL=1 bash ...   runs only what does not need the general encoder (ONLY_GENERAL=1: only what does)
# then: python -m experiments.studies.general_encoder.table
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
DATASETS=(bfcl tau2 apibank)
[[ $# -gt 0 && $1 != "--" ]] && DATASETS=() && while [[ $# -gt 0 && $1 != "--" ]]; do DATASETS+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
EXTRA=("$@")
run() {  # run NAME OVERRIDES...
  local out=outputs/general/$ds/$1; shift
  [[ -f $out/metrics.json ]] && return 0
  [[ -n ${SKIP_GENERAL:-} && " $* " == *" embedder=general "* ]] && return 0
  [[ -n ${ONLY_GENERAL:-} && " $* " != *" embedder=general "* ]] && return 0
  # the study's tracer_plus rows predate the usage vectors in the zero-shot fusion (zero_shot.usage, off here)
  [[ " $* " == *" scorer=tracer_plus "* || " $* " == *" experiment=preset/"* ]] &&
    set -- "$@" scorer.zero_shot.usage=null
  echo "== $ds $out $*" >&2
  nice -n 5 "$PY" evaluate.py "dataset=$ds" registry=large k=5 folds=5 seed=0 progress=false latency_sample=0 \
    "hydra.run.dir=$out" "$@" "${EXTRA[@]}" > "$out.log" 2>&1 || echo "failed: $out (see $out.log)" >&2
}
for ds in "${DATASETS[@]}"; do
  mkdir -p "outputs/general/$ds"
  run vector_minilm scorer=vector
  run bm25 scorer=bm25
  run vector_general scorer=vector embedder=general
  # MiniLM reading tools with their parameters (tracer/core/tool_text.py), as the general encoder does
  run vector_minilm_params scorer=vector embedder.tool_text=parameters
  run tracer_plus_minilm_params_n0 scorer=tracer_plus train_trajectories=0 embedder.tool_text=parameters
  for n in 0 10; do
    run "tracer_plus_minilm_n$n" scorer=tracer_plus "train_trajectories=$n"
    run "tracer_plus_general_n$n" scorer=tracer_plus embedder=general "train_trajectories=$n"
    [[ $n -gt 0 ]] && for s in toolnet autotool; do run "${s}_n$n" "scorer=$s" "train_trajectories=$n"; done
  done
  # NESTFUL and ToolLinkOS added to the general encoder's corpora (docs/data.md)
  chains="embedder.corpora=[bfcl_single,seal_tools,apibench,sgd,nestful,toollinkos]"
  run vector_general_chains scorer=vector embedder=general "$chains"
  run tracer_plus_general_chains_n0 scorer=tracer_plus embedder=general "$chains" train_trajectories=0
  # the cold ranking without the last call's toolkit (docs/learning.md pairs it with tracer_plus_minilm_n0)
  run tracer_plus_minilm_n0_no_toolkit scorer=tracer_plus train_trajectories=0 scorer.zero_shot.toolkit=false
  # and without the turn's last call (docs/learning.md pairs it with tracer_plus_minilm_n0 too)
  run tracer_plus_minilm_n0_no_calls scorer=tracer_plus train_trajectories=0 scorer.zero_shot.calls=false
  # and without what the last call looked up feeding the fusion (docs/learning.md pairs it too)
  run tracer_plus_minilm_n0_no_dataflow scorer=tracer_plus train_trajectories=0 scorer.zero_shot.dataflow=false
  run tracer_plus_general scorer=tracer_plus embedder=general
  run tracer_plus_minilm scorer=tracer_plus
  # the novel-tool slot (scorer.zero_shot.novel, tracer/scorers/tracer_plus/zero_shot.py)
  run tracer_plus_minilm_novel_n10 scorer=tracer_plus scorer.zero_shot.novel=2 train_trajectories=10
  run tracer_plus_minilm_novel scorer=tracer_plus scorer.zero_shot.novel=2
  # two slots from the zero-shot top 3
  run tracer_plus_minilm_novel3x2_n10 scorer=tracer_plus scorer.zero_shot.novel=3 scorer.zero_shot.slots=2 \
    train_trajectories=10
  run tracer_plus_minilm_novel3x2 scorer=tracer_plus scorer.zero_shot.novel=3 scorer.zero_shot.slots=2
  # the held-out-tools split: each called tool is held out of one fold's training (tracer/core/folds.py)
  run vector_minilm_holdout scorer=vector holdout_tools=true
  run vector_general_holdout scorer=vector embedder=general holdout_tools=true
  for s in bm25 hybrid toolnet autotool hepm tracer tracer_fixed; do
    run "${s}_holdout" "scorer=$s" holdout_tools=true
  done
  run tracer_plus_minilm_holdout scorer=tracer_plus holdout_tools=true
  run tracer_plus_minilm_novel_holdout scorer=tracer_plus scorer.zero_shot.novel=2 holdout_tools=true
  run tracer_plus_minilm_novel3x2_holdout scorer=tracer_plus scorer.zero_shot.novel=3 scorer.zero_shot.slots=2 \
    holdout_tools=true
  run tracer_plus_general_holdout scorer=tracer_plus embedder=general holdout_tools=true
  # the general encoder with the two novel slots
  run tracer_plus_general_novel3x2_n10 scorer=tracer_plus embedder=general scorer.zero_shot.novel=3 \
    scorer.zero_shot.slots=2 train_trajectories=10
  run tracer_plus_general_novel3x2_holdout scorer=tracer_plus embedder=general scorer.zero_shot.novel=3 \
    scorer.zero_shot.slots=2 holdout_tools=true
  # the cold-start preset (experiment=preset/cold_start: the general encoder and the two novel slots) with
  # every log; with N of them: the learning curves' cold_start column
  run cold_start experiment=preset/cold_start
  # the zero-shot fusion's top m among the candidates (scorer.zero_shot.candidates): tracer_plus with it, the
  # preset on each split, and the preset without it
  for split in "" _n10 _holdout; do
    case $split in _n10) more=train_trajectories=10 ;; _holdout) more=holdout_tools=true ;; *) more="" ;; esac
    run "tracer_plus_minilm_zscand$split" scorer=tracer_plus scorer.zero_shot.candidates=true $more
    [[ -n $split ]] && run "cold_start$split" experiment=preset/cold_start $more
    run "cold_start_nocand$split" experiment=preset/cold_start scorer.zero_shot.candidates=false $more
  done
  # three slots from the zero-shot top 4, for registries where many tools are new
  for split in "" _n10 _holdout; do
    case $split in _n10) more=train_trajectories=10 ;; _holdout) more=holdout_tools=true ;; *) more="" ;; esac
    run "cold_start_novel4x3$split" experiment=preset/cold_start scorer.zero_shot.novel=4 scorer.zero_shot.slots=3 \
      $more
  done
  # preset/best as committed, and with its per-fold fine-tuning started from the general encoder (BFCL only:
  # five fine-tunings each)
  if [[ $ds == bfcl ]]; then
    run best_minilm experiment=preset/best
    if [[ -z ${SKIP_GENERAL:-} && ! -f outputs/general/bfcl/best_general/metrics.json ]]; then
      base=$("$PY" -m tracer.learn.encoders.general --exclude bfcl | tail -1 \
             | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["checkpoint"])')
      ONLY_GENERAL='' run best_general experiment=preset/best "encoder_training.base_model=$base"
    fi
  fi
done
