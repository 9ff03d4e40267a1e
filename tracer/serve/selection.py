"""Which of a request's tools the gateway presents, and in what order.

**Choosing k tools** (:func:`choose`). The request carries its full ``tools``; the index ranks the
conversation (:meth:`Retriever.rank`). Tools the index knows but the request omits are never
presented. Tools in the request that the index does not know are ranked by vector search: their
text, as the index's embedder reads tools (:func:`tracer.encode.embedders.tool_rows`), is embedded once and
cached, and compared by cosine with the conversation's context embedding. The rule that merges the two:

    an unknown tool takes a slot when plain vector search over all the request's tools would
    present it (its cosine is among the k best, known tools scored by the index's own tool
    vectors); the remaining slots go to the index's ranking of the known tools.

So an index trained without a tool never hides it when the conversation plainly asks for it, and
never lets untrained tools crowd out what it learned. A tool named by ``tool_choice`` is always kept; a
``tool_choice`` of type ``allowed_tools`` makes the allowed tools the request carries the only candidates
(:func:`allowed_names`).

**Bounded work per request.** At most ``max_new`` (``--max-unknown-embed``, default 256) texts of unknown
tools not yet cached are embedded per request, the first in the request's order; the others get no
vector this time and rank after every tool that has one (in the request's order; they fill slots only
when too few tools have a vector). Their vectors come on later requests, ``max_new`` at a time, so an
agent that keeps its tools converges to the uncapped choice. The cache holds ``max_size`` vectors (LRU).

The conversation is read leniently (:meth:`Retriever.read`); :func:`choose_tools` reports the leniencies
applied and what the unknown tools cost, for the gateway's metrics.

**Trial steps** (``choose_tools(..., trial=True)``; which conversations are trials and why:
:mod:`tracer.scorer_base.trial`). The choice above is the served one; a trial step presents it, then the first
k of the request's known tools under the ranking the scorer does not serve (:func:`other_ranking`) that are
not among them (:func:`tracer.scorer_base.trial.widened`): up to 2k tools. The other ranking is cut to the
request's candidates before its k are taken, as the served ranking is: a gold tool the request offers that
is in the other ranking's top k of the whole registry is then in its top k of the request's tools, so the
trial shows every tool a refit will count as that ranking's hit. Tools the index does not know take their
slots in the served choice only (the other ranking has no row for them), and a tool ``tool_choice`` names
stays in the served choice. The sticky presenter receives the widened choice as the step's choice: what it
keeps from earlier steps is shown besides, never instead of, either ranking's k.

**Prompt-cache-stable presentation** (:class:`StickyPresenter`). Within a conversation, tools already
presented stay where they are and newly chosen ones are appended in canonical order (their order in
the request's ``tools``, which an agent keeps fixed), so the tool block of the prompt only grows at its
end and a provider's prefix cache keeps hitting. The set is capped at ``max_presented``; beyond it the
conversation restarts from the current choice (one cache break). Plain mode presents the top k in
rank order at every step.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracer.core.live import LiveStep
from tracer.core.lru import LRU
from tracer.core.tool_text import tool_text
from tracer.core.types import Message, Tool
from tracer.core.validate import InvalidField, check_int
from tracer.encode.embedders import encode_tools, tool_style
from tracer.retriever import Retriever
from tracer.scorer_base.ranking import without
from tracer.scorer_base.trial import Trials, widened


def tool_name(obj: Mapping[str, Any]) -> str:
    return obj["function"]["name"]


@dataclass(frozen=True)
class Keyed:
    """Tools' texts as one embedder reads them (``style``, :func:`tracer.encode.embedders.tool_style`) and
    their digests, the cache's keys: rendered and hashed once per request, though the gateway asks twice
    (whether to leave the event loop, then the lookup)."""

    style: str
    texts: list[str]
    keys: list[bytes]

    @classmethod
    def of(cls, tools: Sequence[Mapping[str, Any]], style: str = "name_description") -> Keyed:
        texts = [tool_text(Tool.from_openai(t), style) for t in tools]
        # the key, not the text, is kept: a tool's description may be megabytes
        keys = [hashlib.blake2b(t.encode("utf-8", "replace"), digest_size=16).digest() for t in texts]
        return cls(style, texts, keys)


class UnknownToolVectors:
    """Embeddings of tools the index does not know, by a digest of their search text (a bounded LRU).

    Args:
        max_size: vectors kept (least recently used first out).
        max_new: texts not yet cached embedded per :meth:`lookup` at most (None: all).
    """

    def __init__(self, max_size: int = 8192, max_new: int | None = 256):
        check_int(max_size, "UnknownToolVectors max_size", 1)
        if max_new is not None:
            check_int(max_new, "max_new (tracer serve --max-unknown-embed)", 0)
        self.max_size, self.max_new = max_size, max_new
        self._vecs: LRU = LRU(max_size)  # digest -> [d] float32
        self._lock = threading.Lock()

    def missing(self, keyed: Keyed) -> bool:
        """Whether :meth:`lookup` of the tools ``keyed`` renders would embed anything (then the gateway
        leaves the loop)."""
        with self._lock:
            return not all(k in self._vecs for k in keyed.keys)

    def lookup(self, retriever: Retriever, keyed: Keyed, max_new: int | None = -1
               ) -> tuple[np.ndarray, list[int], int]:
        """``([E, d] float32 rows, positions in the tools ``keyed`` renders of those E, texts embedded
        now)``: every cached tool and the first ``max_new`` new texts (default: the instance's cap); the
        others have no row. ``keyed`` reads tools as the retriever's embedder does (``tool_style``)."""
        cap = self.max_new if max_new == -1 else max_new
        texts, keys = keyed.texts, keyed.keys
        with self._lock:
            new = [i for i, k in enumerate(keys) if k not in self._vecs]
        first = {keys[i]: i for i in reversed(new)}                    # a text repeated: embedded once
        todo = sorted(first.values())[:cap] if cap is not None else sorted(first.values())
        if todo:
            vecs = encode_tools(retriever.res.embedder, [texts[i] for i in todo]).numpy().astype(np.float32)
            got = dict(zip((keys[i] for i in todo), vecs))
        else:
            got = {}
        with self._lock:
            rows, have = [], []
            for i, k in enumerate(keys):
                v = got.get(k)
                if v is None:
                    v = self._vecs.get(k)  # a hit is now recently used, so storing the new ones keeps it
                if v is not None:
                    rows.append(v)
                    have.append(i)
            self._vecs.update(got)
        dim = retriever.res.embedder.dim
        return (np.stack(rows) if rows else np.zeros((0, dim), np.float32)), have, len(todo)

    def get(self, retriever: Retriever, tools: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """``[U, d]`` float32 rows for every one of ``tools`` (OpenAI tool objects), whatever the cap."""
        return self.lookup(retriever, Keyed.of(tools, tool_style(retriever.res.embedder)), None)[0]


def forced_name(tool_choice: Any) -> str | None:
    """The tool a ``tool_choice`` object names (``{"type": "function", "function": {"name": ...}}``), else
    None."""
    if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def _allowed_spec(tool_choice: Any) -> tuple[Mapping[str, Any], str] | None:
    """(the object holding ``mode`` and ``tools``, its field path) of an ``allowed_tools`` tool_choice, else
    None."""
    if not isinstance(tool_choice, Mapping) or tool_choice.get("type") != "allowed_tools":
        return None
    if "allowed_tools" not in tool_choice:  # the flat shape
        return tool_choice, "tool_choice"
    inner = tool_choice["allowed_tools"]
    if not isinstance(inner, Mapping):
        raise InvalidField("tool_choice.allowed_tools", "must be an object with 'mode' and 'tools'")
    return inner, "tool_choice.allowed_tools"


def _ref_name(ref: Any) -> tuple[Any, str]:
    """(the name a tool reference gives, the field that should hold it): ``{"type": "function", "function":
    {"name": ...}}`` as Chat Completions writes it, or ``{"type": "function", "name": ...}``."""
    if isinstance(ref, Mapping) and isinstance(ref.get("function"), Mapping):
        return ref["function"].get("name"), "function.name"
    return (ref.get("name") if isinstance(ref, Mapping) else None), "name"


def allowed_names(tool_choice: Any) -> list[str] | None:
    """The tools an ``allowed_tools`` tool_choice lets the model call, in its order; None for any other
    tool_choice. OpenAI's shape is ``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required",
    "tools": [{"type": "function", "function": {"name": ...}}, ...]}}``; the flat ``{"type": "allowed_tools",
    "mode": ..., "tools": [...]}`` is read too. A malformed one is an :class:`InvalidField` naming the field.

    The gateway chooses inside this set (:class:`~tracer.serve.http.offload.SelectionStage`: the allowed
    tools the request carries are the candidates) and forwards the choice narrowed to what it presented
    (:func:`forwarded_body`)."""
    spec = _allowed_spec(tool_choice)
    if spec is None:
        return None
    inner, at = spec
    if inner.get("mode") not in ("auto", "required"):
        raise InvalidField(f"{at}.mode", f"must be 'auto' or 'required', got {inner.get('mode')!r}")
    refs = inner.get("tools")
    if not isinstance(refs, list) or not refs:
        raise InvalidField(f"{at}.tools", "must be a non-empty array of tool references "
                                          "({'type': 'function', 'function': {'name': ...}})")
    names = []
    for i, ref in enumerate(refs):
        name, field_name = _ref_name(ref)
        if not isinstance(name, str) or not name:
            raise InvalidField(f"{at}.tools[{i}].{field_name}", "a tool reference needs a function name")
        names.append(name)
    return names


def forwarded_body(body: Mapping[str, Any], names: Sequence[str], presented: Sequence[str]) -> dict[str, Any]:
    """The request to forward: ``body`` with only the ``presented`` tools (``names``: its tools' names, in
    order), and an ``allowed_tools`` tool_choice narrowed to the presented tools it allows, in its shape, so
    the upstream is never asked to allow a tool it was not given."""
    by_name = dict(zip(names, body["tools"]))
    out = {**body, "tools": [by_name[n] for n in presented]}
    spec = _allowed_spec(body.get("tool_choice"))
    if spec is not None:
        inner, at = spec
        shown = set(presented)
        refs = [r for r in inner["tools"] if _ref_name(r)[0] in shown]
        if refs:  # else none of the allowed was offered: the upstream answers that request itself
            narrowed = {**inner, "tools": refs}
            out["tool_choice"] = narrowed if at == "tool_choice" else {**body["tool_choice"],
                                                                       "allowed_tools": narrowed}
    return out


@dataclass
class Choice:
    """What :func:`choose_tools` chose and what it cost: ``lenient`` (kind -> count, :mod:`tracer.core.live`),
    ``embedded`` (unknown tools' texts embedded now), ``over_cap`` (unknown tools left without a vector)."""

    names: list[str]
    lenient: Mapping[str, int] = field(default_factory=dict)
    embedded: int = 0
    over_cap: int = 0


def choose(retriever: Retriever, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], k: int,
           unknown_vectors: UnknownToolVectors, must: str | None = None,
           names: Sequence[str] | None = None) -> list[str]:
    """Names of the k request tools to present, best first (see the module docstring for the rule)."""
    return choose_tools(retriever, messages, tools, k, unknown_vectors, must, names).names


def other_ranking(retriever: Retriever, live: LiveStep) -> list[str]:
    """Every tool name the scorer's other ranking presents for the step, best first (removed tools left
    out): the ranking a trial shows after the served one (:meth:`Trials.trial_rankings` with k the
    registry's size); empty for a scorer that runs no trials."""
    scorer = retriever.scorer  # read once, as Retriever.select_ids does
    if not isinstance(scorer, Trials):
        return []
    registry = scorer.res.registry
    ids = scorer.trial_rankings([live.step], len(registry))[0]
    return [registry.names[i] for i in without(ids, scorer.res.removed_ids)]


def choose_tools(retriever: Retriever, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]],
                 k: int, unknown_vectors: UnknownToolVectors, must: str | None = None,
                 names: Sequence[str] | None = None, keyed: Keyed | None = None,
                 trial: bool = False) -> Choice:
    """:func:`choose` with its report. ``names``: the tools' names when the caller has them already (the
    gateway's validation does); ``keyed``: the :class:`Keyed` of the tools the registry does not know, in
    request order, when the caller has it (the gateway's selection stage). ``trial``: a step of a trial
    conversation (the caller asks :meth:`Retriever.is_trial`): the choice widened by the other ranking (module
    docstring, "Trial steps")."""
    names = [tool_name(t) for t in tools] if names is None else list(names)
    if len(names) <= k:
        return Choice(names)
    registry = retriever.registry
    known = registry.positions
    requested = set(names)
    live = retriever.read(messages)
    known_ranked = [n for n in retriever.rank(live) if n in requested]
    unknown = [] if requested.issubset(known.keys()) else [t for t, n in zip(tools, names) if n not in known]
    chosen_unknown: list[str] = []
    choice = Choice([], live.lenient)
    if unknown:
        ctx = retriever.context_embedding(live).astype(np.float64)                   # [d]
        known_ids = [registry.id(n) for n in known_ranked]
        known_vecs = retriever.res.tool_index.vectors[known_ids]                     # [K, d]
        style = tool_style(retriever.res.embedder)
        if keyed is None or keyed.style != style:
            keyed = Keyed.of(unknown, style)
        rows, have, choice.embedded = unknown_vectors.lookup(retriever, keyed)         # [E, d]
        choice.over_cap = len(unknown) - len(have)
        cos = np.concatenate([known_vecs, rows]).astype(np.float64) @ ctx           # [K + E]
        order = np.argsort(-cos, kind="stable")[:k]                                   # ties: known first
        chosen_unknown = [tool_name(unknown[have[i - len(known_ids)]]) for i in order.tolist()
                          if i >= len(known_ids)]
    chosen = known_ranked[:k - len(chosen_unknown)] + chosen_unknown
    if len(chosen) < k:  # too few tools with a vector: unknown ones without, in the request's order
        taken = set(chosen)
        chosen += [n for n in (tool_name(t) for t in unknown) if n not in taken][:k - len(chosen)]
    if must is not None and must in requested and must not in chosen:
        chosen = [must] + chosen[:k - 1]
    if trial:
        other = [n for n in other_ranking(retriever, live) if n in requested]
        chosen = widened(chosen, other, k)
    choice.names = chosen
    return choice


class StickyPresenter:
    """Per-conversation presented lists (LRU over ``max_conversations`` conversations).

    Args:
        sticky: keep presented tools in place and append new ones (False: the choice in rank order).
        max_presented: cap on a conversation's presented list (None: no cap).
    """

    def __init__(self, sticky: bool = True, max_presented: int | None = None, max_conversations: int = 10000):
        self.sticky = sticky
        self.max_presented = max_presented
        self.max_conversations = max_conversations
        self._state: LRU = LRU(max_conversations)  # conversation -> its presented names
        self._lock = threading.Lock()

    def present(self, conversation: str, chosen: Sequence[str], canonical: Sequence[str]) -> list[str]:
        """The names to present now, given this step's choice and the request's canonical tool order."""
        if not self.sticky:
            return list(chosen)
        position = {n: i for i, n in enumerate(canonical)}
        with self._lock:
            before = self._state.pop(conversation, [])
            kept = [n for n in before if n in position]  # a tool the request dropped is never presented
            new = sorted((n for n in set(chosen) - set(kept)), key=position.__getitem__)
            shown = kept + new
            if self.max_presented is not None and len(shown) > self.max_presented:
                shown = sorted(chosen, key=position.__getitem__)
            self._state[conversation] = shown
        return shown
