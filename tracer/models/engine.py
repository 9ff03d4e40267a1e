"""The inference engine: ``llama-cpp-python[server]`` in its own virtual environment under the cache.

It is built from PyPI's sdist, which vendors llama.cpp (a C++ compiler and cmake are needed), with
``CMAKE_ARGS=-DGGML_NATIVE=ON`` so that llama.cpp uses every instruction this CPU has. It lives in
``<models_dir>/engine-venv``, never in the project's ``.venv``: a fresh clone's ``make test`` does not need
it, and a build that takes half an hour on a loaded 2-core machine is done once per machine. The build's
seconds are written to ``engine-venv/tracer-build.json``.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tracer.models.catalogue import models_dir

ENGINE_REQUIREMENT = "llama-cpp-python[server]==0.3.36"
CMAKE_ARGS = "-DGGML_NATIVE=ON"


class EngineError(RuntimeError):
    """The engine is not built, or its build failed."""


def engine_dir(root: Path | None = None) -> Path:
    return (root or models_dir()) / "engine-venv"


def engine_python(root: Path | None = None) -> Path | None:
    """The engine's Python when it can import ``llama_cpp.server``, else ``None``."""
    python = engine_dir(root) / "bin" / "python"
    if not python.is_file():
        return None
    probe = subprocess.run([str(python), "-c", "import llama_cpp.server.app"], capture_output=True,
                           check=False, timeout=120)
    return python if probe.returncode == 0 else None


def build_engine(root: Path | None = None, requirement: str = ENGINE_REQUIREMENT,
                 cmake_args: str = CMAKE_ARGS, log: Path | None = None) -> Path:
    """Create the engine's venv and build ``requirement`` in it (``nice -n 19``, from the sdist).

    Returns the engine's Python. The pip output goes to ``log`` (default ``engine-venv/build.log``);
    a failed build raises :class:`EngineError` naming it."""
    venv = engine_dir(root)
    if not (venv / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log = log or venv / "build.log"
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    env = {**os.environ, "CMAKE_ARGS": cmake_args, "CMAKE_BUILD_PARALLEL_LEVEL": jobs}
    command = ["nice", "-n", "19", str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir",
               "--no-binary", "llama-cpp-python", requirement]
    start = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise EngineError(f"building {requirement} failed ({done.returncode}); see {log}")
    python = engine_python(root)
    if python is None:
        raise EngineError(f"built {requirement}, but its Python cannot import llama_cpp.server; see {log}")
    (venv / "tracer-build.json").write_text(json.dumps(
        {"requirement": requirement, "cmake_args": cmake_args, "seconds": round(seconds, 1),
         "load_average": os.getloadavg(), "cpus": os.cpu_count()}))
    return python


def find_or_build_engine(root: Path | None = None) -> Path:
    """The engine's Python, built first when it is missing. Two processes asking at once build it once:
    the second waits on ``engine-venv.lock`` and then finds the first one's build."""
    python = engine_python(root)
    if python is not None:
        return python
    lock = engine_dir(root).with_name("engine-venv.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return engine_python(root) or build_engine(root)
