"""Corpora of single requests, each with the tools that answer it: BFCL's single-turn categories,
Seal-Tools and APIBench."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from tracer.core.errors import DataError
from tracer.core.types import Tool
from tracer.data.bfcl import data_dir
from tracer.data.corpora.source import Clone, Example, clip, json_lines, schema

# BFCL's single-turn categories with a ground truth (irrelevance, memory, web search have none)
BFCL_SINGLE = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
               "parallel_multiple", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
SEAL_SPLITS = ("train", "dev", "test_in_domain", "test_out_domain")
APIBENCH_FILES = tuple(f"data/apibench/{hub}_{split}.json"
                       for hub in ("huggingface", "tensorflow", "torchhub") for split in ("train", "eval"))
SEAL_TOOLS_REPO = "fairyshine/Seal-Tools"
GORILLA_REPO = "ShishirPatil/gorilla"
_INSTRUCTION = re.compile(r"(?:###Instruction:|'Instruction':)\s*(.*?)\s*(?:###Output|, 'Output'|$)",
                          re.DOTALL)


def bfcl_single(categories: tuple[str, ...] = BFCL_SINGLE) -> Iterator[Example]:
    """BFCL's single-turn questions: the first turn's user messages, and each function of the ground truth
    (by name among the functions the question offers)."""
    root = data_dir()
    for cat in categories:
        gold = root / "possible_answer" / f"BFCL_v4_{cat}.json"
        answers = {a["id"]: a["ground_truth"] for a in json_lines(gold.read_bytes(), gold)}
        for q in json_lines((root / f"BFCL_v4_{cat}.json").read_bytes(), root / f"BFCL_v4_{cat}.json"):
            offered = {f["name"]: Tool(f["name"], clip(f.get("description")), schema(f.get("parameters")),
                                       source="bfcl_single") for f in q["function"]}
            names = dict.fromkeys(name for call in answers.get(q["id"], []) for name in call)
            golds = tuple(offered[n] for n in names if n in offered)
            query = " ".join(m["content"] for m in q["question"][0] if m.get("role") == "user")
            if golds and query.strip():
                yield Example(clip(query), golds, "bfcl_single", q["id"])


def seal_tools(mirrors: str | Path) -> Iterator[Example]:
    """Seal-Tools' requests and the APIs their calls name (nested calls included), over ``tool.jsonl``."""
    clone = Clone(mirrors, SEAL_TOOLS_REPO)
    where = clone.root / "Seal-Tools_Dataset" / "tool.jsonl"
    tools = {str(t["api_name"]): Tool(str(t["api_name"]), clip(t.get("api_description")),
                                      schema({"properties": t.get("parameters")}), source="seal_tools")
             for t in json_lines(clone.read("Seal-Tools_Dataset/tool.jsonl"), where) if t.get("api_name")}
    if not tools:
        raise DataError(where, "missing or without a tool (api_name)")
    for split in SEAL_SPLITS:
        path = f"Seal-Tools_Dataset/{split}.jsonl"
        for i, ex in enumerate(json_lines(clone.read(path), clone.root / path)):
            names = dict.fromkeys(c.get("api") for c in ex.get("calling") or [] if isinstance(c, dict))
            golds = tuple(tools[n] for n in names if n in tools)
            if golds and str(ex.get("query", "")).strip():
                yield Example(clip(ex["query"]), golds, "seal_tools", str(ex.get("id") or f"{split}-{i}"))


def apibench(mirrors: str | Path) -> Iterator[Example]:
    """APIBench's instructions, each with the model API (name: functionality and description) that answers
    it; one tool per hub and API name."""
    clone = Clone(mirrors, GORILLA_REPO)
    for path in APIBENCH_FILES:
        hub = Path(path).stem.rsplit("_", 1)[0]
        for i, ex in enumerate(json_lines(clone.read(path), clone.root / path)):
            api, m = ex.get("api_data") or {}, _INSTRUCTION.search(str(ex.get("code", "")))
            if not (m and m.group(1).strip() and api.get("api_name")):
                continue
            name = re.sub(r"[^A-Za-z0-9_-]+", "_", f"{hub}_{api['api_name']}").strip("_")[:64]
            desc = clip(f"{api.get('functionality', '')}. {api.get('description', '')}")
            yield Example(clip(m.group(1)), (Tool(name, desc, source=f"apibench_{hub}"),), "apibench",
                          f"{Path(path).stem}-{i}")
