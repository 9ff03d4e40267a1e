"""Schema-Guided Dialogue (SGD): each service call of a dialogue, with the user turn that opened its
intent."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from tracer.core.errors import DataError
from tracer.core.types import Tool
from tracer.data.corpora.source import Clone, Example, clip, malformed, schema

SGD_REPO = "google-research-datasets/dstc8-schema-guided-dialogue"
SGD_SPLITS = ("train", "dev", "test")


def _intents(service: dict) -> dict[tuple[str, str], Tool]:
    """A service's intents as tools: each one's description, its required and optional slots with theirs."""
    name = service["service_name"]
    slots = {s["name"]: {"description": s.get("description")} for s in service.get("slots") or ()}
    out = {}
    for it in service.get("intents") or ():
        params = [*(it.get("required_slots") or ()), *(it.get("optional_slots") or {})]
        params_schema = schema({"properties": {p: slots.get(p, {}) for p in params}})
        out[name, it["name"]] = Tool(it["name"], clip(it.get("description")), params_schema, source=name)
    return out


def _calls(dialogue: dict, tools: dict[tuple[str, str], Tool]) -> Iterator[Example]:
    """A dialogue's service calls of known intents, each with the user turn that opened its intent."""
    asked: dict[tuple[str, str], str] = {}  # (service, intent) -> the user turn that opened it
    for i, turn in enumerate(dialogue.get("turns") or ()):
        frames = [f for f in turn.get("frames") or () if isinstance(f, dict)]
        if turn.get("speaker") == "USER":
            for f in frames:
                key = (f.get("service"), (f.get("state") or {}).get("active_intent"))
                asked.setdefault(key, clip(turn.get("utterance")))
            continue
        calls = dict.fromkeys((f.get("service"), f["service_call"].get("method")) for f in frames
                              if isinstance(f.get("service_call"), dict))
        for call in (c for c in calls if c in tools and asked.get(c)):
            yield Example(asked[call], (tools[call],), "sgd", f"{dialogue.get('dialogue_id')}-{i}")


def sgd(mirrors: str | Path) -> Iterator[Example]:
    """Schema-Guided Dialogue: each service call of a dialogue, with the user turn that opened its intent (the
    request, not the "yes, that's right" that confirms it), against the called intent: its name, its
    description, its required and optional slots with theirs. Services are keyed by name across splits."""
    clone = Clone(mirrors, SGD_REPO)
    tools: dict[tuple[str, str], Tool] = {}
    for split in SGD_SPLITS:
        for j, svc in enumerate(clone.json(path := f"{split}/schema.json", [])):
            try:
                tools.update(_intents(svc))
            except (KeyError, TypeError, AttributeError) as e:
                raise malformed(clone.root / path, f"service {j}", e) from None
    if not tools:
        raise DataError(clone.root / "train/schema.json", "missing or without a service intent")
    dialogues = re.compile(r"(?:{})/dialogues_\d+\.json".format("|".join(SGD_SPLITS)))
    for path in filter(dialogues.fullmatch, clone.files()):
        for j, dialogue in enumerate(clone.json(path, [])):
            try:
                yield from list(_calls(dialogue, tools))
            except (KeyError, TypeError, AttributeError) as e:
                raise malformed(clone.root / path, f"dialogue {j}", e) from None
