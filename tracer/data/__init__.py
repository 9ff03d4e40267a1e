"""Dataset loaders. Each source is one module that registers itself; all return :class:`Dataset`."""

from tracer.data import native  # noqa: F401  (registers "jsonl")
from tracer.data.base import LOADERS, Dataset, load_dataset, register_loader
from tracer.data.native import load_native, read_tools, write_native

for _mod in ("bfcl", "tau2", "apibank"):
    try:
        __import__(f"{__name__}.{_mod}")
    except ModuleNotFoundError as _e:  # a loader module not written yet, never a missing dependency
        if _e.name != f"{__name__}.{_mod}":
            raise

__all__ = [
    "LOADERS", "Dataset", "load_dataset", "load_native", "read_tools", "register_loader", "write_native",
]
