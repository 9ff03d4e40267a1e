"""Public tool-retrieval corpora: requests paired with the tools that answer them, for the general encoder.

Each corpus gives :class:`Example`s (a user request, its gold tools, where it came from), read from data that
ships with a package or from a git clone; :mod:`tracer.learn.encoders.general` turns them into training pairs.
No ToolBench/RapidAPI-derived data. Sources and licenses (docs/data.md):

==============  ========================================================  =========================
``bfcl_single``  BFCL v4's single-turn categories (simple, multiple,       the installed ``bfcl_eval``
                 parallel, their ``live_*`` variants of user-contributed
                 functions): the question and its ground-truth functions
``seal_tools``   Seal-Tools' requests (``dev``, ``test_in_domain``,         a clone of
                 ``test_out_domain``, and ``train`` where present) with     ``fairyshine/Seal-Tools``
                 the APIs they call, over its ``tool.jsonl``
``apibench``     APIBench's instructions with the model API that answers   a clone of
                 them (Hugging Face, TensorFlow Hub, Torch Hub)             ``ShishirPatil/gorilla``
``sgd``          Schema-Guided Dialogue: each service call of a dialogue   a clone of ``google-research-
                 with the user turn that opened its intent, against the    datasets/dstc8-schema-
                 intent (its description and slots)                         guided-dialogue``
==============  ========================================================  =========================

A clone is found under ``mirrors`` as ``owner+name`` (a checkout, or a bare repository, also as
``owner+name/repo``) and read at ``HEAD`` (:class:`Clone`, which ``benchmarks/catalogue.py`` reads its
mirrors with too). A missing clone is an error naming the folder and the repository to clone; a file a
snapshot left out (large blobs) is skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tracer.core.errors import DataError
from tracer.core.types import Tool
from tracer.data.bfcl import data_dir
from tracer.data.native import json_line

# BFCL's single-turn categories with a ground truth (irrelevance, memory, web search have none)
BFCL_SINGLE = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
               "parallel_multiple", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
SEAL_SPLITS = ("train", "dev", "test_in_domain", "test_out_domain")
APIBENCH_FILES = tuple(f"data/apibench/{hub}_{split}.json"
                       for hub in ("huggingface", "tensorflow", "torchhub") for split in ("train", "eval"))
SGD_SPLITS = ("train", "dev", "test")
MAX_DESC = 400
_WS = re.compile(r"\s+")
_INSTRUCTION = re.compile(r"(?:###Instruction:|'Instruction':)\s*(.*?)\s*(?:###Output|, 'Output'|$)",
                          re.DOTALL)


@dataclass(frozen=True)
class Example:
    """One request of a corpus: the user's words, the tools a correct answer calls (at least one)."""

    query: str
    golds: tuple[Tool, ...]
    corpus: str
    id: str


class Clone:
    """A git clone under ``mirrors`` (a checkout or a bare repository), read at ``HEAD`` with git."""

    def __init__(self, mirrors: str | Path, slug: str):
        base = Path(mirrors) / slug.replace("/", "+")
        self.root = base / "repo" if (base / "repo").is_dir() else base
        if not self.root.is_dir():
            raise DataError(base, f"no clone of {slug} (git clone https://github.com/{slug} {base})")
        self.slug = slug

    def _git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, check=check)

    def read(self, path: str) -> bytes | None:
        """A file's bytes; None where the clone lacks it (a snapshot may leave large files out)."""
        r = self._git("show", f"HEAD:{path}", check=False)
        return r.stdout if r.returncode == 0 else None

    def text(self, path: str) -> str | None:
        """A file's text (undecodable bytes replaced), None as :meth:`read`."""
        data = self.read(path)
        return None if data is None else data.decode("utf-8", "replace")

    def files(self, prefix: str = "") -> list[str]:
        """The paths at ``HEAD`` under ``prefix``."""
        under = [prefix] if prefix else []  # git refuses an empty path
        return self._git("ls-tree", "-r", "--name-only", "HEAD", *under).stdout.decode().split()

    def head(self) -> str:
        return self._git("rev-parse", "HEAD").stdout.decode().strip()


