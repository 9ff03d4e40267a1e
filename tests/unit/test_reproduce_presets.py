"""experiments/reproduce/reproduce_results.py's preset part: every preset config has a committed reference
run, and a metric moved by one unit in the last place is reported."""

from __future__ import annotations

import json
import math

from builders import ROOT

from experiments.reproduce.reproduce_results import PARTS, PRESET_RUNS, diff, main, reference, rows_of


def test_every_preset_names_a_committed_reference_run():
    presets = rows_of(PARTS["presets"])
    assert sorted(PRESET_RUNS) == presets
    assert reference("presets", "no_such_preset", ROOT, ROOT) is None
    for name in presets:
        path = reference("presets", name, ROOT / "results" / "bfcl" / "teacher_forcing",
                         ROOT / "results" / "bfcl" / "ablation")
        assert path is not None and path.parent.name == PRESET_RUNS[name], name
        assert json.loads(path.read_text())["dataset"] == "bfcl"


def test_a_metric_moved_by_one_unit_in_the_last_place_is_a_difference():
    path = ROOT / "results" / "encoders" / "bfcl" / PRESET_RUNS["best"] / "metrics.json"
    ref = json.loads(path.read_text())
    got = json.loads(path.read_text())
    assert diff(got, ref, 0.0) == []
    got["per_fold"][3]["mrr"] = math.nextafter(ref["per_fold"][3]["mrr"], 1.0)
    lines = diff(got, ref, 0.0)
    assert len(lines) == 1 and lines[0].startswith("fold 3 mrr: reference "), lines
    assert diff(got, ref, 1e-12) == []


def test_diff_compares_two_run_directories(tmp_path, capsys):
    ref = ROOT / "results" / "encoders" / "bfcl" / PRESET_RUNS["best"]
    run = tmp_path / "run"
    run.mkdir()
    doc = json.loads((ref / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps(doc))
    assert main(["--diff", str(run), str(ref)]) == 0
    doc["mean"]["recall_at_k"] = math.nextafter(doc["mean"]["recall_at_k"], 0.0)
    (run / "metrics.json").write_text(json.dumps(doc))
    assert main(["--diff", str(run), str(ref)]) == 1
    assert "mean recall_at_k: reference" in capsys.readouterr().out

