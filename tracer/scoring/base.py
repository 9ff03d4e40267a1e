"""The one interface every tool selector shares, and the one place where rankings become tool sets.

A scorer is fitted on training trajectories and, for a batch of decision steps, returns
:class:`Scores`: its own scores over the registry (``-inf`` for tools it does not propose) and the
vector-fallback scores. :func:`finalize` turns them into a full ranking and the presented set at a
budget ``k``: proposed tools first in the scorer's order, then the rest of the registry in fallback
order (padding), ties broken by registry position. Scorers never sort or pad by themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from tracer.core.context import ContextRendering
from tracer.core.steps import extract_all
from tracer.core.types import Registry, Step, Trajectory
from tracer.encode.embedders import Embedder, default_device
from tracer.encode.index import ToolIndex
from tracer.scoring.fit import FitReport


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


def _desc_keys(x: np.ndarray, low: np.ndarray) -> np.ndarray:
    """uint64 sort keys: ascending key order = ``x`` (float32) descending, then ``low`` (< 2**32) ascending.

    The float is mapped to its order-preserving bit pattern; ``-0.0`` counts as ``0.0`` and NaN as
    larger than ``+inf`` (as in a torch sort). Keys are unique when ``low`` is, so any sort
    algorithm gives the order of a stable sort.
    """
    x = np.asarray(x, dtype=np.float32) + np.float32(0.0)                             # -0.0 -> +0.0
    x = np.where(np.isnan(x), np.float32(np.nan), x)                                   # one NaN bit pattern
    u = x.view(np.uint32)
    order_bits = np.where(u >> 31 == 1, ~u, u | np.uint32(0x80000000))                 # ascending in x
    return ((~order_bits).astype(np.uint64) << np.uint64(32)) | low.astype(np.uint64)


def rank(primary: torch.Tensor, fallback: torch.Tensor, fell_back: torch.Tensor) -> torch.Tensor:
    """Full rankings ``[B, N]``: by primary (desc), then fallback (desc), then registry position.

    Rows that fell back are ranked by fallback alone. Done as two sorts on unique integer keys
    (fallback then registry position; primary then fallback rank), which gives exactly the order
    of two stable sorts without mixing the two score scales.
    """
    prim = primary.detach().float().cpu().numpy()
    fb = fallback.detach().float().cpu().numpy()
    fell = fell_back.detach().cpu().numpy().astype(bool)
    b, n = fb.shape
    ids = np.broadcast_to(np.arange(n, dtype=np.uint64), (b, n))
    by_fallback = np.argsort(_desc_keys(fb, ids), axis=1)                              # [B, N]
    out = by_fallback.copy()
    rows = np.flatnonzero(~fell)
    if len(rows) and n:
        fb_rank = np.empty((len(rows), n), dtype=np.uint64)
        np.put_along_axis(fb_rank, by_fallback[rows], np.broadcast_to(np.arange(n, dtype=np.uint64),
                                                                      (len(rows), n)), axis=1)
        p = np.nan_to_num(prim[rows], nan=-np.inf)  # as torch.nan_to_num: NaN below -inf (-> lowest float)
        out[rows] = np.argsort(_desc_keys(p, fb_rank), axis=1)                         # [R, N]
    return torch.from_numpy(out)


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


def rank_one(proposed: np.ndarray, scores: np.ndarray, fallback: np.ndarray, fell_back: bool,
             top: int | None = None) -> np.ndarray:
    """:func:`rank` for one step, in numpy (the single-step path): registry ids best first.

    ``proposed [C]`` registry ids (distinct) with their primary ``scores [C]`` (every other tool's
    primary score is ``-inf``), ``fallback [N]``. Returns the whole ranking, or only its first
    ``top`` entries (then large registries are partially sorted). Same order as :func:`rank`:
    proposed tools by score, ties by fallback then registry position; then the rest by fallback,
    then registry position; a step that fell back is ranked by fallback alone. As there, a
    ``-inf`` score ties with the tools not proposed and a NaN score ranks after them.
    """
    n = len(fallback)
    m = n if top is None else max(0, min(top, n))
    neg_fb = -np.asarray(fallback, dtype=np.float32)                                 # [N] ascending = best first
    if np.isnan(neg_fb).any():  # NaN first, as in a torch sort: exact integer keys instead
        neg_fb = _desc_keys(-neg_fb, np.arange(n, dtype=np.uint64))
    head = last = np.zeros(0, dtype=np.int64)
    if not fell_back and len(proposed):
        s = np.asarray(scores, dtype=np.float32)
        if not np.isfinite(s).all():
            s = np.nan_to_num(s, nan=-np.inf)  # as in rank: +-inf -> largest/lowest float, NaN -> -inf
        p = np.asarray(proposed, dtype=np.int64)
        up = s > np.finfo(np.float32).min
        head = p[up][np.lexsort((p[up], neg_fb[p[up]], -s[up]))]
        last = p[s == -np.inf]                                                        # NaN scores
        last = last[np.lexsort((last, neg_fb[last]))]
    if len(head) >= m:
        return head[:m]
    need = m + len(last)  # the first `need` tools in fallback order hold the m - len(head) others
    if need < n and n > 512:
        kth = np.partition(neg_fb, need - 1)[need - 1]
        cand = np.flatnonzero(neg_fb <= kth)                                          # ties at the cut kept
        order = cand[np.argsort(neg_fb[cand], kind="stable")]
    else:
        order = np.argsort(neg_fb, kind="stable")                                     # [N]
    if len(head) or len(last):
        taken = np.zeros(n, dtype=bool)
        taken[head] = True
        taken[last] = True
        order = order[~taken[order]]
    return np.concatenate([head, order, last])[:m]


def finalize_one(proposed: np.ndarray, scores: np.ndarray, fallback: np.ndarray, fell_back: bool, k: int,
                 pad: bool = True, always_present: Sequence[int] = (), present_all: bool = False) -> tuple[int, ...]:
    """:func:`finalize`'s presented set for one step (numpy, the single-step path); same rules."""
    if present_all:
        return tuple(range(len(fallback)))
    top = rank_one(proposed, scores, fallback, fell_back, top=k)
    if not pad and not fell_back:
        top = top[: min(k, int(np.isfinite(np.asarray(scores, dtype=np.float32)).sum()))]
    presented = tuple(top.tolist())
    extra = tuple(g for g in always_present if g not in presented)
    return presented + extra