def _text(value: object) -> str:
    return _WS.sub(" ", str(value or "")).strip()[:MAX_DESC]


def _schema(value: object) -> dict:
    """A parameters schema's top-level properties, each kept to its description (clipped as descriptions
    are): what a tool's ``parameters`` rendering reads (:mod:`tracer.core.tool_text`)."""
    props = value.get("properties") if isinstance(value, dict) else None
    return {"type": "object", "properties": {
        str(k): {"description": _text(p.get("description") if isinstance(p, dict) else "")}
        for k, p in (props if isinstance(props, dict) else {}).items()}}


def _lines(data: bytes | None, where: str | Path) -> Iterator[dict]:
    """The objects of a JSON-lines file (bytes); a bad line is a DataError naming ``where`` and the line."""
    start = 0
    for i, raw in enumerate((data or b"").split(b"\n"), 1):
        if (row := json_line(where, raw, i, start)) is not None:
            yield row
        start += len(raw) + 1


def bfcl_single(categories: tuple[str, ...] = BFCL_SINGLE) -> Iterator[Example]:
    """BFCL's single-turn questions: the first turn's user messages, and each function of the ground truth
    (by name among the functions the question offers)."""
    root = data_dir()
    for cat in categories:
        gold = root / "possible_answer" / f"BFCL_v4_{cat}.json"
        answers = {a["id"]: a["ground_truth"] for a in _lines(gold.read_bytes(), gold)}
        for q in _lines((root / f"BFCL_v4_{cat}.json").read_bytes(), root / f"BFCL_v4_{cat}.json"):
            offered = {f["name"]: Tool(f["name"], _text(f.get("description")), _schema(f.get("parameters")),
                                       source="bfcl_single") for f in q["function"]}
            names = dict.fromkeys(name for call in answers.get(q["id"], []) for name in call)
            golds = tuple(offered[n] for n in names if n in offered)
            query = " ".join(m["content"] for m in q["question"][0] if m.get("role") == "user")
            if golds and query.strip():
                yield Example(_text(query), golds, "bfcl_single", q["id"])


def seal_tools(mirrors: str | Path) -> Iterator[Example]:
    """Seal-Tools' requests and the APIs their calls name (nested calls included), over ``tool.jsonl``."""
    clone = Clone(mirrors, "fairyshine/Seal-Tools")
    where = clone.root / "Seal-Tools_Dataset" / "tool.jsonl"
    tools = {str(t["api_name"]): Tool(str(t["api_name"]), _text(t.get("api_description")),
                                      _schema({"properties": t.get("parameters")}), source="seal_tools")
             for t in _lines(clone.read("Seal-Tools_Dataset/tool.jsonl"), where) if t.get("api_name")}
    if not tools:
        raise DataError(where, "missing or without a tool (api_name)")
    for split in SEAL_SPLITS:
        path = f"Seal-Tools_Dataset/{split}.jsonl"
        for i, ex in enumerate(_lines(clone.read(path), clone.root / path)):
            names = dict.fromkeys(c.get("api") for c in ex.get("calling") or [] if isinstance(c, dict))
            golds = tuple(tools[n] for n in names if n in tools)
            if golds and str(ex.get("query", "")).strip():
                yield Example(_text(ex["query"]), golds, "seal_tools", str(ex.get("id") or f"{split}-{i}"))


def apibench(mirrors: str | Path) -> Iterator[Example]:
    """APIBench's instructions, each with the model API (name: functionality and description) that answers
    it; one tool per hub and API name."""
    clone = Clone(mirrors, "ShishirPatil/gorilla")
    for path in APIBENCH_FILES:
        hub = Path(path).stem.rsplit("_", 1)[0]
        for i, ex in enumerate(_lines(clone.read(path), clone.root / path)):
            api, m = ex.get("api_data") or {}, _INSTRUCTION.search(str(ex.get("code", "")))
            if not (m and m.group(1).strip() and api.get("api_name")):
                continue
            name = re.sub(r"[^A-Za-z0-9_-]+", "_", f"{hub}_{api['api_name']}").strip("_")[:64]
            desc = _text(f"{api.get('functionality', '')}. {api.get('description', '')}")
            yield Example(_text(m.group(1)), (Tool(name, desc, source=f"apibench_{hub}"),), "apibench",
                          f"{Path(path).stem}-{i}")


