#!/usr/bin/env bash
# The encoder x scorer runs of docs/encoders.md: registry large, k=5, 5 folds by group, seed 0, oracle, teacher forcing.
#   bash experiments/reproduce/results_encoders.sh [OUTDIR]   (default results/encoders; a folder per dataset below it)
# One evaluate.py run per (dataset, encoder, scorer) -> OUTDIR/<dataset>/<encoder>_<scorer>/. An encoder is an
# embedder config (zero-shot: minilm, onnx_fp32, onnx_int8, static) or an encoder_training recipe (mnrl: per-fold
# fine-tuning, mnrl_static: the same checkpoints served as static models, static_mnrl: a static model trained on
# the pairs), the checkpoints cached by content hash. The archived recipes (mnrl_static, mnrl_l2_int8,
# mnrl_l4_int8) are found through Hydra's search path, experiments/configs/ (experiments/configs/README.md).
#   DATASETS="tau2 apibank" ENCODERS="minilm mnrl" SCORERS=vector \
#     bash experiments/reproduce/results_encoders.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-results/encoders}
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SEARCH='hydra.searchpath=[file://experiments/configs]'
# the evaluate.py override naming an encoder: a training recipe, or an embedder config
what() {
  case $1 in mnrl*|static_mnrl|static_contexts) echo "encoder_training=$1" ;; *) echo "embedder=$1" ;; esac
}
for ds in ${DATASETS:-bfcl tau2 apibank}; do
  for enc in ${ENCODERS:-minilm onnx_fp32 onnx_int8 static mnrl mnrl_static}; do
    for sc in ${SCORERS:-vector tracer_plus}; do
      SECONDS=0
      $PY evaluate.py "$SEARCH" $(what $enc) scorer=$sc dataset=$ds registry=large k=5 folds=5 seed=0 \
        progress=false hydra.run.dir=$OUT/$ds/${enc}_${sc} > /dev/null
      echo "$ds $enc $sc: ${SECONDS} s wall"
    done
  done
done
# the fast preset's variants inside tracer_plus with clean inner folds (inner_encoders=true); VARIANTS="" skips them
# (static_registry's rows ran at commit d47c1d9, with the training code that recipe needs)
for ds in ${DATASETS:-bfcl tau2 apibank}; do
  for v in ${VARIANTS-static_mnrl static_mnrl_ctx05}; do
    case $v in
      static_mnrl_ctx05) args="encoder_training=static_mnrl encoder_training.context_weight=0.5" ;;
      *) args="encoder_training=$v" ;;
    esac
    SECONDS=0
    $PY evaluate.py $args encoder_training.inner_encoders=true scorer=tracer_plus dataset=$ds registry=large k=5 \
      folds=5 seed=0 progress=false hydra.run.dir=$OUT/$ds/${v}_inner_tracer_plus > /dev/null
    echo "$ds ${v}_inner tracer_plus: ${SECONDS} s wall"
  done
done
# the best preset's candidate model (the mean of 10 MLPs, experiment=preset/best) over the zero-shot and the
# fine-tuned encoder; MODELS="" skips them
for ds in ${DATASETS:-bfcl tau2 apibank}; do
  for enc in ${MODELS-minilm mnrl}; do
    SECONDS=0
    $PY evaluate.py "$SEARCH" $(what $enc) scorer=tracer_plus scorer.model=mlp scorer.head.members=10 \
      dataset=$ds registry=large k=5 folds=5 seed=0 progress=false hydra.run.dir=$OUT/$ds/${enc}_mlp10_tracer_plus > /dev/null
    echo "$ds ${enc}_mlp10 tracer_plus: ${SECONDS} s wall"
  done
done
# the cold-start preset (experiment=preset/cold_start: the general encoder built without the dataset, data/mirrors
# holding its corpora's clones, the two novel slots, the fusion among the candidates); COLD="" skips it
for ds in ${COLD-bfcl tau2 apibank}; do
  SECONDS=0
  $PY evaluate.py experiment=preset/cold_start dataset=$ds registry=large k=5 folds=5 seed=0 progress=false \
    hydra.run.dir=$OUT/$ds/general_cold_start_tracer_plus > /dev/null
  echo "$ds general_cold_start tracer_plus: ${SECONDS} s wall"
done
$PY -m experiments.reproduce.frontier --root $OUT
