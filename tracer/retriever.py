"""Tool retrieval from plain Python, no Hydra: build from a dataset, select tools for a live conversation,
save, load.

Example::

    from tracer.retriever import Retriever

    r = Retriever.from_dataset("path/to/native_dataset")   # or "bfcl", or a Dataset
    tools = r.select(messages, k=5)      # OpenAI tool objects to offer the model for its next call
    names = r.rank(messages)             # the whole registry, best first
    r.save("indexes/my_index")           # a new verified snapshot; scorers with can_save (docs/storage.md)
    r = Retriever.load("indexes/my_index")

``messages`` is the conversation so far as OpenAI chat dicts; the model is about to make its next
tool call. The turn-local prefix (calls since the last user message) and the history (all calls)
are read off the messages leniently (:func:`tracer.core.live.read_live`: a live conversation is ranked,
not refused, when it holds a ``developer`` message, calls of tools the index does not know, a tool message
whose call was trimmed or malformed arguments; :meth:`Retriever.read` also reports what it forgave). Any
registered scorer works for selection (the default is ``tracer_plus``); saving needs a scorer whose class
declares ``can_save`` (:func:`saveable_scorers` names them). A live step goes through
the scorer's declared ``select_one`` / ``rank_one`` (:class:`tracer.scorer_base.protocol.Scorer`): the
single-step path for the tracer family, the batched path with a batch of one for the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracer.build import build_embedder, build_fold_encoders, build_scorer, load_preset, names, node
from tracer.core.errors import DataError
from tracer.core.live import LiveStep, read_live
from tracer.core.locate import locate
from tracer.core.steps import step_from_messages
from tracer.core.store import Verify, open_snapshot
from tracer.core.types import Message, Registry, Step, Tool, Trajectory
from tracer.core.validate import InvalidField, check_k
from tracer.data import LOADERS, Dataset, load_dataset, load_native
from tracer.encode.bundle import carried_config
from tracer.encode.embedders import Embedder
from tracer.online.updater import Updater
from tracer.scorer_base.persist import read_meta
from tracer.scorer_base.protocol import Scorer
from tracer.scorer_base.ranking import finalize, present_without, without
from tracer.scorer_base.resources import Resources
from tracer.scorer_base.trial import Trials, on_trial, widened

MINILM = "all-MiniLM-L6-v2"
__all__ = ["Retriever", "saveable_scorers", "step_from_messages"]


def _dataset(data: Dataset | str | Path, options: Mapping[str, Any]) -> Dataset:
    if isinstance(data, Dataset):
        return data
    path = Path(data)
    if path.is_dir():
        return load_native(path, **options)
    if isinstance(data, str) and data in LOADERS:
        return load_dataset(data, **options)
    raise DataError(path, f"neither a dataset directory (tools.json + trajectories.jsonl) nor a loader name "
                          f"({', '.join(sorted(LOADERS))})")


def _saved_embedder(saved: Mapping[str, Any], meta_path: Path, cache_dir: str | Path | None,
                    device: str | None) -> Embedder:
    """The embedder an index was built with: from the config saved with it (its files those the snapshot
    carries,
    :mod:`tracer.encode.bundle`), else the packaged MiniLM. Its contexts (live or logged conversations, each
    new) stay in its bounded memory; only tool texts may go to ``cache_dir``."""
    cfg = carried_config(dict(saved), meta_path.parent)
    if cfg is None:
        if saved["name"] != MINILM:
            raise ValueError(f"{meta_path}: the index was built with embedder {saved['name']!r}; "
                             "pass that embedder to Retriever.load")
        return build_embedder("minilm", cache_dir=cache_dir, device=device, persist_contexts=False)
    return build_embedder(_on_device(cfg, device), cache_dir=cache_dir, persist_contexts=False)


def _embedder(embedder: Embedder | str | Mapping[str, Any] | None, cache_dir: str | Path | None,
              device: str | None) -> Embedder:
    """``from_dataset``'s embedder: as given, or built from a config name or node (none: MiniLM)."""
    if embedder is not None and not isinstance(embedder, (str, Mapping)):
        return embedder
    cfg = node("embedder", "minilm" if embedder is None else embedder)
    return build_embedder(cfg if device is None else _on_device(cfg, device), cache_dir=cache_dir)


def _on_device(cfg: Mapping[str, Any], device: str | None) -> dict[str, Any]:
    """``cfg`` with every ``device`` in it (nested encoder configs included) set to ``device``: where an
    encoder runs is this machine's choice, not the saved one."""
    return {k: _on_device(v, device) if isinstance(v, Mapping) else device if k == "device" else v
            for k, v in cfg.items()}