def _sgd_json(clone: Clone, path: str) -> list:
    text = clone.text(path)
    try:
        return json.loads(text) if text else []
    except json.JSONDecodeError as e:
        raise DataError(clone.root / path, f"not JSON: {e}") from None


def _sgd_intents(service: dict) -> dict[tuple[str, str], Tool]:
    """A service's intents as tools: each one's description, its required and optional slots with theirs."""
    name = service["service_name"]
    slots = {s["name"]: {"description": s.get("description")} for s in service.get("slots") or ()}
    out = {}
    for it in service.get("intents") or ():
        params = [*(it.get("required_slots") or ()), *(it.get("optional_slots") or {})]
        schema = _schema({"properties": {p: slots.get(p, {}) for p in params}})
        out[name, it["name"]] = Tool(it["name"], _text(it.get("description")), schema, source=name)
    return out


def _sgd_calls(dialogue: dict, tools: dict[tuple[str, str], Tool]) -> Iterator[Example]:
    """A dialogue's service calls of known intents, each with the user turn that opened its intent."""
    asked: dict[tuple[str, str], str] = {}  # (service, intent) -> the user turn that opened it
    for i, turn in enumerate(dialogue.get("turns") or ()):
        frames = [f for f in turn.get("frames") or () if isinstance(f, dict)]
        if turn.get("speaker") == "USER":
            for f in frames:
                key = (f.get("service"), (f.get("state") or {}).get("active_intent"))
                asked.setdefault(key, _text(turn.get("utterance")))
            continue
        calls = dict.fromkeys((f.get("service"), f["service_call"].get("method")) for f in frames
                              if isinstance(f.get("service_call"), dict))
        for call in (c for c in calls if c in tools and asked.get(c)):
            yield Example(asked[call], (tools[call],), "sgd", f"{dialogue.get('dialogue_id')}-{i}")


def _malformed(where: Path, what: str, e: Exception) -> DataError:
    return DataError(where, f"{what}: malformed ({type(e).__name__}: {e})")


def sgd(mirrors: str | Path) -> Iterator[Example]:
    """Schema-Guided Dialogue: each service call of a dialogue, with the user turn that opened its intent (the
    request, not the "yes, that's right" that confirms it), against the called intent: its name, its
    description, its required and optional slots with theirs. Services are keyed by name across splits."""
    clone = Clone(mirrors, "google-research-datasets/dstc8-schema-guided-dialogue")
    tools: dict[tuple[str, str], Tool] = {}
    for split in SGD_SPLITS:
        for j, svc in enumerate(_sgd_json(clone, path := f"{split}/schema.json")):
            try:
                tools.update(_sgd_intents(svc))
            except (KeyError, TypeError, AttributeError) as e:
                raise _malformed(clone.root / path, f"service {j}", e) from None
    if not tools:
        raise DataError(clone.root / "train/schema.json", "missing or without a service intent")
    dialogues = re.compile(r"(?:{})/dialogues_\d+\.json".format("|".join(SGD_SPLITS)))
    for path in filter(dialogues.fullmatch, clone.files()):
        for j, dialogue in enumerate(_sgd_json(clone, path)):
            try:
                yield from list(_sgd_calls(dialogue, tools))
            except (KeyError, TypeError, AttributeError) as e:
                raise _malformed(clone.root / path, f"dialogue {j}", e) from None


CORPORA = {"bfcl_single": lambda mirrors: bfcl_single(), "seal_tools": seal_tools, "apibench": apibench,
           "sgd": sgd}


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


if __name__ == "__main__":
    main()
