"""TRACER: trajectory-aware tool retrieval (the paper's method) and its variants.

At a step with state S (the turn-local prefix by default) and context embedding c, each child t of S gets

    P(t) = log(N(S,t)/N(S) + eps)                                   empirical prior
    L(t) = log(relu(cos(c, m_{S,t})) / sum_t' relu(cos(c, m_{S,t'})) + eps)   contextual prior
    s(t) = (w P(t) + (1-w) L(t)) / T                                blend

with m_{S,t} the edge memory (mean context of the training steps that took S->t). ``tracer_fixed`` uses s =
P + L; ``tracer`` takes w and T per step from the learned blend head (:mod:`tracer.learn.blend_head`). The
step falls back to vector search when S has no children or the blend is flat: kappa = max_t softmax(s)(t) <
tau.

``tracer_g`` (Tracer+G) adds a global set G of the |G| tools with the highest prefix entropy H(S | t) to every
presented set.

Choices where the paper is silent (stated here and in the configs): when S has fewer than k children the rest
of the k is filled from the fallback ranking (``pad: true``); the smoothing ``eps`` applies to both logs, so a
child whose similarity the ReLU clips to 0 keeps a finite, very low L; if every child's cosine is <= 0, L is
uniform over the children.

Two paths, one result: :meth:`TracerScorer.score_embedded` scores a batch with torch; ``select_one`` /
``rank_one`` (:mod:`tracer.scorers.tracer_single_step`) score one live step with
:mod:`tracer.scorer_base.single_step` (numpy, fixed blend; the learned blend takes the batched path), cosines
in float64 rounded to float32 on both: the same rankings (tested on BFCL).

Example (plain Python; see :mod:`tracer.retriever` for the facade over live messages)::

    res = Resources.build(dataset.registry, build_embedder())
    scorer = build_scorer("tracer_fixed"); scorer.fit(dataset.trajectories, res)
    presented = finalize(scorer.score(steps), k=5).presented      # batched
    one = scorer.select_one(step, scorer.embed([step]), k=5)       # one live step
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from tracer.core.context import ContextRendering
from tracer.core.store import Verify, save_snapshot
from tracer.core.types import Step, Trajectory
from tracer.learn.blend_fit import HeadConfig, fit_blend_head
from tracer.learn.blend_head import BlendHead, fixed_blend, state_features
from tracer.memory.keys import StateKey
from tracer.memory.trie import ChildBatch, ExecutionTrie
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.persist import check_trie, load_tensors, open_index, saved_config, write_common
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import confidence, scatter_primary
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores, fit_steps
from tracer.scorers.tracer_single_step import TracerSingleStep

FORMAT_VERSION = 2
CLASS_PATH = "tracer.scorers.tracer.TracerScorer"


def prefix_entropy(trie: ExecutionTrie) -> torch.Tensor:
    """H(S | t) for every tool t: entropy of the distribution over states from which t was the next call.

    H(S | t) = -sum_S p(S | t) log p(S | t) with p(S | t) = N(S, t) / sum_S' N(S', t) (natural log).
    Returns ``[n_tools]`` (0 for tools never called).
    """
    counts = trie.edge_count.double()                                                  # [E]
    per_tool = torch.zeros(trie.n_tools, dtype=torch.double, device=trie.device).index_add_(
        0, trie.edge_tool, counts)                                                     # [n_tools]
    p = counts / per_tool[trie.edge_tool]                                              # [E]
    h = torch.zeros(trie.n_tools, dtype=torch.double, device=trie.device).index_add_(
        0, trie.edge_tool, -p * torch.log(p))
    return h.float().cpu()


class TracerScorer(TracerSingleStep, ScorerBase):
    """The TRACER retriever over one execution trie.

    Args:
        name: registry name of this configuration.
        blend: ``fixed`` (s = P + L) or ``learned`` (per-step w and T from the blend head).
        key: state key config (:class:`tracer.memory.trie.StateKey`): ``kind``, ``n``, ``cross_turn``.
        context: context rendering for the edge memories and the fallback query.
        eps: smoothing inside both priors' logs.
        tau: confidence gate; fall back when kappa < tau.
        pad: fill up to k from the fallback ranking when a node has fewer than k children.
        global_set: |G| for Tracer+G (0 = off).
        successful_only: build from successful trajectories only.
        head: every field of :class:`tracer.learn.blend_fit.HeadConfig` (learned blend; a missing or unknown
            key is an error naming it); ``None`` or empty for the fixed blend, which has no head.

    Every argument is required: the values live in ``tracer/configs/scorer/<name>.yaml``; build with
    :func:`tracer.build.build_scorer` (``build_scorer("tracer", head={"max_epochs": 1})`` merges key by key).

    Two scoring paths with the same result: :meth:`score` / :meth:`score_embedded` (batched, torch, on the
    resources' device) and :meth:`select_one` / :meth:`rank_one` (one live step through
    :mod:`tracer.scorer_base.single_step` for the fixed blend; the learned blend takes the batched path)."""

    can_save = True

    def __init__(self, *, name: str, blend: str, key: Mapping, context: Mapping, eps: float, tau: float,
                 pad: bool, global_set: int, successful_only: bool, head: Mapping | None):
        if blend not in ("fixed", "learned"):
            raise ValueError(f"blend must be 'fixed' or 'learned', got {blend!r}")
        self.name, self.blend, self.eps, self.tau, self.pad = name, blend, eps, tau, pad
        self.learned_part = "head" if blend == "learned" else None  # what a refit learns again
        self.key = StateKey.from_config(key)
        self.rendering = ContextRendering.from_config(context)
        self.global_set_size = global_set
        self.successful_only = successful_only
        self.head_cfg = dict(head or {})
        # checked now (a missing or unknown key named) rather than at fit time
        self.head_config = HeadConfig.from_config(self.head_cfg) if blend == "learned" else None
        self.head, self.head_fit = None, {}  # head_fit: the scalars of the head's last fit (describe())
        self.res: Resources | None = None
        self.trie: ExecutionTrie | None = None
        self.global_set: tuple[int, ...] = ()

    # ---- fitting -----------------------------------------------------------------------------
    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        """Build the trie and fit the head; its curves and out-of-fold data go into the report, not the
        scorer."""
        t0 = time.perf_counter()
        steps = fit_steps(trajectories, res.registry, self.successful_only)
        ctx = res.embed(steps, self.rendering)                                  # [S, d]
        self.attach(ExecutionTrie.build(steps, res.tool_ids([s.gold for s in steps]), ctx, len(res.registry),
                                        self.key, self.eps, res.device), res)
        history, data = {}, None
        if self.head_config is not None:
            self.head, history, data = fit_blend_head(trajectories, res, self.key, self.rendering, self.eps,
                                                      self.successful_only, self.head_config)
            self.head_fit = {k: v for k, v in history.items() if isinstance(v, (int, float, str, bool))}
        return FitReport(self.name, len(trajectories), len(steps), time.perf_counter() - t0, history, data)

    def attach(self, trie: ExecutionTrie, res: Resources) -> TracerScorer:
        """Use an already built trie (e.g. from :meth:`ExecutionTrie.update` on precomputed contexts)."""
        if trie.n_tools != len(res.registry):
            raise ValueError(f"trie is over {trie.n_tools} tools, the registry has {len(res.registry)}")
        if trie.key != self.key or trie.eps != self.eps:
            raise ValueError(f"trie was built with key {trie.key} and eps {trie.eps}; "
                             f"this scorer uses {self.key} and eps {self.eps}")
        self.res, self.trie = res, trie
        self.global_set = ()
        if self.global_set_size:
            h = prefix_entropy(trie)
            order = torch.sort(h, descending=True, stable=True).indices
            self.global_set = tuple(order[: self.global_set_size].tolist())
        return self

    def _check_fitted(self) -> None:
        if self.trie is None or self.res is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted: "
                               "call fit(trajectories, resources) or load()")

    # ---- scoring (batched) -------------------------------------------------------------------
    def blend_scores(self, cb: ChildBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Blended child scores ``[B, C]`` (-inf where masked) and per-step diagnostics."""
        if self.blend == "fixed":
            return fixed_blend(cb.log_p, cb.log_l, cb.mask), {}
        if self.head is None:
            raise RuntimeError(f"scorer {self.name!r} uses the learned blend but no blend head is trained: "
                               "fit it (train.py, or fit() with blend=learned) or use tracer_fixed")
        with torch.no_grad():
            w, t = self.head.wt(state_features(cb))                               # [B], [B]
            scores = self.head.blend(cb.log_p, cb.log_l, cb.mask, w, t).masked_fill(~cb.mask, float("-inf"))
        return scores, {"w": w.cpu(), "T": t.cpu()}

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """Score steps whose contexts are already embedded (``ctx [B, d]``)."""
        self._check_fitted()
        n = len(self.res.registry)
        cb = self.trie.gather(self.trie.lookup(steps), ctx)
        s, extra = self.blend_scores(cb)                                        # [B, C]; -inf off children
        has_children = cb.mask.any(1)                                           # [B]
        kappa = confidence(s)                                                   # [B] float64
        fell_back = ~has_children | (kappa < self.tau)
        return Scores(
            primary=scatter_primary(cb.tool, cb.mask, s, n).cpu(),
            fallback=fallback_scores(self.res, ctx),
            fell_back=fell_back.cpu(),
            diagnostics={"in_trie": has_children.cpu(), "kappa": kappa.float().cpu(), "depth": cb.depth.cpu(),
                         "n_children": cb.n_children.cpu(), **extra},
            always_present=self.global_set,
        )

    # ---- learning while serving (tracer.online); learned_part: the blend head, when learned ------------
    def memory_tables(self) -> list[ExecutionTrie]:
        return [self.trie] if self.trie is not None else []

    def memory_contexts(self, steps: Sequence[Step], res: Resources) -> torch.Tensor:
        return res.embed(steps, self.rendering)                                          # [S, d]

    def reattach(self, tables: Sequence[ExecutionTrie], res: Resources, touched: tuple | None = None) -> None:
        self.attach(tables[0], res)

    def describe(self) -> dict:
        """The configuration plus what fitting produced (trie size, global set, blend-head fit)."""
        out = {"scorer": self.name, "paper": "TRACER", **self.config(),
               "n_nodes": self.trie.n_nodes if self.trie else 0,
               "n_edges": self.trie.n_edges if self.trie else 0}
        if self.global_set:
            out["global_set_tools"] = [self.res.registry.names[i] for i in self.global_set]
        if self.head is not None:
            out["head_fit"] = dict(self.head_fit)
        return out

    # ---- persistence -------------------------------------------------------------------------
    def config(self) -> dict:
        return {"name": self.name, "blend": self.blend, "key": asdict(self.key),
                "context": asdict(self.rendering), "eps": self.eps, "tau": self.tau, "pad": self.pad,
                "global_set": self.global_set_size, "successful_only": self.successful_only,
                "head": self.head_cfg}

    def save(self, directory: str | Path) -> Path:
        """Write the index as a new snapshot of ``directory`` (:func:`tracer.core.store.save_snapshot`: atomic
        for readers, verified by a manifest; a directory that is not a tracer index is refused).

        Files: ``meta.json`` (format version, scorer class and config, embedder name and dim, global set),
        ``tools.json`` (the registry), ``trie.pt`` (states, CSR edges, counts, priors, the ``[E, d]``
        edge-memory tensor), ``tools.faiss`` + ``tools_idmap.json`` + ``tool_vectors.npy`` (the fallback index
        and its id map), ``blend_head.pt`` (learned blend)."""
        self._check_fitted()
        out = Path(directory)
        with save_snapshot(out) as tmp:
            write_common(tmp, {"format_version": FORMAT_VERSION, "class": CLASS_PATH, "scorer": self.config(),
                               "global_set": list(self.global_set),
                               "trie": {"n_nodes": self.trie.n_nodes, "n_edges": self.trie.n_edges,
                                        "dim": self.trie.dim}}, self.res)
            torch.save(self.trie.state_dict(), tmp / "trie.pt")
            if self.head is not None:
                torch.save(self.head.state_dict(), tmp / "blend_head.pt")
        return out

    @classmethod
    def load(cls, directory: str | Path, embedder, device: str | None = None, verify: Verify = "sha256"
             ) -> TracerScorer:
        """Load the current snapshot, checked against its manifest (``verify``: sha256, size, none); refuse
        another format version or embedder, or a FAISS id map off the registry. A corrupt file is a
        CorruptIndex naming it."""
        with open_index(directory, embedder, CLASS_PATH, FORMAT_VERSION, device, verify) as (d, meta, res):
            saved = meta["scorer"]
            obj = cls(**saved_config(saved, "tracer" if saved.get("blend") == "learned" else "tracer_fixed"))
            trie = ExecutionTrie.from_state_dict(load_tensors(d / "trie.pt", mmap=True), res.device)
            obj.res, obj.trie = res, check_trie(trie, res, d / "trie.pt")
            obj.global_set = tuple(meta["global_set"])
            if (d / "blend_head.pt").exists():
                obj.head = BlendHead.from_state_dict(load_tensors(d / "blend_head.pt")).to(res.device)
        return obj
