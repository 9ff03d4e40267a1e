"""Readings of the gateway process and the machine: a process's RSS, threads, fds and CPU time (/proc), a
directory's bytes, Prometheus text, the CPU and memory, and the long options a command's --help lists."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.soak.constants import ROOT, MiB


def proc_status(pid: int) -> dict[str, float]:
    """RSS (MB), threads, open fds and CPU seconds of a live process (Linux /proc)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss_mb"] = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def dir_bytes(path: Path) -> tuple[int, int, int]:
    """(apparent bytes, bytes allocated on disk, files) under ``path``."""
    size = disk = files = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(dirpath, n))
                size, disk, files = size + st.st_size, disk + st.st_blocks * 512, files + 1
    return size, disk, files


METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value}, histogram buckets and _created left out."""
    out = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m and not m.group(1).endswith(("_bucket", "_created")):
            with contextlib.suppress(ValueError):
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError, IndexError):
        mem = f"{int(Path('/proc/meminfo').read_text().split()[1]) / MiB:.1f} GiB"
    return {"cpu": model, "cores": os.cpu_count(), "memory": mem, "python": sys.version.split()[0]}


def help_flags(cmd: list[str], env: dict[str, str]) -> set[str]:
    """The long options a command's --help lists."""
    out = subprocess.run([*cmd, "--help"], check=False, env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} --help failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout))
