"""The general tool-retrieval encoder: MiniLM fine-tuned on many public tool-use corpora, built without the
dataset it will be evaluated on (leave-one-dataset-out), as a start for users with no logs.

    python -m tracer.learn.encoders.general --exclude bfcl --mirrors DIR    # prints the checkpoint folder
    python evaluate.py dataset=tau2 embedder=general paths.mirrors=DIR     # built (or found) on first use

Its training pairs come from every source but the excluded ones: the public corpora chosen (``corpora``,
:data:`DEFAULT_CORPORA` unless told, of :mod:`tracer.data.corpora`: a request against each gold tool's text)
and the logged trajectories of the
datasets tracer evaluates on (one pair per decision step, as a per-fold recipe makes them,
:func:`tracer.learn.encoders.pairs.training_pairs`). Excluding a dataset excludes its whole family: BFCL's
single-turn categories go with BFCL multi-turn. Each source gives at most ``per_source`` pairs (a seeded
sample), so no corpus drowns the others and the CPU cost stays bounded. Requests are rendered as tracer_plus
renders a step's context (a request calling several tools: each call after the calls before it,
:func:`steps`), so the anchors look like the live queries the encoder will embed.

Training is :func:`tracer.learn.encoders.transformer.finetuned` (in-batch ranking loss), cached by a content
hash of the pairs, the recipe and the base weights: a second build with the same sources loads the folder.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracer.core.context import ContextRendering
from tracer.core.tool_text import TOOL_TEXTS, check_tool_text
from tracer.core.tool_text import tool_text as render_tool
from tracer.core.types import Tool
from tracer.data.base import load_dataset
from tracer.data.corpora import CORPORA, REPOS, Example, read_corpus, require_clones
from tracer.encode.embedders import SentenceTransformerEmbedder
from tracer.encode.source import DEFAULT_CACHE
from tracer.learn.encoders.pairs import Pairs, training_pairs
from tracer.learn.encoders.recipe import TrainConfig
from tracer.learn.encoders.transformer import finetuned, print_progress, train_info

# the evaluation datasets whose logged trajectories train it (where they are not the one under test)
DATASETS = ("bfcl", "tau2", "apibank")
# the corpora a build reads unless told: NESTFUL and ToolLinkOS, readable too, measured level with them
# (experiments/studies/general_encoder/README.md, answer 1)
DEFAULT_CORPORA = ("bfcl_single", "seal_tools", "apibench", "sgd")
SOURCES = (*CORPORA, *DATASETS)  # every source a build can read
# excluding a dataset excludes every source of its family
FAMILY = {"bfcl": ("bfcl", "bfcl_single"), "tau2": ("tau2",), "apibank": ("apibank",)}
# tracer_plus's vector-query rendering (configs/scorer/tracer_plus.yaml), as the per-fold recipes use it
RENDERING = {"window": "since_user", "calls": "names", "results": "none", "join_users": True}
# at most this many pairs a source (a seeded sample): the tens of minutes of a CPU build
PER_SOURCE = 1000
# tools read with their parameters' names and descriptions, in training and in serving (tracer.core.tool_text)
TOOL_TEXT = "parameters"
TRAIN = {"batch_size": 64, "lr": 2.0e-5, "warmup": 0.1, "epochs": 1, "max_seq_length": 128, "seed": 0}


def _names(exclude: str | Sequence[str] | None) -> tuple:
    return () if exclude is None else (exclude,) if isinstance(exclude, str) else tuple(exclude)


def sources_without(exclude: str | Sequence[str] | None,
                    corpora: Sequence[str] = DEFAULT_CORPORA) -> tuple[str, ...]:
    """The sources left, ``corpora`` then the evaluation datasets, once every family in ``exclude`` (dataset
    or source names) is removed. A name that is no source (your own dataset, ``embedder=general`` under
    ``dataset=jsonl``), or ``None``, leaves nothing out."""
    exclude = _names(exclude)
    bad = [e for e in exclude if not isinstance(e, str) or not e]
    if bad:
        raise ValueError(f"general encoder: exclude must name datasets or sources, got {bad}")
    unknown = [c for c in _names(corpora) if c not in CORPORA]
    if unknown or not _names(corpora):
        raise ValueError(f"general encoder: corpora must name one or more of {', '.join(CORPORA)}, got "
                         f"{list(_names(corpora))}")
    gone = {s for e in exclude for s in FAMILY.get(e, (e,))}
    return tuple(s for s in dict.fromkeys((*_names(corpora), *DATASETS)) if s not in gone)


def source_pairs(source: str, mirrors: str | Path, datasets: str | Path,
                 rendering: ContextRendering, tool_text: str = TOOL_TEXT) -> Pairs:
    """Every pair of one source: a corpus's requests, each call's step rendered as a context, against its
    tool's text (rendered as ``tool_text``), or a dataset's successful trajectories step by step."""
    if source in DATASETS:
        kwargs = {"execute": False} if source == "bfcl" else {"path": Path(datasets) / source}
        ds = load_dataset(source, **kwargs)
        return training_pairs(ds.trajectories, ds.registry, rendering, tool_text=tool_text)
    rows = [(rendering.render(context), render_tool(tool, tool_text), f"{source}:{ex.id}")
            for ex in read_corpus(source, mirrors) for context, tool in steps(ex)]
    return Pairs(*(tuple(col) for col in zip(*rows))) if rows else Pairs((), (), ())


def steps(example: Example) -> list[tuple[list[dict], Tool]]:
    """A request's decision steps: each gold tool, in the order called, after the request and the calls
    before it (a later step's context, as a logged trajectory renders it), so that the encoder also learns
    what follows a call, not only what a request asks first."""
    context: list[dict] = [{"role": "user", "content": example.query}]
    out = []
    for tool in example.golds:
        out.append((context, tool))
        context = [*context, {"role": "assistant", "content": "",
                              "tool_calls": [{"function": {"name": tool.name, "arguments": "{}"}}]}]
    return out


def sample(pairs: Pairs, n: int, seed: int) -> Pairs:
    """At most ``n`` pairs, a seeded sample in the original order."""
    if len(pairs) <= n:
        return pairs
    keep = sorted(random.Random(seed).sample(range(len(pairs)), n))
    return Pairs(*(tuple(getattr(pairs, f)[i] for i in keep) for f in ("anchors", "positives",
                                                                         "trajectory_ids")))


def general_pairs(exclude: str | Sequence[str] | None, mirrors: str | Path, datasets: str | Path,
                  per_source: int = PER_SOURCE, seed: int = 0, tool_text: str = TOOL_TEXT,
                  corpora: Sequence[str] = DEFAULT_CORPORA) -> tuple[Pairs, dict[str, int]]:
    """The training pairs of ``corpora`` and the datasets without ``exclude``'s families, and how many each
    source gave."""
    rendering = ContextRendering.from_config(RENDERING)
    sources = sources_without(exclude, corpora)
    require_clones((REPOS[s] for s in sources if s in REPOS), mirrors)  # every one missing, before any work
    parts = {s: sample(source_pairs(s, mirrors, datasets, rendering, tool_text), per_source, seed)
             for s in sources}
    return Pairs.cat(list(parts.values())), {s: len(p) for s, p in parts.items()}


def build(exclude: str | Sequence[str] | None = (), mirrors: str | Path = "data/mirrors",
          datasets: str | Path = "../shared/datasets", per_source: int = PER_SOURCE,
          train: Mapping[str, Any] | None = None, encoder_dir: str | Path = DEFAULT_CACHE,
          device: str | None = None, log: Callable[[dict], None] | None = None,
          tool_text: str = TOOL_TEXT,
          corpora: Sequence[str] = DEFAULT_CORPORA) -> tuple[Path, dict[str, int]]:
    """The general encoder's checkpoint folder without ``exclude`` (trained on a miss, found on a hit) and
    the pairs each source gave it."""
    pairs, counts = general_pairs(exclude, mirrors, datasets, per_source,
                                  int((train or TRAIN).get("seed", 0)), check_tool_text(tool_text), corpora)
    return finetuned(pairs, TrainConfig(**(train or TRAIN)), None, encoder_dir, device, log,
                     record={"tool_text": tool_text}), counts


def embedder(exclude: str | Sequence[str] | None = (), mirrors: str | Path = "data/mirrors",
             datasets: str | Path = "../shared/datasets", per_source: int = PER_SOURCE,
             train: Mapping[str, Any] | None = None, encoder_dir: str | Path = DEFAULT_CACHE,
             batch_size: int = 64, device: str | None = None, name: str | None = None,
             tool_text: str = TOOL_TEXT,
             corpora: Sequence[str] = DEFAULT_CORPORA) -> SentenceTransformerEmbedder:
    """The general encoder as an embedder (``embedder=general``), built first when not cached. Its
    ``loads_as`` is the plain config of the checkpoint folder (:func:`tracer.build.build_embedder` keeps it):
    a saved index carries the folder and loads it, building nothing."""
    excluded = _names(exclude)
    folder, _ = build(excluded, mirrors, datasets, per_source, train, encoder_dir, device,
                      tool_text=tool_text, corpora=tuple(corpora))
    name = name or "general-without-" + "+".join(sorted(excluded) or ["none"])
    emb = SentenceTransformerEmbedder(str(folder), batch_size, device, name=name, tool_text=tool_text)
    emb.loads_as = {"_target_": "tracer.encode.embedders.SentenceTransformerEmbedder", "model": str(folder),
                    "batch_size": batch_size, "device": device, "name": name, "tool_text": tool_text}
    return emb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exclude", nargs="*", default=[], choices=SOURCES, help="datasets or sources left out")
    ap.add_argument("--mirrors", default="data/mirrors", help="folder of the corpora's git clones")
    ap.add_argument("--datasets", default="../shared/datasets", help="folder holding tau2/ and apibank/")
    ap.add_argument("--per-source", type=int, default=PER_SOURCE)
    ap.add_argument("--encoder-dir", default=str(DEFAULT_CACHE))
    ap.add_argument("--tool-text", default=TOOL_TEXT, choices=TOOL_TEXTS, help="how tools read to it")
    ap.add_argument("--corpora", nargs="+", default=list(DEFAULT_CORPORA), choices=list(CORPORA),
                    help="the public corpora it reads (docs/data.md)")
    a = ap.parse_args()
    folder, counts = build(a.exclude, a.mirrors, a.datasets, a.per_source, encoder_dir=a.encoder_dir,
                           log=print_progress(), tool_text=a.tool_text, corpora=a.corpora)
    info = train_info(folder)
    print(json.dumps({"checkpoint": str(folder), "exclude": a.exclude, "tool_text": a.tool_text,
                      "corpora": a.corpora,
                      "pairs": counts, "batches": info["batches"], "train_seconds": info["train_seconds"]}))


if __name__ == "__main__":
    main()
