"""Insight memory: clustered episodic summaries distilled into lessons added to the system prompt.

After *Rethinking the Role of Tool Graph Memory in Multi-Turn Tool Use* (the Insight memory
baseline), itself related to ExpeL (Zhao et al. 2024, *ExpeL: LLM Agents Are Experiential
Learners*, AAAI, arXiv:2308.10144). From successful **and** failed training trajectories:

1. summarise every episode (one per user turn that made a tool call) with the same summaries as
   H-EPM (:mod:`tracer.scorers.summaries`: the executor model's, or the offline digest);
2. embed the summaries (``res.embedder``, MiniLM by default) and cluster them with K-means, K
   chosen among the 15 candidates ``round(linspace(5, 150, 15))`` by silhouette score, subject to
   clusters holding more than three summaries on average (K < n / 3);
3. per cluster, distil what to do and what to avoid: one model call per cluster with an executor
   model; offline a deterministic extract (the tool sequences that succeeded and that failed in the
   cluster, with their most frequent openings), labelled ``offline extract``;
4. at each step embed the five most recent messages, find the two most similar summaries and add
   their clusters' insights to the system prompt (:attr:`Scores.guidance`).

Insight changes the prompt, not the tool set: the ``insight`` scorer presents the whole registry
(``present_all``) and its ranking (for recall at k) is the vector ranking. :class:`InsightMemory`
is usable with any scorer (``insight=true`` in the evaluation adds its block to what that scorer
presents); the prompt cost it adds is the guidance text, counted by the evaluation, and reported per
step in ``Scores.extra["guidance_chars"]``.

Choices where the paper is silent (also in ``configs/scorer/insight.yaml``):

- an episode is one user turn (the request, the calls and their outcomes up to the end of the
  turn); its outcome is the trajectory's (turns carry no reward of their own);
- silhouette on Euclidean distance between normalised embeddings (monotone in cosine), computed on
  at most ``silhouette_sample`` summaries; ties go to the smaller K; one k-means++ run per K
  (``n_init: auto``), seeded by ``res.seed``;
- when no candidate satisfies K < n / 3 (fewer than 16 summaries) we take the largest K below
  n / 3 (at least 1) without a silhouette;
- when both nearest summaries fall in one cluster its insight is added once;
- the offline extract lists at most three sequences of each kind; a sequence counts as "to avoid"
  only if it failed and never succeeded in the cluster.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from tracer.core.context import ContextRendering
from tracer.core.types import Step, Trajectory
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import no_proposal
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.summaries import Episode, Summarizer, episodes, most_common


def candidate_ks(lo: int = 5, hi: int = 150, num: int = 15) -> list[int]:
    """The K grid: ``round(linspace(lo, hi, num))`` (5, 15, 26, 36, 46, 57, 67, 78, 88, 98, 109, ...)."""
    return sorted({int(k) for k in np.round(np.linspace(lo, hi, num))})


def select_k(x: np.ndarray, seed: int = 0, grid: Sequence[int] | None = None, sample: int | None = 5000,
             n_init: int | str = "auto") -> tuple[int, np.ndarray, dict[int, float]]:
    """K-means with K chosen by silhouette among the grid's K with 2 <= K < n / 3.

    Args:
        x: ``[n, d]`` points (embedded summaries).
        seed: K-means and silhouette-sampling seed.
        grid: candidate K (default :func:`candidate_ks`).
        sample: silhouette computed on at most this many points (None: all).
        n_init: K-means restarts per K (scikit-learn's ``"auto"``: one k-means++ run; 15 candidate K
            with 10 restarts each take minutes on a few hundred MiniLM vectors and two cores).

    Returns:
        (K, labels ``[n]``, {candidate K: silhouette}).
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    n = len(x)
    if n == 0:
        return 0, np.zeros(0, dtype=int), {}
    valid = [k for k in (candidate_ks() if grid is None else grid) if 2 <= k < n / 3 and k < n]
    distinct = len(np.unique(x, axis=0))
    scores: dict[int, float] = {}
    best: tuple[float, int, np.ndarray] | None = None
    for k in valid:
        if k > distinct:
            continue
        labels = KMeans(n_clusters=k, random_state=seed, n_init=n_init).fit_predict(x)
        if len(set(labels.tolist())) < 2:
            continue
        s = float(silhouette_score(x, labels, sample_size=None if sample is None or n <= sample else sample,
                                   random_state=seed))
        scores[k] = s
        if best is None or s > best[0]:
            best = (s, k, labels)
    if best is not None:
        return best[1], best[2], scores
    k = min(max(1, math.ceil(n / 3) - 1), distinct)
    labels = np.zeros(n, dtype=int) if k == 1 else KMeans(n_clusters=k, random_state=seed,
                                                             n_init=n_init).fit_predict(x)
    return k, labels, scores


