"""``cascade``: two ``tracer_plus`` stages over two encoders; the slow one only where the fast one is unsure.

A live step's cost is almost all its context encode (docs/encoders.md): a static encoder takes ~0.05 ms, a
fine-tuned transformer in ONNX int8 1.5-3.5 ms, and the transformer ranks better. Most steps do not need it:
where the tries have seen the state often, the candidate model is sure, and right. So the *fast* stage
(tracer_plus over a static encoder) scores every step, and its candidate model's own confidence decides
whether the step goes on to the *slow* stage (tracer_plus over the fine-tuned encoder, its own tries and
candidate model), which encodes the context with its encoder and answers instead.

The gate: the fast model's probability that the gold is among its top ``gate_k`` candidates,

    conf = sum of the gate_k largest softmax(s)(t) over the step's candidates t      (0 without candidates)

and a step escalates when ``conf < threshold``. The threshold is set at fit time from the fast stage's
out-of-fold training steps (each scored by tries that never saw its trajectory, as a test step is:
``TracerPlusScorer.inner_scores``) as their ``escalate`` quantile, so ``escalate`` is the share of steps
expected to pay for the slow encoder (a test set, scored by tries built on every training step, is a little
surer: the share escalated is reported per step, ``Scores.diagnostics["escalated"]``, and per fit).

Stages: ``fast`` is fitted on the resources passed to :meth:`fit`, ``slow`` on their ``slow`` (the same
registry under the second encoder): ``FoldEncoders`` (:mod:`tracer.learn.encoders`) builds both from
``encoder_training=cascade`` (``encoder_training.slow``, a second recipe trained on the same trajectories).

References: cascade ranking (Wang, Lin and Metzler, "A cascade ranking model for efficient ranked
retrieval", SIGIR 2011); confidence-gated early exits (Schwartz et al., "The right tool for the job", ACL
2020).

Example::

    res = build_fold_encoders(registry, "cascade")(trajectories)          # tracer.build
    scorer = build_scorer("cascade"); scorer.fit(trajectories, res)     # res.slow: the second encoder
    ids = scorer.select_one(step, scorer.embed([step]), k=5)            # the slow encoder runs only if unsure
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tracer.core.errors import DataError
from tracer.core.store import MANIFEST, Verify, open_snapshot, save_snapshot
from tracer.core.types import Step, Trajectory
from tracer.encode.bundle import ENCODERS
from tracer.encode.embedders import Embedder
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.persist import read_meta
from tracer.scorer_base.protocol import Contexts, ScorerBase
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources
from tracer.scorers.tracer_plus import TracerPlusScorer

FORMAT_VERSION = 1
CLASS_PATH = "tracer.scorers.cascade.CascadeScorer"
STAGES = ("fast", "slow")


def gate_confidence(scores: np.ndarray, k: int) -> np.ndarray:
    """``[B]`` float64: the softmax mass of each row's ``k`` best scores (``scores [B, C]``, ``-inf`` where
    there is no candidate); 0 for a row without a finite score. The one definition for the batched and the
    live path."""
    s = np.asarray(scores, dtype=np.float64)
    if s.shape[1] == 0:
        return np.zeros(len(s))
    top = s.max(1, keepdims=True)                                                  # [B, 1]
    ok = np.isfinite(top[:, 0])
    p = np.exp(s - np.where(np.isfinite(top), top, 0.0))                           # [B, C], 0 where -inf
    # sorted, then summed in order: a row of C candidates and the same row scattered over N tools (zeros added
    # exactly) give the same bits, so the live path and the batched one escalate the same steps
    mass = np.cumsum(-np.sort(-p, axis=1), axis=1)                                 # [B, C]
    return np.where(ok, mass[:, min(k, s.shape[1]) - 1] / np.where(ok, mass[:, -1], 1.0), 0.0)


class CascadeScorer(ScorerBase):
    """Fast stage for every step, slow stage where the fast one's gate is below its threshold (module
    docstring).

    Args:
        name: registry name.
        fast: the first stage (built from ``scorer/tracer_plus.yaml``), fitted on the resources' encoder.
        slow: the second stage, fitted on the resources' ``slow`` encoder.
        escalate: the share (0-1) of the fast stage's out-of-fold training steps whose gate falls below the
            threshold: the expected share of live steps that run the slow encoder.
        gate_k: the gate is the fast model's probability that the gold is among its ``gate_k`` best candidates
            (the k of the presented set it protects).
    """

    can_save = True
    # two stages over two encoders and a gate calibrated on their fit: refitted, not updated
    updatable = False

    def __init__(self, *, name: str, fast: TracerPlusScorer, slow: TracerPlusScorer, escalate: float,
                 gate_k: int):
        for arg, stage in (("fast", fast), ("slow", slow)):
            if not isinstance(stage, TracerPlusScorer):
                raise TypeError(f"cascade: {arg} must be a tracer_plus scorer (scorer/tracer_plus.yaml), got "
                                f"{type(stage).__name__}")
            if stage.transfer:
                raise ValueError(f"cascade: {arg}.transfer: the gate is calibrated on the stage's own "
                                 f"out-of-fold fit, which a transferred candidate model does not have")
        if isinstance(escalate, bool) or not isinstance(escalate, (int, float)) or not 0.0 <= escalate <= 1.0:
            raise ValueError(f"cascade: escalate must be a share between 0 and 1, got {escalate!r}")
        if isinstance(gate_k, bool) or not isinstance(gate_k, int) or gate_k < 1:
            raise ValueError(f"cascade: gate_k must be an int >= 1, got {gate_k!r}")
        self.name, self.fast, self.slow = name, fast, slow
        self.escalate, self.gate_k = float(escalate), gate_k
        self.pad, self.successful_only = fast.pad, fast.successful_only
        self.rendering = fast.rendering
        self.threshold: float | None = None
        self.history: dict = {}

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        """Both stages (``fast`` on ``res``, ``slow`` on ``res.slow``), then the gate's threshold."""
        if res.slow is None:
            raise ValueError("cascade: the resources have no slow stage (Resources.slow: the registry under "
                             "the second encoder); build them with FoldEncoders from a recipe with a slow "
                             "recipe (encoder_training=cascade)")
        if res.slow.registry.names != res.registry.names:
            raise ValueError("cascade: the two stages' resources hold different registries")
        t0 = time.perf_counter()
        fast = self.fast.fit(trajectories, res)
        t1 = time.perf_counter()
        slow = self.slow.fit(trajectories, res.slow)
        conf = gate_confidence(self.fast.inner_scores.numpy(), self.gate_k)                       # [S]
        # escalate 0: nothing is below -inf; 1: everything is below +inf
        self.threshold = (float("-inf") if self.escalate == 0 else float("inf") if self.escalate == 1
                          else float(np.quantile(conf, self.escalate)))
        self.res = res
        self.history = {"threshold": self.threshold, "inner_escalated": float((conf < self.threshold).mean()),
                        "inner_steps": len(conf), "seconds_fast": t1 - t0,
                        "seconds_slow": time.perf_counter() - t1,
                        # the threshold other shares would have set, on the same fit
                        # (experiments/studies/cascade/cascade_curve.py)
                        "thresholds": {f"{e:.2f}": float(np.quantile(conf, e))
                                       for e in np.arange(1, 20) / 20}}
        return FitReport(self.name, len(trajectories), fast.n_steps, time.perf_counter() - t0,
                         {**self.history, **{f"fast.{k}": v for k, v in fast.history.items()},
                          **{f"slow.{k}": v for k, v in slow.history.items()}})

    def _check_fitted(self) -> None:
        if self.res is None or self.threshold is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted: call fit(trajectories, resources)")

    def embed(self, steps: Sequence[Step]) -> Contexts:
        """The fast stage's contexts (memory, query) ``[B, d]``; the slow stage embeds only the steps it
        gets."""
        self._check_fitted()
        return self.fast.embed(steps)

    # ---- batched -----------------------------------------------------------------------------
    def score_embedded(self, steps: Sequence[Step], *contexts: torch.Tensor) -> Scores:
        """The fast stage's scores, with the rows of the steps it is unsure of replaced by the slow
        stage's."""
        self._check_fitted()
        out = self.fast.score_embedded(steps, *contexts)
        primary = torch.where(out.fell_back[:, None], float("-inf"), out.primary)            # [B, N]
        conf = gate_confidence(primary.numpy(), self.gate_k)                                   # [B]
        up = np.flatnonzero(conf < self.threshold)
        diagnostics = {**out.diagnostics, "gate": torch.from_numpy(conf).float(),
                       "escalated": torch.zeros(len(steps))}
        if len(up):
            slow = self.slow.score([steps[i] for i in up])
            rows = torch.from_numpy(up)
            out.primary[rows], out.fallback[rows], out.fell_back[rows] = (slow.primary, slow.fallback,
                                                                          slow.fell_back)
            for key, v in slow.diagnostics.items():
                if key in diagnostics:
                    diagnostics[key][rows] = v.to(diagnostics[key].dtype)
            if out.reserve is not None or slow.reserve is not None:  # each row keeps its own stage's claim
                out.reserve = list(out.reserve or [()] * len(steps))
                for i, claim in zip(up, slow.reserve or [()] * len(up)):
                    out.reserve[i] = claim
                out.reserve_slots = max(out.reserve_slots, slow.reserve_slots)
            diagnostics["escalated"][rows] = 1.0
        out.diagnostics = diagnostics
        return out

    # ---- one live step -----------------------------------------------------------------------
    def _stage(self, step: Step, contexts: Contexts):
        """(fast stage's :meth:`~TracerPlusScorer.score_step`, or None where the step escalates)."""
        self._check_fitted()
        scored = self.fast.score_step(step, *contexts)
        one, s, _ = scored
        unsure = not len(one.tool) or self.fast.zero_shot_only  # no model scores: escalate, as batched
        conf = 0.0 if unsure else gate_confidence(s[None], self.gate_k)[0]
        return scored if conf >= self.threshold else None

    def select_one(self, step: Step, contexts: Contexts, k: int, pad: bool | None = None) -> tuple[int, ...]:
        scored = self._stage(step, contexts)
        if scored is None:
            return self.slow.select_one(step, self.slow.embed([step]), k, pad)
        return self.fast.select_scored(scored, k, pad)

    def rank_one(self, step: Step, contexts: Contexts, top: int | None = None) -> np.ndarray:
        scored = self._stage(step, contexts)
        if scored is None:
            return self.slow.rank_one(step, self.slow.embed([step]), top)
        return self.fast.rank_scored(scored, top)

    def describe(self) -> dict:
        return {"scorer": self.name, "escalate": self.escalate, "gate_k": self.gate_k,
                "fit": dict(self.history), "fast": self.fast.describe(), "slow": self.slow.describe()}

    # ---- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write both stages as one new snapshot of ``directory`` (:func:`tracer.core.store.save_snapshot`): a
        reader sees the two stages of one save, never one stage of each. Files: ``meta.json`` (class, config,
        threshold, fit summary, both embedders: ``embedder`` the fast one's, ``slow_embedder``) and each
        stage's index files (:meth:`TracerPlusScorer.save`) under the prefix ``fast.`` / ``slow.``, and the
        encoders both carry under ``encoders/`` (:mod:`tracer.encode.bundle`)."""
        self._check_fitted()
        out = Path(directory)
        with save_snapshot(out) as tmp:
            metas = {}
            for stage in STAGES:
                # same disk: moves rename
                scratch = Path(tempfile.mkdtemp(prefix=".tmp-stage-", dir=tmp.parent))
                try:
                    with open_snapshot(getattr(self, stage).save(scratch / stage), "none") as snap:
                        for f in sorted(snap.iterdir()):
                            if f.name == ENCODERS:  # the encoders it carries: one folder for both stages' ids
                                for enc in f.iterdir():
                                    (tmp / ENCODERS).mkdir(exist_ok=True)
                                    if not (tmp / ENCODERS / enc.name).exists():
                                        os.replace(enc, tmp / ENCODERS / enc.name)
                            elif f.name != MANIFEST:
                                os.replace(f, tmp / f"{stage}.{f.name}")
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
                metas[stage] = json.loads((tmp / f"{stage}.meta.json").read_text())["embedder"]
            meta = {"format_version": FORMAT_VERSION, "class": CLASS_PATH, "threshold": self.threshold,
                    "scorer": {"name": self.name, "escalate": self.escalate, "gate_k": self.gate_k},
                    "fit": self.history, "embedder": metas["fast"], "slow_embedder": metas["slow"]}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        return out

    @classmethod
    def load(cls, directory: str | Path, embedder: Embedder, device: str | None = None,
             verify: Verify = "sha256", slow_embedder: Embedder | None = None) -> CascadeScorer:
        """Load a saved cascade (its current snapshot, verified): ``embedder`` encodes for the fast stage,
        ``slow_embedder`` for the slow one (``Retriever.load`` builds both from the configs saved with them);
        each stage is checked as :meth:`TracerPlusScorer.load` checks an index."""
        with open_snapshot(directory, verify) as snap:
            meta = read_meta(snap / "meta.json")
            if meta.get("format_version") != FORMAT_VERSION or meta.get("class") != CLASS_PATH:
                raise ValueError(f"{snap / 'meta.json'}: format version {meta.get('format_version')} "
                                 f"of class {meta.get('class')}, expected {FORMAT_VERSION} of {CLASS_PATH}; "
                                 "rebuild the index")
            if slow_embedder is None:
                raise ValueError(f"{snap / 'meta.json'}: a cascade's slow stage needs its embedder "
                                 f"({meta['slow_embedder']['name']!r}): pass slow_embedder, "
                                 "or load with Retriever.load")
            stages = {}
            with tempfile.TemporaryDirectory(prefix="tracer-cascade-") as view:
                for stage, emb in (("fast", embedder), ("slow", slow_embedder)):
                    # the stage's files under their own names (links: nothing copied)
                    (Path(view) / stage).mkdir()
                    for f in snap.glob(f"{stage}.*"):
                        (Path(view) / stage / f.name.removeprefix(f"{stage}.")).symlink_to(f.resolve())
                    try:
                        stages[stage] = TracerPlusScorer.load(Path(view) / stage, emb, device, verify="none")
                    except ValueError as e:  # name the saved file, not its link in the view
                        e.args = tuple(str(a).replace(f"{Path(view) / stage}/", f"{snap}/{stage}.")
                                       for a in e.args)
                        if isinstance(e, DataError):
                            e.path = e.path.replace(f"{Path(view) / stage}/", f"{snap}/{stage}.")
                        raise
            obj = cls(**meta["scorer"], **stages)
            obj.threshold, obj.history = float(meta["threshold"]), dict(meta.get("fit") or {})
            obj.res = obj.fast.res
            obj.res.slow = obj.slow.res
        return obj
