"""A subcommand whose extra is missing stays listed and says which extra to install (a real process, with the
extra's package made unimportable); the core subcommand runs without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# None in sys.modules makes `import uvicorn` raise ImportError, as if [serve] were not installed
WITHOUT_SERVE = ("import sys; sys.modules['uvicorn'] = None; from tracer.cli import main; "
                 "sys.exit(main(sys.argv[1:]))")


def tracer(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_SERVE, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.slow  # 6-13 s: keeps make test under 5 minutes on a cold clone
def test_serve_without_its_extra_names_the_extra_and_update_still_parses(tmp_path):
    listed = tracer("--help")
    assert listed.returncode == 0 and "{serve,mcp,update,select}" in listed.stdout
    refused = tracer("serve", "--index", "x", "--upstream", "http://127.0.0.1:1/v1")
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("tracer serve needs the [serve] extra (uvicorn is not installed): "
                                           "pip install 'tracer-toolret[serve]'")
    missing = tracer("update", "--index", str(tmp_path / "none"), "--log", str(tmp_path / "log.jsonl"))
    assert (missing.returncode == 2 and missing.stderr.strip().endswith(
        f"{tmp_path / 'none'}: no saved index here (no CURRENT pointer)"))