def saveable_scorers() -> list[str]:
    """The scorer configs (``tracer/configs/scorer/``) whose class declares ``can_save``, sorted: the scorers
    :meth:`Retriever.save` can write. Read off the classes, so the list names what ``can_save`` says."""
    return [name for name in names("scorer") if locate(node("scorer", name)["_target_"]).can_save]


class Retriever:
    """A fitted scorer plus what it needs to answer for a live conversation.

    Args:
        scorer: a fitted scorer (its ``res`` holds the registry, the embedder and the tool index).
        k: default number of tools :meth:`select` presents.
    """

    def __init__(self, scorer: Scorer, k: int = 5):
        if not isinstance(scorer, Scorer):
            raise TypeError(f"{type(scorer).__name__} does not implement tracer.scorer_base.protocol.Scorer")
        if scorer.res is None:
            raise ValueError(f"scorer {scorer.name!r} is not fitted")
        self.scorer = scorer
        self.k = check_k(k)
        self._updater: Updater | None = None

    @property
    def res(self) -> Resources:
        return self.scorer.res

    @property
    def registry(self) -> Registry:
        return self.scorer.res.registry

    # ---- building ------------------------------------------------------------------------------
    @classmethod
    def from_dataset(cls, data: Dataset | str | Path, scorer: str | Scorer | None = None,
                     embedder: Embedder | str | Mapping[str, Any] | None = None, *, k: int = 5,
                     preset: str | None = None, device: str | None = None, factory: str = "auto",
                     cache_dir: str | Path | None = ".cache/embeddings",
                     dataset_options: Mapping[str, Any] | None = None,
                     encoder_training: str | Mapping[str, Any] | None = None, **scorer_cfg: Any) -> Retriever:
        """Fit a scorer on every trajectory of a dataset.

        Args:
            data: a :class:`Dataset`, a native dataset directory, or a loader name (``bfcl``, ...).
            scorer: a scorer name from the registry (default ``tracer_plus``; ``tracer_fixed``, ``vector``,
                ...) or an unfitted scorer object.
            preset: a preset of ``tracer/configs/experiment/preset/`` (``best``, ``cascade``, ``fast``,
                ``fastest``, ``cold_start``, ``zero_shot``): its scorer, embedder and encoder recipe as
                ``train.py experiment=preset/NAME`` builds them (:func:`tracer.build.load_preset`), instead of
                ``scorer``, ``embedder`` and ``encoder_training``; ``scorer_cfg`` still overrides its scorer.
            embedder: an embedder, or a config name (``general``: MiniLM trained for tool retrieval, built
                on first use) or node of ``tracer/configs/embedder/``, cached at ``cache_dir``; else MiniLM.
            device: where tensors live (default CUDA when present).
            factory: FAISS index factory of the tool index (``Flat``: exact; ``auto``: exact up to 2,048
                tools, HNSW above, :mod:`tracer.encode.index`).
            dataset_options: passed to the loader (e.g. ``{"execute": False}`` for BFCL).
            encoder_training: train an encoder on the dataset's trajectories first and serve with it: a
                recipe of ``tracer/configs/encoder_training/`` (``mnrl``: MiniLM fine-tuned, the best
                preset's; ``mnrl_int8``: served in ONNX int8; ``mnrl_l3_cut_int8``: a 3-layer student, the
                fast preset's; ``static_contexts``: a static table, the fastest preset's; ``cascade``: two
                encoders, with ``scorer="cascade"``), or its mapping; ``inner_encoders: true`` in it fits
                tracer_plus's inner folds under encoders that never saw them. The checkpoint is cached by
                content hash, and the saved index rebuilds the encoder on load.
            **scorer_cfg: overrides of the scorer's config (``tracer/configs/scorer/<name>.yaml``).
        """
        if preset is not None:
            if scorer is not None or embedder is not None or encoder_training is not None:
                raise ValueError("from_dataset: preset chooses the scorer, embedder and encoder_training; "
                                 "pass scorer overrides as keywords")
            chosen = load_preset(preset)
            scorer, encoder_training = chosen["scorer"], chosen["encoder_training"]
            embedder = chosen["embedder"] if encoder_training is None else None
        ds = _dataset(data, dict(dataset_options or {}))
        if encoder_training is not None:
            if embedder is not None:
                raise ValueError("from_dataset: pass embedder or encoder_training, not both")
            encoders = build_fold_encoders(ds.registry, encoder_training, cache_dir, device=device)
            res = encoders(ds.trajectories)
        else:
            res = Resources.build(ds.registry, _embedder(embedder, cache_dir, device), factory=factory,
                                  device=device)
        sc = (build_scorer("tracer_plus" if scorer is None else scorer, **scorer_cfg)
              if scorer is None or isinstance(scorer, (str, Mapping)) else scorer)
        sc.fit(ds.trajectories, res)
        return cls(sc, k)

    # ---- selecting -----------------------------------------------------------------------------
    def context_embedding(self, messages: Sequence[Message] | LiveStep) -> np.ndarray:
        """The embedded context of a conversation (or of a step :meth:`read` gave) under the scorer's
        rendering, ``[d]`` float32."""
        if self.scorer.rendering is None:
            raise TypeError(f"scorer {self.scorer.name!r} has no context rendering")
        step = messages.step if isinstance(messages, LiveStep) else self.read(messages).step
        return self.res.embedder.encode([self.scorer.rendering.render(step.context)])[0].numpy()

    def read(self, messages: Sequence[Message], name: str = "messages") -> LiveStep:
        """The decision step at the end of a live conversation, read leniently (:mod:`tracer.core.live`), with
        the count of each leniency applied. Only what cannot be read at all raises a ``ValueError`` naming the
        field (``messages[1]: must be a dict, got str``)."""
        try:
            return read_live(messages, self.registry.positions)
        except InvalidField as e:
            raise ValueError(f"{name}{e.field.removeprefix('messages')}: {e.problem}") from None

    def _step(self, messages: Sequence[Message], name: str = "messages") -> Step:
        return self.read(messages, name).step

    def select_ids(self, messages: Sequence[Message], k: int | None = None,
                   conversation: str | None = None) -> tuple[int, ...]:
        """Registry ids of the tools to present for the next call (k, plus Tracer+G's global set); a k
        larger than the registry presents the registry.

        ``conversation``: the conversation's id, for a scorer that runs trials
        (:mod:`tracer.scorer_base.trial`): on a trial conversation the other ranking's top k follow the k (up
        to 2k tools). Log such a conversation with ``metadata={"explored": True}`` for :meth:`update`
        (:func:`is_trial` says which)."""
        k = self.k if k is None else check_k(k)
        step = self._step(messages)
        scorer = self.scorer  # read once: an encoder refit may swap it meanwhile (Updater.on_swap)
        if scorer.res.removed:  # drift: the top k of the ranking without the removed tools
            gone = scorer.res.removed_ids
            return present_without(self._ranking(step, k + len(gone), scorer), gone, k, scorer.global_set)
        shown = scorer.select_one(step, scorer.embed([step]), k)
        if conversation is not None and self.is_trial(conversation):
            return tuple(widened(shown, scorer.trial_rankings([step], k)[0], k))
        return shown

    def is_trial(self, conversation: str) -> bool:
        """Whether the conversation with this id is a trial of the serving scorer now (False for a scorer
        that runs none, or before it has two rankings to try)."""
        scorer = self.scorer
        return (isinstance(scorer, Trials) and scorer.trial_ready
                and on_trial(conversation, scorer.trial_rate, scorer.res.seed))

    def select(self, messages: Sequence[Message], k: int | None = None,
               conversation: str | None = None) -> list[dict[str, Any]]:
        """OpenAI tool objects (``{"type": "function", "function": {...}}``) for the next call
        (``conversation``: :meth:`select_ids`)."""
        return [self.registry[i].to_openai() for i in self.select_ids(messages, k, conversation)]

    def select_batch(self, conversations: Sequence[Sequence[Message]], k: int | None = None
                     ) -> list[list[dict[str, Any]]]:
        """:meth:`select` for many conversations at once (one batched scoring call)."""
        k = self.k if k is None else check_k(k)
        if isinstance(conversations, (str, bytes)) or not isinstance(conversations, Sequence):
            raise TypeError(f"conversations must be a list of message lists, "
                            f"got {type(conversations).__name__}")
        steps = [self._step(m, f"conversations[{i}]") for i, m in enumerate(conversations)]
        scorer = self.scorer
        sel = finalize(scorer.score(steps), k, scorer.pad)
        presented = sel.presented
        if scorer.res.removed:  # drift
            gone = scorer.res.removed_ids
            presented = [present_without(r.tolist(), gone, k, scorer.global_set) for r in sel.ranking]
        return [[scorer.res.registry[i].to_openai() for i in ids] for ids in presented]

    def rank(self, messages: Sequence[Message] | LiveStep) -> list[str]:
        """Every tool name, best first (removed tools left out), for a conversation or a step :meth:`read`
        gave."""
        names = self.registry.names
        step = messages.step if isinstance(messages, LiveStep) else self._step(messages)
        scorer = self.scorer
        return [names[i] for i in without(self._ranking(step, scorer=scorer), scorer.res.removed_ids)]

    def _ranking(self, step: Step, top: int | None = None, scorer: Scorer | None = None) -> np.ndarray:
        """Registry ids best first: the whole ranking, or its first ``top``."""
        scorer = self.scorer if scorer is None else scorer
        return scorer.rank_one(step, scorer.embed([step]), top)

    # ---- learning while serving (tracer.online.updater) ----------------------------------------------------
    @property
    def updater(self) -> Updater:
        """The :class:`tracer.online.updater.Updater` of this retriever (made on first use; no refit
        schedule)."""
        if self._updater is None:
            self._updater = Updater(self.scorer, on_swap=self._swap)
        return self._updater

    def _swap(self, scorer: Scorer) -> None:
        self.scorer = scorer  # an encoder refit's new scorer (Updater(encoder=...)): one assignment

    def update(self, trajectories: Sequence[Trajectory], tools: Sequence[Tool] = ()) -> dict:
        """Add logged trajectories (successful ones count) and new tool definitions to the fitted index:
        every trie's counts, priors and edge memories now, as a rebuild on the union would give them;
        the learned weights on :attr:`updater`'s schedule (``retriever.updater.refit_every = N``,
        or ``retriever.updater.refit()``). :meth:`save` writes the updated index.

        Each trajectory is learned once: one applied before with the same id and content (this index's
        ledger, saved with it: :mod:`tracer.core.applied`) or repeated in the call is left out and counted in
        the returned ``already_applied``, so applying a growing log again adds only its new trajectories; one
        whose id was applied with other content is learned and counted in ``id_reused``."""
        return self.updater.update(trajectories, tools)

    # ---- persistence ---------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write the fitted index to ``directory`` atomically (a scorer whose class declares ``can_save``:
        :func:`saveable_scorers`)."""
        if not self.scorer.can_save:
            raise TypeError(f"scorer {self.scorer.name!r} ({type(self.scorer).__name__}) cannot be saved: "
                            f"only scorers with can_save can ({', '.join(saveable_scorers())}); rebuild this "
                            "one with Retriever.from_dataset")
        return self.scorer.save(directory)

    @classmethod
    def load(cls, directory: str | Path, embedder: Embedder | None = None, *, k: int = 5,
             device: str | None = None, cache_dir: str | Path | None = None,
             verify: Verify = "sha256") -> Retriever:
        """Load the current snapshot of a saved index (resolved once; see docs/storage.md), every file
        checked against the manifest's SHA-256 (``verify="size"`` checks sizes only, ``"none"`` nothing).
        ``embedder`` defaults to the one the index was built with, rebuilt from the config saved with it (an
        index whose embedder was built from a config: ``build_embedder``, ``encoder_training``), else the
        bundled MiniLM; an index built with another embedder needs it passed in (another model or dimension is
        refused). That embedder keeps its vectors in a bounded memory (``CachedEmbedder.max_entries``) and
        writes none to disk: the index's tool vectors are in the snapshot and a live context is new each time.
        ``cache_dir``: a disk cache for the tool texts it embeds later (``update``), never for contexts."""
        k = check_k(k)
        with open_snapshot(directory, verify) as snap:
            meta_path = snap / "meta.json"
            if not meta_path.exists():
                raise FileNotFoundError(f"{directory}: no saved index here (meta.json missing)")
            meta = read_meta(meta_path)
            if embedder is None:
                embedder = _saved_embedder(meta["embedder"], meta_path, cache_dir, device)
            try:  # a saved file names a class; only one inside tracer is ever imported
                scorer_cls = locate(meta.get("class", "tracer.scorers.tracer.TracerScorer"))
            except ValueError as e:
                raise ValueError(f"{meta_path}: scorer class {e}") from None
            # a cascade's second encoder, from the config saved with it
            slow = ({"slow_embedder": _saved_embedder(meta["slow_embedder"], meta_path, cache_dir, device)}
                    if "slow_embedder" in meta else {})
            return cls(scorer_cls.load(snap, embedder, device=device, verify="none", **slow), k)
