"""Where a loader's relative data path points.

A relative path is looked up against the current working directory first, then against the
repository root (the folder holding ``pyproject.toml``, found upward from this file). That way the
default ``../shared/datasets/...`` works both from the repository root and from anywhere else in
a checkout, for example from a test's or Hydra's working directory. Hydra runs take the data root
from ``paths.datasets`` (``tracer/configs/paths/default.yaml``; ``python evaluate.py paths.datasets=DIR``);
the loaders' own defaults serve plain-Python calls such as ``load_dataset("tau2")``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from tracer.core.errors import DataError


@lru_cache(maxsize=1)
def repo_root() -> Path | None:
    """The closest folder above this file that holds ``pyproject.toml`` (None when installed elsewhere)."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


def resolve_path(path: str | Path, kind: str = "directory") -> Path:
    """The existing location of ``path``: as given if absolute, else under the cwd, else under the repo root.

    Raises:
        DataError: nothing exists at any candidate; the message lists every place looked at.
    """
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p]
    root = repo_root()
    if not p.is_absolute() and root is not None and root / p not in candidates:
        candidates.append(root / p)
    for c in candidates:
        if (c.is_dir() if kind == "directory" else c.exists()):
            return c
    looked = " and ".join(str(c) for c in candidates)
    raise DataError(path, f"{kind} not found (looked at {looked})")
