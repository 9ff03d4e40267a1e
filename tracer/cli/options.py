"""Command-line flags declared by the dataclass they fill, as ``transformers.HfArgumentParser`` does.

A bounds dataclass (``SessionCaps``, ``LogLimits``) is the one place where each bound's name, type, default
and help live: ``field(default=..., metadata={"help": ...})``, with a ``"flag"`` where the flag is not
``prefix`` + the field's name with dashes. :func:`add_fields` adds the flags in field order;
:func:`from_args` builds the dataclass from the parsed namespace (its ``__post_init__`` checks the values).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TypeVar

T = TypeVar("T")


def _flag(f: dataclasses.Field, prefix: str) -> str:
    return f.metadata.get("flag") or prefix + f.name.replace("_", "-")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_fields(parser: argparse.ArgumentParser, cls: type, prefix: str = "--") -> None:
    """One flag per field of ``cls`` that has a ``help``, typed and defaulted as the field."""
    for f in dataclasses.fields(cls):
        if "help" in f.metadata:
            parser.add_argument(_flag(f, prefix), type=type(f.default), default=f.default,
                                help=f.metadata["help"])


def from_args(cls: type[T], args: argparse.Namespace, prefix: str = "--") -> T:
    """``cls`` built from the flags :func:`add_fields` added with the same ``prefix``."""
    values = {f.name: getattr(args, _dest(_flag(f, prefix)))
              for f in dataclasses.fields(cls) if "help" in f.metadata}
    return cls(**values)
