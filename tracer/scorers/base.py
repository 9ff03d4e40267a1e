"""The one interface every tool selector shares, and the one place where rankings become tool sets.

A scorer is fitted on training trajectories and, for a batch of decision steps, returns
:class:`Scores`: its own scores over the registry (``-inf`` for tools it does not propose) and the
vector-fallback scores. :func:`finalize` turns them into a full ranking and the presented set at a
budget ``k``: proposed tools first in the scorer's order, then the rest of the registry in fallback
order (padding), ties broken by registry position. Scorers never sort or pad by themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch

from ..context import ContextRendering
from ..embed import Embedder, default_device
from ..index import ToolIndex
from ..steps import extract_all
from ..types import Registry, Step, Trajectory


@dataclass
class Resources:
    """What scorers are fitted with: the registry, the embedder, the shared FAISS tool index.

    ``executor`` is the model interface (for scorers that need summaries from a model, e.g.
    H-EPM and Insight); ``None`` means the offline deterministic path.
    """

    registry: Registry
    embedder: Embedder
    tool_index: ToolIndex
    device: str = "cpu"
    seed: int = 0
    executor: Any = None

    @classmethod
    def build(cls, registry: Registry, embedder: Embedder, factory: str = "Flat", device: str | None = None,
              seed: int = 0, executor: Any = None) -> Resources:
        return cls(registry, embedder, ToolIndex.build(registry, embedder, factory), device or default_device(),
                   seed, executor)

    def embed(self, steps: Sequence[Step], rendering: ContextRendering) -> torch.Tensor:
        """Context embeddings of steps under a rendering, ``[B, d]`` on ``self.device``."""
        return self.embedder.encode([rendering.render(s.context) for s in steps]).to(self.device)

    def tool_ids(self, names: Sequence[str]) -> torch.Tensor:
        return torch.tensor([self.registry.id(n) for n in names], dtype=torch.long)


@dataclass
class Scores:
    """A scorer's output for B steps over a registry of N tools.

    primary: ``[B, N]`` the scorer's own scores; ``-inf`` for tools it does not propose.
    fallback: ``[B, N]`` vector-search scores, used to rank everything not proposed (padding) and,
        where ``fell_back``, to rank everything.
    fell_back: ``[B]`` the step was ranked by the fallback alone.
    in_trie, kappa, depth, n_children: ``[B]`` diagnostics of trie-based scorers (None otherwise).
    present_all: the whole registry is presented whatever k is (LLM-only, H-EPM, Insight).
    always_present: registry ids added to every presented set (Tracer+G's global set).
    guidance: per-step text added to the prompt (H-EPM's suggestion line, Insight's block).
    extra: further per-step diagnostics (e.g. the blend head's w and T), each ``[B]``.
    """

    primary: torch.Tensor
    fallback: torch.Tensor
    fell_back: torch.Tensor
    in_trie: torch.Tensor | None = None
    kappa: torch.Tensor | None = None
    depth: torch.Tensor | None = None
    n_children: torch.Tensor | None = None
    present_all: bool = False
    always_present: tuple[int, ...] = ()
    guidance: list[str] | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Selection:
    """Rankings and presented sets for B steps."""

    ranking: torch.Tensor              # [B, N] registry ids, best first
    presented: list[tuple[int, ...]]   # per step, registry ids shown to the model
    scores: Scores

    def __len__(self) -> int:
        return self.ranking.shape[0]


def rank(primary: torch.Tensor, fallback: torch.Tensor, fell_back: torch.Tensor) -> torch.Tensor:
    """Full rankings ``[B, N]``: by primary (desc), then fallback (desc), then registry position.

    Rows that fell back are ranked by fallback alone. Two stable sorts make the order
    lexicographic without mixing the two score scales.
    """
    primary = primary.detach().float().cpu()
    fallback = fallback.detach().float().cpu()
    fell_back = fell_back.detach().cpu()
    by_fallback = torch.sort(fallback, dim=1, descending=True, stable=True).indices  # [B, N]
    prim = torch.where(fell_back[:, None], torch.zeros_like(primary), primary)
    prim = torch.nan_to_num(prim, nan=float("-inf"))
    order = torch.sort(prim.gather(1, by_fallback), dim=1, descending=True, stable=True).indices  # [B, N]
    return by_fallback.gather(1, order)


def finalize(scores: Scores, k: int, pad: bool = True) -> Selection:
    """Rank, take the top k, pad (or not) and add the always-present tools: the one place that does it."""
    ranking = rank(scores.primary, scores.fallback, scores.fell_back)  # [B, N]
    n = ranking.shape[1]
    if scores.present_all:
        everything = tuple(range(n))
        return Selection(ranking, [everything] * ranking.shape[0], scores)
    top = ranking[:, :k].tolist()
    if not pad:
        proposed = torch.isfinite(scores.primary.detach().cpu()) & ~scores.fell_back.detach().cpu()[:, None]
        n_prop = proposed.sum(1).tolist()
        fell = scores.fell_back.tolist()
        top = [t if f else t[: min(k, c)] for t, f, c in zip(top, fell, n_prop)]
    presented = []
    for t in top:
        extra = [g for g in scores.always_present if g not in t]
        presented.append(tuple(t) + tuple(extra))
    return Selection(ranking, presented, scores)


@runtime_checkable
class Scorer(Protocol):
    """A tool selector. ``fit`` learns from training trajectories; ``score`` is batched over steps."""

    name: str
    pad: bool

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> "Scorer": ...

    def score(self, steps: Sequence[Step]) -> Scores: ...


def training_steps(trajectories: Sequence[Trajectory], registry: Registry, successful_only: bool = True) -> list[Step]:
    """Steps of the training trajectories a scorer learns from (successful ones by default)."""
    trajs = [t for t in trajectories if t.success or not successful_only]
    return [s for s in extract_all(trajs) if s.gold in registry]


def fallback_scores(res: Resources, contexts: torch.Tensor) -> torch.Tensor:
    """Cosine of each context with every tool through the FAISS index, ``[B, N]``."""
    return res.tool_index.dense_scores(contexts)


def no_proposal(b: int, n: int) -> torch.Tensor:
    return torch.full((b, n), float("-inf"))


def scatter_primary(tool: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """Scatter per-child scores ``[B, C]`` (masked) into registry-wide scores ``[B, N]`` (-inf elsewhere)."""
    out = torch.full((tool.shape[0], n + 1), float("-inf"), dtype=values.dtype, device=values.device)
    idx = torch.where(mask, tool, torch.full_like(tool, n))  # masked entries land in a dump column
    out.scatter_(1, idx, torch.where(mask, values, torch.full_like(values, float("-inf"))))
    return out[:, :n]


ScorerFactory = Callable[..., Scorer]
