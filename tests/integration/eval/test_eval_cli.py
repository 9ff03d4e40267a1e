"""The evaluation from the command line: a Hydra multirun of evaluate.py that the report gathers, the task
success table by category, a W&B offline run, and ``report --paired`` over one fold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import ROOT

from tracer.eval.metrics import StepRecord


# ---- the CLI: multirun composes, the report gathers it, W&B offline files
# -----------------------------------
def _evaluate(args, cwd):
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags go before the overrides
    env_args = [sys.executable, str(ROOT / "evaluate.py"), *flags, "progress=false", "latency_sample=2",
                "folds=2", f"embedder.cache_dir={cwd / 'cache'}", *[a for a in args if not a.startswith("-")]]
    out = subprocess.run(env_args, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow  # a Hydra multirun of evaluate.py in a subprocess: make test-all
def test_multirun_composes_and_report_gathers_it(native_dir, tmp_path):
    sweep = tmp_path / "sweep"
    _evaluate(["-m", "dataset=jsonl", f"dataset.path={native_dir}", "scorer=vector,tracer_fixed", "k=1,2",
               f"hydra.sweep.dir={sweep}"], tmp_path)
    runs = sorted(p.parent for p in sweep.rglob("metrics.json"))
    assert len(runs) == 4
    doc = json.loads((runs[0] / "metrics.json").read_text())
    assert set(doc) == {"dataset", "registry_size", "scorer", "k", "regime", "executor", "n_steps", "mean",
                        "sd", "per_fold", "folds", "folds_in_mean", "folds_without_test_steps",
                        "by_gold_seen"}
    assert doc["registry_size"] == 6 and doc["n_steps"] == 10 and len(doc["per_fold"]) == 2
    lines = (runs[0] / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 10 and {"fold", "gold", "ranking", "presented", "kappa", "prompt_tokens"} <= set(
        json.loads(lines[0]))
    # run_info describes each fold's *fitted* scorer: tracer_fixed's trie is built from that fold's training
    # part
    infos = {r.name: json.loads((r / "run_info.json").read_text())["scorer_info"] for r in runs}
    trie_infos = [v for name, v in infos.items() if "scorer=tracer_fixed" in name]
    assert len(trie_infos) == 2 and all(len(v) == 2 and all(f["n_edges"] > 0 for f in v) for v in trie_infos)
    assert all(f["scorer"] == "vector" for name, v in infos.items() if "scorer=vector" in name for f in v)
    from tracer.eval.report import report

    out = report([sweep], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert out["runs"] == 4 and md.count("| jsonl |") == 4
    assert "executor: oracle" in md and "oracle numbers" in md and "minilm-wordpiece" in md
    assert (tmp_path / "report" / "cost_accuracy.png").stat().st_size > 0


def test_report_task_success_by_category(tmp_path):
    from tracer.eval.report import category_table, load_run

    doc = {"dataset": "bfcl", "registry_size": 3, "scorer": "s", "k": 5, "regime": "free_running",
           "executor": "oracle", "n_steps": 1, "mean": {}, "sd": {}, "per_fold": []}
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps(doc))
    tasks = [("base", True), ("base", False), ("base", True), ("miss_param", False), ("miss_param", True)]
    (run / "tasks.jsonl").write_text("".join(json.dumps({"fold": i % 2, "trajectory_id": f"t{i}",
                                                         "category": c, "success": ok}) + "\n"
                                             for i, (c, ok) in enumerate(tasks)))
    md = category_table([load_run(run)])
    assert "| base | miss_param | all |" in md
    assert "| s | 5 | 0.667 (3) | 0.500 (2) | 0.600 (5) |" in md


@pytest.mark.slow  # trains encoders / a W&B run: make test-all
def test_wandb_offline_run_holds_the_summary(native_dir, tmp_path):
    run = tmp_path / "run"
    _evaluate(["dataset=jsonl", f"dataset.path={native_dir}", "scorer=vector", "logger=wandb",
               f"hydra.run.dir={run}"], tmp_path)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    blob = files[0].read_bytes()
    assert b"recall_at_k_mean" in blob and b"fold/mrr" in blob
    assert (run / "metrics.json").exists()


@pytest.mark.slow  # 6-13 s: keeps make test under 5 minutes on a cold clone
def test_paired_report_over_one_fold_uses_only_its_steps(tmp_path):
    """``report --paired A B --folds 0``: the test and the means are over fold 0's steps alone."""
    def run(name: str, ranks: dict[tuple[int, int], int]) -> Path:
        d = tmp_path / name
        d.mkdir()
        rows = [StepRecord(fold=f, trajectory_id=f"t{i}", group=f"g{i}", step=0, turn=0, position=0, gold="a",
                           gold_rank=r, ranking=[], presented=[], in_trie=None, fell_back=None, kappa=None,
                           selected=None, correct=None, hit_at_k=r <= 5, prompt_tokens=0,
                           prompt_tokens_local=0, full_registry_tokens=0).to_json()
                for (f, i), r in ranks.items()]
        (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return d

    # fold 0: A hits 3 of 4 steps, B 1 of 4; fold 1 (left out) would flip the difference
    a = run("a", {(0, 0): 1, (0, 1): 2, (0, 2): 3, (0, 3): 9, (1, 4): 9, (1, 5): 9, (1, 6): 9, (1, 7): 9})
    b = run("b", {(0, 0): 1, (0, 1): 8, (0, 2): 8, (0, 3): 8, (1, 4): 1, (1, 5): 1, (1, 6): 1, (1, 7): 1})
    out = subprocess.run([sys.executable, "-m", "tracer.eval.report", "--paired", str(a), str(b),
                          "--folds", "0"],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    assert res["n"] == 4 and res["folds"] == [0]
    assert res["mean_a"] == 0.75 and res["mean_b"] == 0.25 and res["mean_diff"] == pytest.approx(0.5)
    mrr = json.loads(subprocess.run([sys.executable, "-m", "tracer.eval.report", "--paired", str(a), str(b),
                                     "--metric", "rr"], capture_output=True, text=True, check=True).stdout)
    # all 8 steps: A (1 + 1/2 + 1/3 + 1/9 + 4/9) / 8, B (1 + 3/8 + 4) / 8
    assert mrr["n"] == 8 and mrr["mean_a"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 5 / 9) / 8)
    assert mrr["mean_b"] == pytest.approx((1 + 3 / 8 + 4) / 8)
