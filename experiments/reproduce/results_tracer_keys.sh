#!/usr/bin/env bash
# The paper's ablated choices for tracer_fixed on BFCL (k = 5, registry large, oracle, 5 folds):
# the state key (full turn-local prefix, last 1 / last 2 calls, cross-turn) and padding.
#   bash experiments/reproduce/results_tracer_keys.sh [OUTDIR]          (default results/bfcl_tracer_keys)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-results/bfcl_tracer_keys}
PY=${PY:-.venv/bin/python}
COMMON="scorer=tracer_fixed dataset=bfcl registry=large k=5 folds=5 seed=0 latency_sample=0 progress=false"
run() { local name=$1; shift; $PY evaluate.py $COMMON "$@" hydra.run.dir=$OUT/$name; }
run prefix
run prefix_cross_turn scorer.key.cross_turn=true
run last_1 scorer.key.kind=last_n scorer.key.n=1
run last_2 scorer.key.kind=last_n scorer.key.n=2
run last_1_cross_turn scorer.key.kind=last_n scorer.key.n=1 scorer.key.cross_turn=true
run last_2_cross_turn scorer.key.kind=last_n scorer.key.n=2 scorer.key.cross_turn=true
run prefix_no_pad scorer.pad=false
$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
rows = ["| key | pad | recall@5 | MRR | out-of-trie rate | fallback rate | recall out of trie | prompt tokens |",
        "|---|---|---|---|---|---|---|---|"]
for d in sorted(Path(sys.argv[1]).iterdir()):
    if not (d / "metrics.json").exists():
        continue
    m = json.loads((d / "metrics.json").read_text())
    cfg = json.loads((d / "run_info.json").read_text())["config"]["scorer"]
    key = cfg["key"]
    label = ("prefix" if key["kind"] == "prefix" else f"last_{key['n']}") + (" + cross-turn" if key["cross_turn"] else "")
    f = lambda k: "–" if m["mean"][k] is None else f"{m['mean'][k]:.3f} ± {m['sd'][k]:.3f}"
    rows.append(f"| {label} | {cfg['pad']} | {f('recall_at_k')} | {f('mrr')} | {f('out_of_trie_rate')} | "
                f"{f('fallback_rate')} | {f('recall_out_of_trie')} | {m['mean']['cic_tokens']:.0f} |")
print("\n".join(rows))
(Path(sys.argv[1]) / "keys.md").write_text("\n".join(rows) + "\n")
PY