@runtime_checkable
class Scorer(Protocol):
    """A tool selector. ``fit`` learns from training trajectories; ``score`` is batched over steps."""

    name: str
    pad: bool

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport: ...

    def score(self, steps: Sequence[Step]) -> Scores: ...


def training_steps(trajectories: Sequence[Trajectory], registry: Registry, successful_only: bool = True) -> list[Step]:
    """Steps of the training trajectories a scorer learns from (successful ones by default)."""
    trajs = [t for t in trajectories if t.success or not successful_only]
    return [s for s in extract_all(trajs) if s.gold in registry]


def fit_steps(trajectories: Sequence[Trajectory], registry: Registry, successful_only: bool = True) -> list[Step]:
    """:func:`training_steps` for a fit: none is an error (a scorer fitted on nothing answers nothing)."""
    steps = training_steps(trajectories, registry, successful_only)
    if not steps:
        n_ok = sum(t.success for t in trajectories)
        raise ValueError(f"no training steps: {len(trajectories)} trajectories ({n_ok} successful"
                         f"{', only successful ones are used' if successful_only else ''}) hold no tool call of the "
                         f"registry; nothing to fit")
    return steps


def fallback_scores(res: Resources, contexts: torch.Tensor) -> torch.Tensor:
    """Cosine of each context with every tool through the FAISS index, ``[B, N]``."""
    return res.tool_index.dense_scores(contexts)


def no_proposal(b: int, n: int) -> torch.Tensor:
    return torch.full((b, n), float("-inf"))


def as_numpy(x) -> np.ndarray:
    """A context vector (tensor on any device, array or list) as a flat numpy array, without a copy on the CPU."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (x if x.device.type == "cpu" else x.cpu()).numpy().reshape(-1)
    return np.asarray(x).reshape(-1)


def scatter_primary(tool: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """Scatter per-child scores ``[B, C]`` (masked) into registry-wide scores ``[B, N]`` (-inf elsewhere)."""
    out = torch.full((tool.shape[0], n + 1), float("-inf"), dtype=values.dtype, device=values.device)
    idx = torch.where(mask, tool, torch.full_like(tool, n))  # masked entries land in a dump column
    out.scatter_(1, idx, torch.where(mask, values, torch.full_like(values, float("-inf"))))
    return out[:, :n]
