"""One builder per artifact across processes (tracer.encode.manifest.one_builder): real processes race for the
same artifact; the second waits for the first and then finds it built, so it is built once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from builders import ROOT

# a process that builds "artifact" under the lock unless it is already there, logging what it did
RACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tracer.encode.manifest import one_builder
    out, log, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    with one_builder(out):
        if out.exists():
            verb = "reused"
        else:
            time.sleep(0.5)  # a slow build: the other process arrives meanwhile
            out.mkdir()
            verb = "built"
        with log.open("a") as f:
            f.write(f"{name} {verb}\\n")
""")


def test_two_processes_wanting_one_artifact_build_it_once(tmp_path):
    out, log = tmp_path / "enc" / "m2v-x", tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(out), str(log), name],
                              env={"PYTHONPATH": str(ROOT)}) for name in ("a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    verbs = sorted(line.split()[1] for line in log.read_text().splitlines())
    assert verbs == ["built", "reused"]
    assert sorted(p.name for p in (tmp_path / "enc").iterdir()) == [".m2v-x.lock", "m2v-x"]
