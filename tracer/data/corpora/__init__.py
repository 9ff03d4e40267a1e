"""Public tool-retrieval corpora: requests paired with the tools that answer them, for the general encoder.

Each corpus gives :class:`Example`s (a user request, its gold tools in the order called, where it came from),
read from data that ships with a package or from a git clone; :mod:`tracer.learn.encoders.general` turns them
into training pairs. No ToolBench/RapidAPI-derived data. Sources and licenses (docs/data.md):

==============  ========================================================  =========================
``bfcl_single``  BFCL v4's single-turn categories (simple, multiple,       the installed ``bfcl_eval``
                 parallel, their ``live_*`` variants of user-contributed
                 functions): the question and its ground-truth functions
``seal_tools``   Seal-Tools' requests with the APIs they call               ``fairyshine/Seal-Tools``
``apibench``     APIBench's instructions with the model API that answers   ``ShishirPatil/gorilla``
                 them (Hugging Face, TensorFlow Hub, Torch Hub)
``sgd``          Schema-Guided Dialogue: each service call with the user   ``google-research-datasets/
                 turn that opened its intent                                dstc8-schema-guided-dialogue``
``nestful``      NESTFUL's nested call sequences (Glaive's and SGD's       ``IBM/NESTFUL``
                 functions; not its RapidAPI part)
``toollinkos``   ToolLinkOS's requests: the main tool after the tools      ``EliasLumer/Graph-RAG-Tool-
                 whose output it needs                                      Fusion-ToolLinkOS``
==============  ========================================================  =========================

A clone is found under ``mirrors`` as ``owner+name`` (a checkout, or a bare repository, also as
``owner+name/repo``) and read at ``HEAD`` (:class:`Clone`, which ``benchmarks/catalogue.py`` reads its
mirrors with too). A missing clone is an error naming the folder and the repository to clone; a file a
snapshot left out (large blobs) is skipped.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from tracer.data.corpora.chains import NESTFUL_REPO, TOOLLINKOS_REPO, nestful, toollinkos
from tracer.data.corpora.requests import (
    BFCL_SINGLE,
    GORILLA_REPO,
    SEAL_TOOLS_REPO,
    apibench,
    bfcl_single,
    seal_tools,
)
from tracer.data.corpora.sgd import SGD_REPO, sgd
from tracer.data.corpora.source import Clone, Example, require_clones

__all__ = ["BFCL_SINGLE", "CORPORA", "REPOS", "Clone", "Example", "apibench", "bfcl_single", "nestful",
           "read_corpus", "require_clones", "seal_tools", "sgd", "toollinkos"]

CORPORA: dict[str, Callable[[str | Path], Iterator[Example]]] = {
    "bfcl_single": lambda mirrors: bfcl_single(), "seal_tools": seal_tools, "apibench": apibench, "sgd": sgd,
    "nestful": nestful, "toollinkos": toollinkos}
# the git clone each corpus reads (bfcl_single ships in the bfcl-eval package)
REPOS = {"seal_tools": SEAL_TOOLS_REPO, "apibench": GORILLA_REPO, "sgd": SGD_REPO, "nestful": NESTFUL_REPO,
         "toollinkos": TOOLLINKOS_REPO}


def read_corpus(name: str, mirrors: str | Path) -> list[Example]:
    """Every example of corpus ``name`` (a key of :data:`CORPORA`)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}: one of {sorted(CORPORA)}")
    return list(CORPORA[name](mirrors))


def main() -> None:
    """``python -m tracer.data.corpora --mirrors DIR``: per corpus, its requests, pairs (one per gold tool)
    and distinct tool texts, as docs/data.md reports them."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--mirrors", default="data/mirrors")
    a = ap.parse_args()
    for name in CORPORA:
        ex = read_corpus(name, a.mirrors)
        texts = {t.search_text for e in ex for t in e.golds}
        print(json.dumps({"corpus": name, "requests": len(ex), "pairs": sum(len(e.golds) for e in ex),
                          "tool_texts": len(texts)}))
