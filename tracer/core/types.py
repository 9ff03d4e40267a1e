"""Records that flow through tracer: tools, registries, calls, trajectories and decision steps.

All records are frozen dataclasses. Messages are kept as plain OpenAI chat dicts (the native
format on disk is exactly that), wrapped in tuples so that a record cannot be mutated in place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Message = Mapping[str, Any]


@dataclass(frozen=True)
class Tool:
    """One callable tool.

    Args:
        name: unique name within a registry (the OpenAI ``function.name``).
        description: natural-language description shown to the model and embedded for search.
        parameters: JSON schema of the arguments (``{"type": "object", "properties": ...}``).
        source: where the tool comes from (dataset or API family), used for pooling and reports.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    source: str = ""

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    @property
    def search_text(self) -> str:
        """Text embedded for the vector fallback: name and description."""
        return f"{self.name}: {self.description}"

    @classmethod
    def from_openai(cls, obj: Mapping[str, Any], source: str = "") -> Tool:
        fn = obj.get("function", obj)
        return cls(
            name=fn["name"],
            description=fn.get("description", "") or "",
            parameters=fn.get("parameters") or {"type": "object", "properties": {}},
            source=source,
        )


class Registry(Sequence[Tool]):
    """An ordered set of tools with unique names. Position in the registry is the tool's id."""

    def __init__(self, tools: Iterable[Tool]):
        self._tools: tuple[Tool, ...] = tuple(tools)
        self._index: dict[str, int] = {}
        for i, t in enumerate(self._tools):
            if t.name in self._index:
                raise ValueError(f"duplicate tool name {t.name!r} in registry "
                                 f"(positions {self._index[t.name]} and {i})")
            self._index[t.name] = i
        self._names = tuple(self._index)  # the registry never changes (extend builds a new one): made once
        self._positions = MappingProxyType(self._index)

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, i):  # type: ignore[override]
        return self._tools[i]

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Registry) and self._tools == other._tools

    def __hash__(self) -> int:
        return hash(self.names)

    def __repr__(self) -> str:
        return f"Registry({len(self)} tools)"

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def positions(self) -> Mapping[str, int]:
        """Read-only name -> id map (``in`` and lookups at C speed, for per-request loops)."""
        return self._positions

    def id(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"tool {name!r} is not in the registry ({len(self)} tools)") from None

    def get(self, name: str) -> Tool:
        return self._tools[self.id(name)]

    def to_openai(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Render the registry, or the named subset in the given order, as OpenAI tool objects."""
        chosen = self._tools if names is None else [self.get(n) for n in names]
        return [t.to_openai() for t in chosen]

    def extend(self, tools: Iterable[Tool]) -> Registry:
        return Registry(list(self._tools) + list(tools))


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the model emits it (OpenAI ``tool_calls`` entry)."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(dict(self.arguments), sort_keys=False)},
        }


@dataclass(frozen=True)
class Trajectory:
    """One logged conversation.

    ``group`` is the underlying task: trials or variants of one task share it and folds never
    split a group.
    """

    id: str
    group: str
    domain: str
    messages: tuple[Message, ...]
    reward: float = 1.0
    success: bool = True
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group": self.group,
            "domain": self.domain,
            "messages": [dict(m) for m in self.messages],
            "reward": self.reward,
            "success": self.success,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class Step:
    """One decision: the model is about to make the tool call ``gold``.

    Args:
        trajectory_id, group: the conversation this step comes from.
        turn: index of the user turn (0-based; calls before any user message are turn 0).
        position: index of this call within its turn (0 opens the turn).
        prefix: names of the calls made earlier in this turn (turn-local; resets at each user message).
        history: names of every call made earlier in the conversation, across turns.
        gold: the name of the tool actually called.
        context: the messages before this call (parallel calls earlier in the same assistant
            message appear as an assistant message holding those earlier calls).
        index: position of the step within its trajectory (0-based).
    """

    trajectory_id: str
    group: str
    turn: int
    position: int
    prefix: tuple[str, ...]
    history: tuple[str, ...]
    gold: str
    context: tuple[Message, ...]
    index: int = 0
    gold_arguments: Mapping[str, Any] = field(default_factory=dict)

    @property
    def previous_call(self) -> str | None:
        """The previous call across turns (None at the first call of the conversation)."""
        return self.history[-1] if self.history else None

    @property
    def opens_turn(self) -> bool:
        return self.position == 0
