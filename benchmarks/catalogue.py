"""A registry of over 100k real tools from public API catalogues, for the registry-scale benchmark.

    python -m benchmarks.catalogue --mirrors DIR      # writes data/catalogue/tools.jsonl (git-ignored)

``DIR`` holds git clones named ``owner+name`` (or ``owner+name/repo``, as the fetch tool leaves them) of the
repositories below; each is read at its ``HEAD`` with ``git show``, so a bare clone is enough. Sources (their
readers in ``benchmarks/catalogue_sources.py``), in the order their tools are kept (a later tool whose name is
taken is dropped); licenses in docs/data.md:

================================================  ==========================================================
``bfcl_eval`` (installed)                         BFCL v4 function documents of every non-multi-turn category
``boto/botocore``                                 AWS: every operation of each service's newest API version
``stackql/stackql-provider-registry``             OpenAPI operations of Azure, Google, Cloudflare, GitHub, ...
                                                  (its ``aws`` provider left out: botocore has AWS)
``googleapis/googleapis``                         gRPC methods of Google's APIs with their doc comments
``fairyshine/Seal-Tools``                         4,076 generated tools (``tool.jsonl``)
``twilio/twilio-oai``                             Twilio's OpenAPI operations
``ShishirPatil/gorilla``                          APIBench: Hugging Face, TensorFlow Hub and Torch Hub models
``oracle/oci-python-sdk``                         Oracle Cloud: every client method with its docstring's
                                                  summary
``aliyun/aliyun-openapi-meta``                    Alibaba Cloud actions (no summary upstream: name,
                                                  product and parameter names make the description)
``TencentCloud/tencentcloud-sdk-python-intl-en``  Tencent Cloud (international SDK): every client method of
                                                  each product's newest API version, its docstring's summary
                                                  and its request model's parameters
================================================  ==========================================================

A tool's description is its source's summary (HTML tags and Markdown links removed, at most
``MAX_DESC`` characters), its parameters the names, types and descriptions of its inputs. Names are made
OpenAI-valid (``[A-Za-z0-9_-]``, at most 64 characters; a long one keeps a hash suffix).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.catalogue_sources import SOURCES, bfcl_docs
from tracer.core.types import Registry, Tool
from tracer.data.base import Dataset
from tracer.data.corpora import Clone
from tracer.data.pool import distractor_pool, pool_registry

OUT = Path("data/catalogue/tools.jsonl")


def prepare(mirrors: Path, out: Path = OUT, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Write the catalogue (one OpenAI-format tool per line, with ``source``); returns tools per source.
    ``skip``: repositories (``owner/name``) to leave out."""
    unknown = set(skip) - {slug for slug, _ in SOURCES}
    if unknown:
        raise ValueError(f"--skip {', '.join(sorted(unknown))}: not a source "
                         f"({', '.join(s for s, _ in SOURCES)})")
    # every mirror checked before any work
    repos = [(Clone(mirrors, slug), fn) for slug, fn in SOURCES if slug not in skip]
    seen: set[str] = set()
    counts: dict[str, int] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w") as fh:
        streams = [("bfcl_eval", bfcl_docs())] + [(f"{r.slug}@{r.head()[:12]}", fn(r)) for r, fn in repos]
        for label, stream in streams:
            for t in stream:
                if t["name"] in seen or not t["description"]:
                    continue
                seen.add(t["name"])
                counts[label] = counts.get(label, 0) + 1
                fh.write(json.dumps(t) + "\n")
            print(f"{label}: {counts.get(label, 0)} tools", flush=True)
    tmp.replace(out)
    return counts


def load_catalogue(path: Path = OUT) -> list[Tool]:
    """The prepared catalogue's tools, in file order."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: run `python -m benchmarks.catalogue --mirrors DIR` first")
    tools = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        t = json.loads(line)
        try:
            tools.append(Tool(t["name"], t["description"], t["parameters"], t["source"]))
        except KeyError as e:
            raise ValueError(f"{path}:{i}: missing field {e}") from None
    return tools


def with_distractors(registry: Registry, catalogue: list[Tool], size: int | None, seed: int = 0) -> Registry:
    """``registry`` grown to ``size`` tools by catalogue tools in a seeded order (nested: a smaller size is a
    prefix of a larger one); names already taken are skipped; ``None``: every catalogue tool."""
    ds = Dataset("catalogue", registry, ())
    source = Dataset("catalogue", Registry(catalogue), ())
    if size is None:
        size = len(registry) + len(distractor_pool(registry, [source]))
    return pool_registry(ds, size, [source], seed).registry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirrors", type=Path, required=True, help="folder of owner+name git clones")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--skip", nargs="*", default=[], help="sources (owner/name) to leave out")
    args = ap.parse_args()
    counts = prepare(args.mirrors, args.out, tuple(args.skip))
    print(f"{sum(counts.values())} tools -> {args.out}")


if __name__ == "__main__":
    main()
