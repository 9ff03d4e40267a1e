"""What ``tracer serve`` and ``tracer mcp`` share: the saved index they serve, how many of its tools they
present, and the holder that swaps in a newer version of the index while they run."""

from __future__ import annotations

import argparse
from pathlib import Path

from tracer.retriever import Retriever
from tracer.serve.reload import IndexHolder


def add_index_arguments(p: argparse.ArgumentParser, k_help: str, sticky_help: str) -> None:
    """``--index``, ``--k``, ``--no-sticky`` and ``--device``, with each server's own help for the two whose
    meaning differs between them."""
    p.add_argument("--index", required=True, type=Path, help="a saved index directory (Retriever.save)")
    p.add_argument("--k", type=int, default=5, help=k_help)
    p.add_argument("--no-sticky", dest="sticky", action="store_false", help=sticky_help)
    p.add_argument("--device", default="cpu")


def check_k(args: argparse.Namespace) -> None:
    """A k below 1 is refused before anything is loaded or served."""
    if args.k < 1:
        raise SystemExit(f"--k {args.k}: must be at least 1")


def index_holder(args: argparse.Namespace) -> IndexHolder:
    """The saved index the arguments name, loaded with their k and device, and held for reloads."""
    return IndexHolder(args.index, lambda d: Retriever.load(d, k=args.k, device=args.device))
