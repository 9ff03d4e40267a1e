"""TRACER: trajectory-aware tool retrieval (the paper's method) and its variants.

At a step with state S (the turn-local prefix by default) and context embedding c, each child t
of S in the execution trie gets

    P(t) = log(N(S,t)/N(S) + eps)                                   empirical prior
    L(t) = log(relu(cos(c, m_{S,t})) / sum_t' relu(cos(c, m_{S,t'})) + eps)   contextual prior
    s(t) = (w P(t) + (1-w) L(t)) / T                                blend

with m_{S,t} the edge memory (mean context of the training steps that took S->t).
``tracer_fixed`` uses s = P + L; ``tracer`` takes w and T per step from the learned blend head
(:mod:`tracer.blend`). The step falls back to vector search over the whole registry when S has no
children or the blend is flat: kappa = max_t softmax(s)(t) < tau.

``tracer_g`` (Tracer+G) adds a global set G of the |G| tools with the highest prefix entropy
H(S | t) to every presented set.

Choices where the paper is silent (stated here and in the configs): when S has fewer than k
children the rest of the k is filled from the fallback ranking (``pad: true``); the smoothing
``eps`` applies to both logs, so a child whose similarity is clipped to 0 by the ReLU keeps a
finite, very low L instead of -inf.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..context import ContextRendering
from ..trie import ChildBatch, ExecutionTrie, StateKey
from ..types import Registry, Step, Tool, Trajectory
from . import register_scorer
from .base import Resources, Scores, fallback_scores, scatter_primary, training_steps

FORMAT_VERSION = 1
PAPER_CONTEXT = {"window": "all", "calls": "names", "results": "truncated", "system": False}


def prefix_entropy(trie: ExecutionTrie) -> torch.Tensor:
    """H(S | t) for every tool t: entropy of the distribution over states from which t was the next call.

    Returns ``[n_tools]`` (0 for tools never called).
    """
    counts = trie.edge_count.double()                                                  # [E]
    per_tool = torch.zeros(trie.n_tools, dtype=torch.double, device=trie.device).index_add_(
        0, trie.edge_tool, counts)                                                     # [n_tools]
    p = counts / per_tool[trie.edge_tool]                                              # [E]
    h = torch.zeros(trie.n_tools, dtype=torch.double, device=trie.device).index_add_(
        0, trie.edge_tool, -p * torch.log(p))
    return h.float().cpu()


class TracerScorer:
    """The TRACER retriever over one execution trie.

    Args:
        name: registry name of this configuration.
        blend: ``fixed`` (s = P + L) or ``learned`` (per-step w and T from the blend head).
        key: state key config (:class:`tracer.trie.StateKey`): ``kind``, ``n``, ``cross_turn``.
        context: context rendering for the edge memories and the fallback query.
        eps: smoothing inside both priors' logs.
        tau: confidence gate; fall back when kappa < tau.
        pad: fill up to k from the fallback ranking when a node has fewer than k children.
        global_set: |G| for Tracer+G (0 = off).
        successful_only: build from successful trajectories only.
        head: blend-head training config (for ``blend: learned``), passed to ``fit_blend_head``.
    """

    def __init__(self, name: str = "tracer_fixed", blend: str = "fixed", key: Mapping | None = None,
                 context: Mapping | None = None, eps: float = 1e-6, tau: float = 0.2, pad: bool = True,
                 global_set: int = 0, successful_only: bool = True, head: Mapping | None = None, **_: Any):
        if blend not in ("fixed", "learned"):
            raise ValueError(f"blend must be 'fixed' or 'learned', got {blend!r}")
        self.name, self.blend, self.eps, self.tau, self.pad = name, blend, eps, tau, pad
        self.key = StateKey.from_config(key)
        self.rendering = ContextRendering.from_config(PAPER_CONTEXT if context is None else context)
        self.global_set_size = global_set
        self.successful_only = successful_only
        self.head_cfg = dict(head or {})
        self.head = None
        self.res: Resources | None = None
        self.trie: ExecutionTrie | None = None
        self.global_set: tuple[int, ...] = ()

    # ---- fitting -----------------------------------------------------------------------------
    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> TracerScorer:
        self.res = res
        steps = training_steps(trajectories, res.registry, self.successful_only)
        ctx = res.embed(steps, self.rendering)                                  # [S, d]
        self.trie = ExecutionTrie.build(steps, res.tool_ids([s.gold for s in steps]), ctx, len(res.registry),
                                        self.key, self.eps, res.device)
        if self.global_set_size:
            h = prefix_entropy(self.trie)
            order = torch.sort(h, descending=True, stable=True).indices
            self.global_set = tuple(order[: self.global_set_size].tolist())
        if self.blend == "learned":
            from ..blend import fit_blend_head

            self.head, self.head_history = fit_blend_head(trajectories, res, key=self.key, rendering=self.rendering,
                                                          eps=self.eps, successful_only=self.successful_only,
                                                          **self.head_cfg)
        return self

    # ---- scoring -----------------------------------------------------------------------------
    def blend_scores(self, cb: ChildBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Blended child scores ``[B, C]`` (-inf where masked) and per-step diagnostics."""
        if self.blend == "fixed":
            return torch.where(cb.mask, cb.log_p + cb.log_l, cb.log_p), {}
        if self.head is None:
            raise RuntimeError(f"scorer {self.name!r} uses the learned blend but no blend head is trained: "
                               "fit it (train.py, or fit() with blend=learned) or use tracer_fixed")
        from ..blend import state_features

        feats = state_features(cb)
        with torch.no_grad():
            scores, _, _ = self.head(cb.log_p, cb.log_l, cb.mask, feats)
            w, t = self.head.wt(feats)
        return scores, {"w": w.cpu(), "T": t.cpu()}

    def score(self, steps: Sequence[Step]) -> Scores:
        if self.trie is None or self.res is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted")
        ctx = self.res.embed(steps, self.rendering)                             # [B, d]
        return self.score_embedded(steps, ctx)

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """Score steps whose contexts are already embedded (``ctx [B, d]``)."""
        n = len(self.res.registry)
        cb = self.trie.gather(self.trie.lookup(steps), ctx)
        s, extra = self.blend_scores(cb)                                        # [B, C]
        has_children = cb.mask.any(1)                                           # [B]
        probs = torch.softmax(torch.where(cb.mask, s, torch.full_like(s, float("-inf"))), dim=1)
        kappa = torch.where(has_children, probs.nan_to_num(0.0).max(1).values, torch.zeros_like(has_children,
                                                                                                dtype=s.dtype))
        fell_back = ~has_children | (kappa < self.tau)
        return Scores(
            primary=scatter_primary(cb.tool, cb.mask, s, n).cpu(),
            fallback=fallback_scores(self.res, ctx),
            fell_back=fell_back.cpu(),
            in_trie=has_children.cpu(),
            kappa=kappa.cpu(),
            depth=cb.depth.cpu(),
            n_children=cb.n_children.cpu(),
            always_present=self.global_set,
            extra=extra,
        )

    # ---- persistence -------------------------------------------------------------------------
    def config(self) -> dict:
        return {"name": self.name, "blend": self.blend, "key": asdict(self.key), "context": asdict(self.rendering),
                "eps": self.eps, "tau": self.tau, "pad": self.pad, "global_set": self.global_set_size,
                "successful_only": self.successful_only, "head": self.head_cfg}

    def save(self, directory: str | Path) -> Path:
        """Write the index atomically: a temporary directory renamed into place."""
        if self.trie is None or self.res is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted")
        out = Path(directory)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
        try:
            meta = {"format_version": FORMAT_VERSION, "scorer": self.config(),
                    "embedder": {"name": self.res.embedder.name, "dim": self.res.embedder.dim},
                    "global_set": list(self.global_set)}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            (tmp / "tools.json").write_text(json.dumps(
                [{**t.to_openai(), "source": t.source} for t in self.res.registry]))
            torch.save(self.trie.state_dict(), tmp / "trie.pt")
            self.res.tool_index.save(tmp)
            if self.head is not None:
                torch.save(self.head.state_dict(), tmp / "blend_head.pt")
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out

    @classmethod
    def load(cls, directory: str | Path, embedder, device: str | None = None) -> TracerScorer:
        from ..embed import default_device
        from ..index import ToolIndex

        d = Path(directory)
        meta = json.loads((d / "meta.json").read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{d / 'meta.json'}: format version {meta.get('format_version')} is not "
                             f"{FORMAT_VERSION}; rebuild the index")
        want = meta["embedder"]
        if want["name"] != embedder.name or want["dim"] != embedder.dim:
            raise ValueError(f"{d / 'meta.json'}: index was built with embedder {want['name']!r} (dim {want['dim']}), "
                             f"not {embedder.name!r} (dim {embedder.dim})")
        registry = Registry(Tool.from_openai(o, o.get("source", "")) for o in json.loads((d / "tools.json").read_text()))
        device = device or default_device()
        obj = cls(**meta["scorer"])
        obj.res = Resources(registry, embedder, ToolIndex.load(d, registry), device)
        obj.trie = ExecutionTrie.from_state_dict(torch.load(d / "trie.pt", weights_only=True), device)
        obj.global_set = tuple(meta["global_set"])
        if (d / "blend_head.pt").exists():
            from ..blend import BlendHead

            obj.head = BlendHead.from_state_dict(torch.load(d / "blend_head.pt", weights_only=True))
        return obj


@register_scorer("tracer_fixed")
def tracer_fixed(**cfg) -> TracerScorer:
    return TracerScorer(**{"name": "tracer_fixed", **cfg, "blend": "fixed"})


@register_scorer("tracer")
def tracer(**cfg) -> TracerScorer:
    return TracerScorer(**{"name": "tracer", **cfg, "blend": "learned"})


@register_scorer("tracer_g")
def tracer_g(**cfg) -> TracerScorer:
    return TracerScorer(**{"name": "tracer_g", "global_set": 3, **cfg})

