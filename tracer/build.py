"""Config glue: every component is a ``_target_`` node in ``tracer/configs/`` built by
``hydra.utils.instantiate``.

Hydra stays at the edges: ``evaluate.py`` and ``train.py`` compose a config and call these helpers;
the layers below never import Hydra. The YAML is the one place for tuned values, so plain-Python
use builds from the same files, composed by Hydra's compose API (:func:`load_config`, :func:`load_preset`)::

    scorer = build_scorer("tracer_plus", head={"max_epochs": 50})   # tracer/configs/scorer/tracer_plus.yaml

Three steps are ours beyond ``instantiate``: an embedder's ``cache_dir`` is the disk cache it is
wrapped in (not the model's argument), a registry preset is called on the loaded dataset, and a
logger gets the run's directory and name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache, partial
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobRuntime
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from tracer.core.loggers import MetricLogger, NullLogger
from tracer.core.types import Registry
from tracer.data import Dataset
from tracer.encode.embedders import BuiltEmbedder, CachedEmbedder
from tracer.executors import Executor
from tracer.learn.encoders import EncoderRecipe, FoldEncoders
from tracer.scorer_base.protocol import Scorer

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def plain(cfg: Any) -> Any:
    """OmegaConf node -> plain Python containers, interpolations resolved (no-op for plain data)."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def build(cfg: Mapping, /, **kwargs: Any) -> Any:
    """``instantiate`` with nested mappings and lists passed as plain ``dict``/``list`` (what constructors
    validate and what a saved index's ``meta.json`` holds). A constructor's own error (``ValueError`` naming
    the argument, ``ImportError`` with the install hint) is raised as itself, Hydra's wrapping kept as a
    note."""
    try:
        return instantiate(plain(cfg), _convert_="all", **kwargs)
    except InstantiationException as e:
        if e.__cause__ is None:
            raise
        e.__cause__.add_note(str(e).splitlines()[0])  # "Error in call to target '...'"
        raise e.__cause__ from None


