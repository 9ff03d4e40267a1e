"""H-EPM: a tool graph of successful transitions whose edges carry episodic state summaries.

Li et al. (2026), *Experience-Evolving Multi-Turn Tool-Use Agent with Hybrid Episodic-Procedural
Memory* (H-EPM; v1 titled SIT-Graph), arXiv:2512.07287. Built from successful trajectories:

    w'(a, b) = N(a, b) + c * sum_{k : a->b in trajectory k} 1 / n_k
    w(a, b)  = w'(a, b) / sum_{b'} w'(a, b')                        (over the successors of a)

with N(a, b) the number of times b was called right after a. Our reading of n_k (the paper writes
it as "the number of steps of the k-th trajectory that took it"): the length in tool calls of
trajectory k, summed once over every trajectory k that contains the transition, so transitions of
short (efficient) successful trajectories gain weight. With c = 0 the weights are normalised counts.

Each edge a->b also stores one annotation per occurrence: the summary of the state in which b was
called, and its embedding. At a step, take the node of the last call (START for the first call).
If the step is *summarised*, its successors are ranked by the maximum cosine of the current
summary's embedding with each edge's annotations (episodic recall); otherwise by weight
(procedural execution). The top two are suggested in one guidance line; the whole registry stays
in the prompt (``present_all``). The ranking used for recall at k is the successors in this order,
then the vector ranking.

Summaries and the decision to summarise come from the executor model when one is configured
(:mod:`tracer.scorers.summaries`; one model call per summary, counted in ``model_calls``).
Offline they are a deterministic digest of the state (latest user request, calls so far and their
outcomes) and the decision is a policy: ``always``, ``never`` or ``turn_start`` (summarise at the
first call of each user turn). ``describe()`` and every guidance line say which.

Choices where the paper is silent (also in ``configs/scorer/hepm.yaml``):

- the last call is taken across turns; the first call of a conversation starts from START;
- training annotations summarise every occurrence whatever the decision policy (the policy only
  decides, at test time, which branch ranks the successors);
- with ``policy: auto`` and a model, one call per step both decides and summarises (the model
  answers SKIP for a routine step); offline ``auto`` means ``turn_start``;
- when the last tool has no successors there is no suggestion line (empty guidance), the ranking
  is the vector ranking and the step is marked ``fell_back``, ``in_trie = False``;
- with one successor only one tool is suggested; ties are broken by the vector ranking.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence

import torch

from tracer.core.context import ContextRendering
from tracer.core.steps import extract_steps
from tracer.core.types import Step, Trajectory
from tracer.memory.keys import LAST_CALL
from tracer.memory.transitions import TransitionTable
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import rank, scatter_primary
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.summaries import Summarizer

POLICIES = ("auto", "always", "never", "turn_start")


class HEPMScorer(ScorerBase):
    """Tool graph with efficiency-weighted edges and per-occurrence state annotations.

    Args:
        name: registry name.
        c: weight of the efficiency term (0 = normalised counts).
        policy: when a step is summarised: ``auto`` (the model decides; offline ``turn_start``),
            ``always``, ``never`` or ``turn_start``. ``{rule: turn_start}`` is accepted too.
        summarizer: ``auto`` (model when an executor is configured), ``model`` or ``offline``.
        suggest: how many tools the guidance line names (the paper's two).
        context: rendering of the fallback query.
        max_calls: calls listed in the offline digest.
        pad: structural, not in the YAML: fill up to k from the vector ranking.
    """

    def __init__(self, *, name: str, c: float, policy: str | Mapping, summarizer: str, suggest: int,
                 context: Mapping, max_calls: int, pad: bool = True):
        if isinstance(policy, Mapping):
            policy = policy.get("rule", "auto")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)} (or {{rule: turn_start}}), "
                             f"got {policy!r}")
        if c < 0:
            raise ValueError(f"c must be >= 0, got {c}")
        self.name, self.c, self.policy, self.suggest, self.pad = name, c, policy, suggest, pad
        self.summarizer = Summarizer(summarizer, max_calls)
        self.rendering = ContextRendering.from_config(context)
        self.res: Resources | None = None
        self.trie: TransitionTable | None = None
        self.edge_weight = torch.zeros(0)           # [E] w(a, b), normalised over the successors of a
        self.ann_edge = torch.zeros(0, dtype=torch.long)  # [A] edge of each annotation
        self.ann_emb = torch.zeros(0, 0)            # [A, d] embedded summaries
        self.ann_text: list[str] = []               # [A] the summaries themselves
        self.fit_model_calls = 0

    @property
    def model_calls(self) -> int:
        """Model calls made so far (fitting and scoring), each one summary or decision."""
        return self.summarizer.model_calls

    @property
    def effective_policy(self) -> str:
        if self.policy == "auto":
            if not self.summarizer.bound and self.summarizer.source != "offline":
                return "auto (the model decides when an executor is configured, else turn_start)"
            return "model decides" if self.summarizer.uses_model else "turn_start"
        return self.policy

    # ---- fitting -----------------------------------------------------------------------------
    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        t0 = time.perf_counter()
        self.res = res
        self.summarizer.bind(res)
        steps: list[Step] = []
        efficiency: dict[tuple[tuple[str, ...], str], float] = defaultdict(float)
        for traj in trajectories:
            if not traj.success:
                continue
            all_steps = extract_steps(traj)
            kept = [s for s in all_steps if s.gold in res.registry]
            for transition in {(s.history[-1:], s.gold) for s in kept}:   # once per trajectory
                efficiency[transition] += 1.0 / len(all_steps)
            steps.extend(kept)
        self.trie = TransitionTable.build(steps, res.tool_ids([s.gold for s in steps]), len(res.registry),
                                          LAST_CALL)
        states = self.trie.node_states
        edge_node = self.trie.edge_node()                                                  # [E]
        names = self.res.registry.names
        eff = torch.tensor([efficiency[(states[u], names[t])] for u, t in
                            zip(edge_node.tolist(), self.trie.edge_tool.tolist())], dtype=torch.float64)
        w = self.trie.edge_count.double() + self.c * eff                                   # [E] w'(a, b)
        total = torch.zeros(self.trie.n_nodes, dtype=torch.float64).index_add_(0, edge_node, w)  # [U]
        self.edge_weight = (w / total[edge_node]).float() if len(w) else torch.zeros(0)
        # One annotation per occurrence: the summary of the state in which the edge was taken.
        self.ann_edge = self.edge_ids(steps)
        self.ann_text = [self.summarizer.summarise(s.context) for s in steps]
        self.ann_emb = res.embedder.encode(self.ann_text).float().cpu()                   # [A, d]
        self.fit_model_calls = self.summarizer.model_calls
        return FitReport(self.name, len(trajectories), len(steps), time.perf_counter() - t0,
                         {"model_calls": self.fit_model_calls})

    def edge_ids(self, steps: Sequence[Step]) -> torch.Tensor:
        """Edge id of each (seen) step's transition, ``[S]``: edges are sorted by (node, tool), so one
        ``searchsorted`` over the keys node * N + tool finds them."""
        n = self.trie.n_tools
        key = self.trie.edge_node() * n + self.trie.edge_tool                              # [E] ascending
        want = self.trie.lookup(steps) * n + self.res.tool_ids([s.gold for s in steps])    # [S]
        at = torch.searchsorted(key, want)
        if len(want) and not bool((key[at.clamp_max(len(key) - 1)] == want).all()):
            raise ValueError("a step's transition is not an edge of the trie")
        return at

    def weights(self, previous: str | None) -> dict[str, float]:
        """{tool: w(previous, tool)} for a previous tool name (None = START)."""
        u = self.trie.node(() if previous is None else (previous,))
        if u < 0:
            return {}
        lo, hi = int(self.trie.indptr[u]), int(self.trie.indptr[u + 1])
        return {self.res.registry[t].name: float(w) for t, w in
                zip(self.trie.edge_tool[lo:hi].tolist(), self.edge_weight[lo:hi])}

    # ---- scoring -----------------------------------------------------------------------------
    def summaries(self, steps: Sequence[Step]) -> list[str | None]:
        """The current state summary of each step, or None where the step is not summarised."""
        out: list[str | None] = []
        for s in steps:
            if self.policy == "auto" and self.summarizer.uses_model:
                out.append(self.summarizer.decide_and_summarise(s.context))
                continue
            policy = self.effective_policy
            on = policy == "always" or (policy == "turn_start" and s.opens_turn)
            out.append(self.summarizer.summarise(s.context) if on else None)
        return out

    def recall(self, query: torch.Tensor, edge: torch.Tensor, mask: torch.Tensor,
               chunk: int = 256) -> torch.Tensor:
        """Max cosine of each query ``[B, d]`` with the annotations of the edges ``[B, C]`` -> ``[B, C]``."""
        out = torch.full(edge.shape, float("-inf"))
        n_edges = max(self.trie.n_edges, 1)
        for lo in range(0, len(query), chunk):  # bound the [b, A] and [b, E] intermediates
            q = query[lo:lo + chunk]
            sim = q @ self.ann_emb.T                                                      # [b, A]
            per_edge = torch.full((len(q), n_edges), float("-inf")).scatter_reduce(
                1, self.ann_edge.expand(len(q), -1), sim, reduce="amax", include_self=True)  # [b, E]
            out[lo:lo + chunk] = per_edge.gather(1, edge[lo:lo + chunk])                  # [b, C]
        return torch.where(mask, out, torch.full_like(out, float("-inf")))

    def score(self, steps: Sequence[Step]) -> Scores:
        if self.trie is None or self.res is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted")
        b, n = len(steps), len(self.res.registry)
        node = self.trie.lookup(steps)                                                    # [B]
        cb = self.trie.gather(node)
        start = torch.where(node >= 0, self.trie.indptr[node.clamp_min(0)], torch.zeros_like(node))
        edge = torch.where(cb.mask, start[:, None] + torch.arange(cb.mask.shape[1])[None, :], 0)  # [B, C]
        values = torch.where(cb.mask, self.edge_weight[edge] if self.trie.n_edges else edge.float(),
                             torch.full(edge.shape, float("-inf")))                       # [B, C]
        summaries = self.summaries(steps)
        summarised = torch.tensor([q is not None for q in summaries], dtype=torch.bool)   # [B]
        rows = [i for i, q in enumerate(summaries) if q is not None and bool(cb.mask[i].any())]
        # one encoder call for the fallback contexts and the summaries
        vecs = self.res.embedder.encode([self.rendering.render(s.context) for s in steps]
                                        + [summaries[i] for i in rows]).float().cpu()   # [B + R, d]
        ctx = vecs[:b].to(self.res.device)                                                # [B, d]
        if rows:
            values[rows] = self.recall(vecs[b:], edge[rows], cb.mask[rows])
        primary = scatter_primary(cb.tool, cb.mask, values, n)                            # [B, N]
        fallback = fallback_scores(self.res, ctx)
        has_children = cb.mask.any(1)
        scores = Scores(primary=primary, fallback=fallback, fell_back=~has_children,
                        diagnostics={"in_trie": has_children, "depth": cb.depth, "n_children": cb.n_children,
                                     "summarised": summarised}, present_all=True)
        scores.guidance = self.guidance_lines(scores, summarised)
        scores.diagnostics["guidance_chars"] = torch.tensor([len(g) for g in scores.guidance])
        return scores

    def suggested(self, scores: Scores) -> list[list[int]]:
        """The registry ids each step's guidance line suggests (best first; empty: no line, no successors)."""
        ranking = rank(scores.primary, scores.fallback, torch.zeros_like(scores.fell_back))  # [B, N]
        return [ranking[i, :min(self.suggest, int(scores.diagnostics["n_children"][i]))].tolist()
                for i in range(len(ranking))]

    def guidance_lines(self, scores: Scores, summarised: torch.Tensor) -> list[str]:
        lines = []
        for i, ids in enumerate(self.suggested(scores)):
            k = len(ids)
            if k == 0:
                lines.append("")
                continue
            tools = ", ".join(self.res.registry[t].name for t in ids)
            how = "recalled by state summary" if summarised[i] else "by transition weight"
            lines.append(f"[H-EPM memory; {self.summarizer.label}; summarise: {self.effective_policy}] "
                         f"Suggested next tool{'s' if k > 1 else ''} ({how}): {tools}")
        return lines

    def describe(self) -> dict:
        return {"scorer": self.name, "paper": "H-EPM (Li et al. 2026, arXiv:2512.07287)", "c": self.c,
                "summaries": self.summarizer.label, "policy": self.effective_policy, "suggest": self.suggest,
                "model_calls": self.model_calls, "fit_model_calls": self.fit_model_calls,
                "n_edges": self.trie.n_edges if self.trie else 0, "n_annotations": len(self.ann_text),
                "presented": "whole registry plus one suggestion line"}
