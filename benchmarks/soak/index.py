"""The index (``--role build``, ``--role check``): its cache key, its build, and the check of the updated
index against the original on probe contexts. These import tracer (and torch) in their own process."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

from benchmarks.soak.constants import DATA, ROOT
from benchmarks.soak.traffic import TEMPLATES, fill


def index_key(scorer: str) -> str:
    h = hashlib.sha256(scorer.encode())
    # the dataset and the code that builds and saves an index (not the serving front doors, which do not)
    src = [p for p in (*(ROOT / "tracer").rglob("*.py"), *(ROOT / "tracer").rglob("*.yaml"))
           if p.relative_to(ROOT).parts[1] not in ("serve", "cli")]
    for path in sorted([*DATA.iterdir(), *src]):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build_index(directory: Path, scorer: str) -> None:
    from tracer.retriever import Retriever

    Retriever.from_dataset(DATA, scorer, device="cpu", cache_dir=None).save(directory)


def probe_contexts() -> list[tuple[str, str]]:
    """(user message, the tool it should call first) for each template, slots filled the same way."""
    rng = random.Random(7)
    return [(fill(t[0][0], rng), t[0][1][0]) for t in TEMPLATES]


def check_index(index: Path, original: Path) -> dict[str, Any]:
    """Load the updated index (and the original) and rank the probe contexts with both."""
    from tracer.retriever import Retriever

    before = Retriever.load(original, cache_dir=None, device="cpu")
    after = Retriever.load(index, cache_dir=None, device="cpu")
    probes = []
    for text, want in probe_contexts():
        msgs = [{"role": "user", "content": text}]
        rb, ra = before.rank(msgs), after.rank(msgs)
        probes.append({"context": text, "want": want,
                       "rank_before": rb.index(want) + 1 if want in rb else None,
                       "rank_after": ra.index(want) + 1 if want in ra else None,
                       "top3_before": rb[:3], "top3_after": ra[:3]})
    old = set(before.registry.names)
    return {"loads": True, "tools_before": len(before.registry), "tools_after": len(after.registry),
            "new_tools": [n for n in after.registry.names if n not in old][:100], "probes": probes}
