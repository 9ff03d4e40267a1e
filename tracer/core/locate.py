"""A class or function from its dotted path (``tracer.envs.bfcl.BFCLEnvironment``), for records that name
code of a higher layer without importing it (a dataset names its environment, a saved index its scorer)."""

from __future__ import annotations

import importlib
from typing import Any


def locate(path: str, package: str = "tracer") -> Any:
    """The object at ``path``; only inside ``package`` (a saved file must not name arbitrary code)."""
    module, _, name = str(path).rpartition(".")
    if not module or module.split(".")[0] != package:
        raise ValueError(f"{path!r} is not a dotted path inside {package}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{path!r} does not name an object ({e})") from None
