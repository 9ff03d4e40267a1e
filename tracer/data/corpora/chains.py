"""Corpora of requests answered by a chain of calls, where a call needs what an earlier one finds: NESTFUL's
nested sequences and ToolLinkOS's tools with the tools they depend on. They teach the encoder that a request's
first call is often not the tool it names but a lookup before it (a user id before the order, a validated
address before the message)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tracer.core.errors import DataError
from tracer.core.types import Tool
from tracer.data.corpora.source import Clone, Example, clip, malformed, schema

NESTFUL_REPO = "IBM/NESTFUL"
TOOLLINKOS_REPO = "EliasLumer/Graph-RAG-Tool-Fusion-ToolLinkOS"
# NESTFUL's hand-checked sequences over Glaive's and SGD's functions; its "executable" part calls RapidAPI
# endpoints and is left out (no ToolBench/RapidAPI-derived data)
NESTFUL_PARTS = ("glaive", "sgd")
NESTFUL_RESULT = "var_result"  # the last "call" of a sequence: the answer assembled from the labels
TOOLLINKOS = "toollinkos"
# the dependencies kept: a required parameter that another tool's output fills (ToolLinkOS's other kinds,
# "the wifi must be on", hang OS-level tools off nearly every request)
TOOLLINKOS_DEPENDS = "PARAMETER_DIRECTLY_DEPENDS_ON"


def _records(clone: Clone, path: str) -> list:
    value = clone.json(path, [])
    if not isinstance(value, list):
        raise DataError(clone.root / path, f"expected a JSON array, got {type(value).__name__}")
    return value


def nestful(mirrors: str | Path) -> Iterator[Example]:
    """NESTFUL's non-executable sequences (``IBM/NESTFUL``): the request, and the function of each of its
    calls in the order called (a function called twice comes twice), over the part's ``-spec.json``."""
    clone = Clone(mirrors, NESTFUL_REPO)
    for part in NESTFUL_PARTS:
        base = f"data/non-executable/non-executable-{part}"
        try:
            tools = {s["name"]: Tool(s["name"], clip(s.get("description")),
                                     schema({"properties": s.get("query_parameters")}),
                                     source=f"nestful_{part}")
                     for s in _records(clone, f"{base}-spec.json")}
        except (KeyError, TypeError, AttributeError) as e:
            raise malformed(clone.root / f"{base}-spec.json", "a function", e) from None
        for i, ex in enumerate(_records(clone, path := f"{base}-data.json")):
            try:
                names = [c["name"] for c in ex["output"] if c["name"] != NESTFUL_RESULT]
                golds, query = tuple(tools[n] for n in names if n in tools), clip(ex["input"])
            except (KeyError, TypeError, AttributeError) as e:
                raise malformed(clone.root / path, f"sequence {i}", e) from None
            if golds and query:
                yield Example(query, golds, "nestful", f"{part}-{i}")


def _chain(main: str, gold: set[str], depends: Mapping[str, Sequence[str]]) -> list[str]:
    """``main`` after the gold tools it depends on, each after its own (depth first, each once, a cycle
    cut)."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order or name in path:
            return
        for dep in depends.get(name, ()):
            if dep in gold:
                visit(dep, (*path, name))
        order.append(name)

    visit(main, ())
    return order


def toollinkos(mirrors: str | Path) -> Iterator[Example]:
    """ToolLinkOS's requests (``EliasLumer/Graph-RAG-Tool-Fusion-ToolLinkOS``): the request's main tool after
    the gold tools whose output fills one of its required parameters, in the order they would be called."""
    clone = Clone(mirrors, TOOLLINKOS_REPO)
    tools: dict[str, Tool] = {}
    depends: dict[str, list[str]] = {}
    for path in (f"{TOOLLINKOS}/regular_tools.json", f"{TOOLLINKOS}/core_tools.json"):
        for j, t in enumerate(_records(clone, path)):
            try:
                params = {p["name"]: p for p in t.get("parameters") or ()}
                tools[t["name"]] = Tool(t["name"], clip(t.get("description")), schema({"properties": params}),
                                        source=TOOLLINKOS)
                depends[t["name"]] = [d["name"] for d in t.get("depends_on") or ()
                                      if d.get("dependence_type") == TOOLLINKOS_DEPENDS]
            except (KeyError, TypeError, AttributeError) as e:
                raise malformed(clone.root / path, f"tool {j}", e) from None
    if not tools:
        raise DataError(clone.root / TOOLLINKOS, "missing or without a tool")
    for i, ex in enumerate(_records(clone, path := f"{TOOLLINKOS}/instances.json")):
        try:
            chain = _chain(ex["main_golden_function_name"], set(ex["golden_function_names"]), depends)
            query = clip(ex["user_query"])
        except (KeyError, TypeError, AttributeError) as e:
            raise malformed(clone.root / path, f"instance {i}", e) from None
        golds = tuple(tools[n] for n in chain if n in tools)
        if golds and query:
            yield Example(query, golds, "toollinkos", str(i))
