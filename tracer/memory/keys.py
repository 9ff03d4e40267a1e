"""State keys: which calls of a step form its state in a trie or a transition table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tracer.core.types import Step


@dataclass(frozen=True)
class StateKey:
    """Which calls form the state of a step.

    Args:
        kind: ``prefix`` (all calls in scope, the paper's default) or ``last_n`` (the last ``n``).
        n: how many calls ``last_n`` keeps.
        cross_turn: False (paper): the state resets at each user message. True: calls of earlier
            turns stay in the state.

    Example: a turn ``a, b`` then a user message and ``c``; the state before the call after ``c``
    is ``(c,)`` for ``prefix``, ``(a, b, c)`` for ``prefix`` + ``cross_turn``, ``(b, c)`` for
    ``last_n`` with n=2 + ``cross_turn``.
    """

    kind: Literal["prefix", "last_n"] = "prefix"
    n: int = 1
    cross_turn: bool = False

    def __post_init__(self):
        if self.kind not in ("prefix", "last_n"):
            raise ValueError(f"state key kind must be 'prefix' or 'last_n', got {self.kind!r}")
        if self.kind == "last_n" and self.n < 1:
            raise ValueError(f"last_n needs n >= 1, got {self.n}")

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> StateKey:
        return cls(**dict(cfg or {}))

    def state(self, step: Step) -> tuple[str, ...]:
        calls = step.history if self.cross_turn else step.prefix
        return tuple(calls) if self.kind == "prefix" else tuple(calls[-self.n:])

    @property
    def label(self) -> str:
        base = "prefix" if self.kind == "prefix" else f"last_{self.n}"
        return base + ("+cross_turn" if self.cross_turn else "")


PREFIX = StateKey()  # the paper's state: the turn-local prefix
LAST_CALL = StateKey(kind="last_n", n=1, cross_turn=True)  # ToolNet's and H-EPM's state: the previous call


def parse_key(spec: str | Mapping | StateKey) -> StateKey:
    """A state key from its label (``prefix``, ``last_2+cross_turn``, ``prefix+cross_turn``), a mapping
    (``{kind, n, cross_turn}``) or a :class:`StateKey`."""
    if isinstance(spec, StateKey):
        return spec
    if isinstance(spec, Mapping):
        return StateKey.from_config(spec)
    base, _, flag = str(spec).partition("+")
    if flag not in ("", "cross_turn"):
        raise ValueError(f"state key {spec!r}: the only suffix is '+cross_turn'")
    cross = flag == "cross_turn"
    if base == "prefix":
        return StateKey("prefix", 1, cross)
    if base.startswith("last_") and base[5:].isdigit():
        return StateKey("last_n", int(base[5:]), cross)
    raise ValueError(f"state key {spec!r}: expected prefix or last_<n>, optionally with +cross_turn")