def names(group: str) -> list[str]:
    """The configs of a group that stand alone (``tracer/configs/<group>/*.yaml``)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def load_config(group: str, name: str, /, **overrides: Any) -> DictConfig:
    """``tracer/configs/<group>/<name>.yaml`` as Hydra composes it (its defaults list applied:
    ``embedder/fast.yaml`` is ``onnx_int8``, ``scorer/cascade.yaml`` puts ``tracer_plus`` under ``fast`` and
    ``slow``), ``${paths.*}`` resolved from ``paths/default.yaml``, ``overrides`` merged in (nested mappings
    merge key by key, as ``scorer.head.max_epochs=1`` does on the command line; lists are replaced). A
    ``seed`` override also stands at the root, as in Hydra's composed config, so a nested ``${seed}`` (a
    cascade's ``slow`` recipe) resolves to it. No dataset is under test: ``embedder/general.yaml``'s
    ``exclude`` is null."""
    if name not in names(group):
        raise KeyError(f"unknown {group} {name!r}; valid names: {', '.join(names(group))}")
    # each group once: the paths every config resolves against, and the config asked for
    chosen = {"paths": "default", group: name}
    root = OmegaConf.create(_composed(str(CONFIG_DIR), None, tuple(f"+{g}={n}" for g, n in chosen.items())))
    if "seed" in overrides:
        root.seed = overrides["seed"]
    root[group] = OmegaConf.merge(root[group], overrides)
    return OmegaConf.create(plain(root)[group])


# the groups a preset (tracer/configs/experiment/preset/*.yaml) chooses
PRESET_GROUPS = ("scorer", "embedder", "encoder_training")


def load_preset(name: str, /, seed: int = 0) -> dict[str, DictConfig | None]:
    """A preset of ``tracer/configs/experiment/preset/`` as ``train.py experiment=preset/NAME seed=SEED``
    composes it (a machine-local ``local/default.yaml`` included, as there), with no dataset under test
    (``embedder/general.yaml``'s ``exclude`` is null: every source trains it): per group of
    :data:`PRESET_GROUPS` its node, interpolations resolved; ``None`` where the preset chooses ``null``."""
    if name not in names("experiment/preset"):
        raise KeyError(f"unknown preset {name!r}; valid names: {', '.join(names('experiment/preset'))}")
    overrides = (f"experiment=preset/{name}", f"seed={seed}", "~dataset")
    cfg = plain(OmegaConf.create(_composed(str(CONFIG_DIR), "train", overrides)))
    return {group: None if cfg.get(group) is None else OmegaConf.create(cfg[group])
            for group in PRESET_GROUPS}


@cache
def _composed(config_dir: str, config_name: str | None, overrides: tuple[str, ...]) -> dict:
    """Hydra's composition of ``config_dir``'s ``config_name`` (``None``: an empty primary config, the groups
    chosen by ``+group=name`` overrides) as a plain container, interpolations kept unresolved (each caller
    builds its own node from it). Composed once per process: a config file edited meanwhile is read by the
    next process."""
    with _hydra_at(config_dir):
        return OmegaConf.to_container(compose(config_name, overrides=list(overrides)))


@contextmanager
def _hydra_at(config_dir: str) -> Iterator[None]:
    """Hydra initialised at ``config_dir`` for the ``compose`` calls inside. Hydra holds one initialisation
    per process: the one already there (train.py's or evaluate.py's app, a test's ``initialize_config_dir``)
    is set aside and put back after, and the job keeps its name (a sweep names each job's log by it)."""
    outer = GlobalHydra.instance().hydra
    job_name = JobRuntime.instance().get("name")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir, job_name=job_name, version_base="1.3"):
            yield
    finally:
        GlobalHydra.instance().hydra = outer


def node(group: str, cfg: str | Mapping, /, **overrides: Any) -> DictConfig:
    """A config node: ``tracer/configs/<group>/<cfg>.yaml`` when ``cfg`` is a name, else ``cfg`` (a composed
    node), with ``overrides`` merged in."""
    if isinstance(cfg, str):
        return load_config(group, cfg, **overrides)
    return OmegaConf.merge(plain(cfg), overrides)


def build_scorer(scorer: str | Mapping, /, **overrides: Any) -> Scorer:
    """A scorer by name (``build_scorer("tracer_fixed", tau=0.3)``) or from a composed ``scorer`` node."""
    return build(node("scorer", scorer, **overrides))


def build_insight_memory(**overrides: Any) -> Any:
    """The Insight memory of ``tracer/configs/scorer/insight.yaml``'s ``memory:`` node (what ``evaluate.py
    insight=true`` adds to any scorer), ``overrides`` merged in
    (``build_insight_memory(summarizer="offline")``)."""
    return build(load_config("scorer", "insight", memory=overrides)["memory"])


def build_dataset(dataset: str | Mapping, registry: str | Mapping | None = None, seed: int = 0) -> Dataset:
    """The dataset of a ``dataset`` node (or of ``tracer/configs/dataset/<name>.yaml``), with the
    registry-size preset of a ``registry`` node (or name) applied: a partial of
    :func:`tracer.data.pool.apply_preset` called with the dataset's name; ``None``: the dataset's own
    registry."""
    dataset_cfg = plain(node("dataset", dataset))
    ds = build(dataset_cfg)
    if registry is None:
        return ds
    return build(node("registry", registry))(dataset_cfg["name"], ds, seed=seed)


def build_embedder(embedder: str | Mapping = "minilm", /, *, persist_contexts: bool = True,
                   **overrides: Any) -> CachedEmbedder:
    """The embedder of an ``embedder`` node (or name) behind the content-addressed disk cache at its
    ``cache_dir`` (``persist_contexts=False``: only tool texts go to disk, :class:`CachedEmbedder`). An
    embedder made by a builder (the general encoder, trained on first use) names in ``loads_as`` the plain
    embedder config that loads what was built: that one is kept, so a saved index never rebuilds it."""
    cfg = dict(plain(node("embedder", embedder, **overrides)))
    cache_dir = cfg.pop("cache_dir")
    inner = build(cfg)
    loads_as = inner.loads_as if isinstance(inner, BuiltEmbedder) else None
    return CachedEmbedder(inner, cache_dir, config=loads_as or cfg,
                          persist_contexts=persist_contexts)


def build_fold_encoders(registry: Registry, recipe: str | Mapping, /,
                        cache_dir: str | Path | None = ".cache/embeddings", *, device: str | None = None,
                        seed: int = 0, executor: Any = None,
                        log: Callable[[dict], None] | None = None) -> FoldEncoders:
    """Per-fold encoders for a recipe of ``tracer/configs/encoder_training/`` (a name, loaded with the run's
    ``seed``, or a composed node), typed and checked by :meth:`EncoderRecipe.from_config`; each fold's
    checkpoint is served by an embedder behind the embedding cache at ``cache_dir``."""
    cfg = plain(node("encoder_training", recipe, **({} if isinstance(recipe, Mapping) else {"seed": seed})))
    serve = partial(build_embedder, cache_dir=cache_dir)
    return FoldEncoders(registry, EncoderRecipe.from_config(cfg), serve, device=device, seed=seed,
                        executor=executor, log=log)


def build_executor(executor: str | Mapping = "oracle", /, **overrides: Any) -> Executor:
    """An executor by name (``build_executor("openai", model=...)``) or from a composed ``executor`` node."""
    return build(node("executor", executor, **overrides))


def build_logger(logger_cfg: Mapping | None, run_dir: str | Path = ".",
                 run_name: str | None = None) -> MetricLogger:
    """``None`` (``logger=null``) gives a no-op logger; a ``logger`` node is built with the run's directory
    and name."""
    if not logger_cfg:
        return NullLogger()
    return build(logger_cfg, dir=str(run_dir), name=run_name)