def _seq(calls: Sequence[str]) -> str:
    return " -> ".join(calls)


def offline_extract(cluster: int, members: Sequence[Episode], top: int = 3) -> str:
    """The deterministic insight of a cluster: sequences that succeeded / failed and their openings."""
    ok = [e.calls for e in members if e.success]
    bad = [e.calls for e in members if not e.success]
    avoid = [c for c in bad if c not in set(ok)]

    def listed(seqs: list[tuple[str, ...]]) -> str:
        return ", ".join(f"{_seq(s)} ({n}x)" for s, n in most_common(seqs, top)) or "none"

    def openings(seqs: list[tuple[str, ...]]) -> str:
        return ", ".join(f"{s} ({n}x)" for s, n in most_common([q[0] for q in seqs], top)) or "none"

    return (f"cluster {cluster} (offline extract; {len(ok)} succeeded, {len(bad)} failed episodes): "
            f"Do: {listed(ok)}; usual opening: {openings(ok)}. "
            f"Avoid: {listed(avoid)}; failing opening: {openings(bad)}.")


class InsightMemory:
    """Clustered episodic summaries with one distilled insight per cluster.

    Args:
        summarizer: ``auto`` (the executor model when configured, else the offline digest),
            ``model`` or ``offline``; also decides who distils the clusters.
        neighbours: nearest summaries retrieved per step (the paper's two).
        query: rendering of the step's recent messages.
        silhouette_sample: points the silhouette is computed on, at most.
        n_init: K-means restarts per candidate K (see :func:`select_k`).
        max_calls: calls listed in the offline digest of an episode.
        max_episodes, max_episode_chars: summaries of a cluster shown to the model when distilling, and
            characters of each.

    Values: the ``memory:`` node of ``tracer/configs/scorer/insight.yaml``
    (:func:`tracer.build.build_insight_memory`, also what ``evaluate.py insight=true`` adds to any scorer).
    """

    def __init__(self, *, summarizer: str, neighbours: int, query: Mapping, silhouette_sample: int | None,
                 n_init: int | str, max_calls: int, max_episodes: int, max_episode_chars: int):
        self.summarizer = Summarizer(summarizer, max_calls)
        self.neighbours = neighbours
        self.rendering = ContextRendering.from_config(query)
        self.silhouette_sample, self.n_init = silhouette_sample, n_init
        self.max_episodes, self.max_episode_chars = max_episodes, max_episode_chars
        self.res: Resources | None = None
        self.episodes: list[Episode] = []
        self.embeddings = torch.zeros(0, 0)        # [M, d] embedded summaries
        self.labels = torch.zeros(0, dtype=torch.long)  # [M] cluster of each summary
        self.k = 0
        self.silhouettes: dict[int, float] = {}
        self.insights: list[str] = []              # [K] one per cluster

    @property
    def model_calls(self) -> int:
        return self.summarizer.model_calls

    @property
    def label(self) -> str:
        if not self.summarizer.bound and self.summarizer.source != "offline":
            return "insights distilled by the model when an executor is configured, else offline extract"
        return ("insights distilled by the model" if self.summarizer.uses_model
                else "offline extract (no model)")

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> InsightMemory:
        self.res = res
        self.summarizer.bind(res)
        self.episodes = [Episode(t.id, turn, self.summarizer.summarise(msgs), calls, bool(t.success))
                         for t in trajectories for turn, msgs, calls in episodes(t)]
        self.embeddings = res.embedder.encode([e.text for e in self.episodes]).float().cpu()  # [M, d]
        k, labels, self.silhouettes = select_k(self.embeddings.numpy(), res.seed,
                                               sample=self.silhouette_sample, n_init=self.n_init)
        self.k, self.labels = k, torch.as_tensor(labels, dtype=torch.long)
        self.insights = [self.distil(c, [e for e, lab in zip(self.episodes, labels) if lab == c])
                         for c in range(k)]
        return self

    def distil(self, cluster: int, members: Sequence[Episode]) -> str:
        if not self.summarizer.uses_model:
            return offline_extract(cluster, members)
        shown = "\n".join(f"- [{'succeeded' if e.success else 'failed'}] {e.text[: self.max_episode_chars]}"
                          for e in members[: self.max_episodes])
        answer = self.summarizer.complete(
            "These are summaries of similar past episodes of a tool-using assistant, labelled by outcome:\n"
            f"{shown}\nIn at most three short bullet points, "
            "say what to do and what to avoid in such situations.")
        return f"cluster {cluster} (distilled by the model): {answer}"

    def nearest(self, steps: Sequence[Step]) -> torch.Tensor:
        """Indices of the ``neighbours`` summaries most similar to each step's recent messages, ``[B, m]``."""
        q = self.res.embedder.encode(
            [self.rendering.render(s.context) for s in steps]).float().cpu()                        # [B, d]
        sim = q @ self.embeddings.T                                                                 # [B, M]
        order = torch.sort(sim, dim=1, descending=True, stable=True).indices                       # [B, M]
        return order[:, : self.neighbours]

    def clusters(self, steps: Sequence[Step]) -> list[list[int]]:
        """The distinct clusters of each step's nearest summaries, nearest first."""
        if not self.episodes:
            return [[] for _ in steps]
        out = []
        for row in self.labels[self.nearest(steps)].tolist():
            out.append(list(dict.fromkeys(row)))
        return out

    def guidance(self, steps: Sequence[Step]) -> list[str]:
        """The block added to the system prompt at each step ('' when the memory is empty)."""
        out = []
        for cs in self.clusters(steps):
            if not cs:
                out.append("")
                continue
            lines = "\n".join(f"- {self.insights[c]}" for c in cs)
            out.append(f"[Insight memory; {self.summarizer.label}; {self.label}] "
                       f"Lessons from similar past episodes:\n{lines}")
        return out

    def describe(self) -> dict:
        return {"memory": "insight", "summaries": self.summarizer.label, "insights": self.label, "k": self.k,
                "silhouettes": dict(self.silhouettes), "n_episodes": len(self.episodes),
                "n_failed": sum(not e.success for e in self.episodes), "neighbours": self.neighbours,
                "model_calls": self.model_calls, "lessons": list(self.insights)}


