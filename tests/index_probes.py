"""What the saved-index tests (test_portable_index.py, test_carried_encoders.py) give an index and ask of it:
the example dataset, an offline environment for the processes they start, a fresh encoder folder holding
a distillation by link, live conversations over data/example's six tools, and a retriever's answers
to them (selection, ranking, context embedding, encoder names)."""

from __future__ import annotations

import os
from pathlib import Path

from builders import ROOT

from tracer.retriever import Retriever

EXAMPLE = ROOT / "data" / "example"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}


def linked_distillation(enc: Path, model: Path | None = None) -> None:
    """The model2vec distillation of ``model`` (None: MiniLM; the static recipes' start, built once in
    .cache/encoders) linked into a fresh encoder folder, so deleting that folder deletes every trained encoder
    and no shared one."""
    from tracer.encode.static import distilled

    start = distilled(model).resolve()
    enc.mkdir(parents=True)
    (enc / start.name).symlink_to(start)


def conversations() -> list[list[dict]]:
    """Live conversations over data/example's six tools, mid-task and at a turn's start."""

    def call(i: int, name: str) -> list[dict]:
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"},
        ]

    flight = {"role": "user", "content": "Find a flight from SFO to JFK and book it"}
    return [
        [flight],
        [flight, *call(0, "search_flights")],
        [{"role": "user", "content": "What's the weather?"}],
        [{"role": "user", "content": "email the files to Ann"}, *call(0, "list_files")],
        [
            flight,
            *call(0, "search_flights"),
            *call(1, "book_flight"),
            {"role": "user", "content": "cancel that booking please"},
        ],
    ]


def answers(r: Retriever) -> dict:
    return {
        "answers": [
            {"select": list(r.select_ids(m)), "rank": r.rank(m), "vec": r.context_embedding(m).tolist()}
            for m in conversations()
        ],
        "encoders": [r.res.embedder.name] + ([r.res.slow.embedder.name] if r.res.slow is not None else []),
    }