class InsightScorer(ScorerBase):
    """The Insight memory alone: the whole registry presented, the memory's block in the prompt.

    Args:
        name: registry name.
        context: rendering of the vector-fallback query (the ranking used for recall at k).
        memory: the :class:`InsightMemory` (the YAML's ``memory:`` node has its ``_target_``).
        pad: structural, not in the YAML: the whole registry is presented.
    """

    def __init__(self, *, name: str, context: Mapping, memory: InsightMemory, pad: bool = True):
        if not isinstance(memory, InsightMemory):
            raise TypeError(f"memory must be an InsightMemory (a node with _target_: "
                            f"tracer.scorers.insight.InsightMemory), got {type(memory).__name__}")
        self.name, self.pad = name, pad
        self.rendering = ContextRendering.from_config(context)
        self.memory = memory
        self.res: Resources | None = None

    @property
    def model_calls(self) -> int:
        return self.memory.model_calls

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        t0 = time.perf_counter()
        self.res = res
        self.memory.fit(trajectories, res)
        return FitReport(self.name, len(trajectories), len(self.memory.episodes), time.perf_counter() - t0,
                         {"clusters": self.memory.k})

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """``ctx [B, d]``: the steps' contexts under :attr:`rendering` (the vector-fallback query)."""
        self._check_fitted()
        b = len(steps)
        guidance = self.memory.guidance(steps)
        return Scores(primary=no_proposal(b, len(self.res.registry)), fallback=fallback_scores(self.res, ctx),
                      fell_back=torch.ones(b, dtype=torch.bool), present_all=True, guidance=guidance,
                      diagnostics={"guidance_chars": torch.tensor([len(g) for g in guidance])})

    def describe(self) -> dict:
        return {"scorer": self.name, "paper": "Insight memory (Rethinking the Role of Tool Graph Memory in "
                "Multi-Turn Tool Use; ExpeL, arXiv:2308.10144)",
                "presented": "whole registry plus the insight block", "ranking": "vector",
                **self.memory.describe()}
