"""Config glue: every component is a ``_target_`` node in ``tracer/configs/`` built by
``hydra.utils.instantiate``.

Hydra stays at the edges: ``evaluate.py`` and ``train.py`` compose a config and call these helpers;
the layers below never import Hydra. The YAML is the one place for tuned values, so plain-Python
use builds from the same files::

    scorer = build_scorer("tracer_plus", head={"max_epochs": 50})   # tracer/configs/scorer/tracer_plus.yaml

Three steps are ours beyond ``instantiate``: an embedder's ``cache_dir`` is the disk cache it is
wrapped in (not the model's argument), a registry preset is called on the loaded dataset, and a
logger gets the run's directory and name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from tracer.core.loggers import MetricLogger, NullLogger
from tracer.core.types import Registry
from tracer.data import Dataset
from tracer.encode.embedders import CachedEmbedder
from tracer.executors import Executor
from tracer.learn.encoders import EncoderRecipe, FoldEncoders
from tracer.scoring.protocol import Scorer

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
    """``tracer/configs/<group>/<name>.yaml`` without Hydra, ``${paths.*}`` resolved from
    ``paths/default.yaml``, ``overrides`` merged in (nested mappings merge key by key, as
    ``scorer.head.max_epochs=1`` does on the command line; lists are replaced). A ``seed`` override also
    stands at the root, as in Hydra's composed config, so a nested ``${seed}`` (a cascade's ``slow`` recipe)
    resolves to it."""
    root = OmegaConf.create({"paths": OmegaConf.load(CONFIG_DIR / "paths" / "default.yaml"),
                             **({"seed": overrides["seed"]} if "seed" in overrides else {}),
                             group: OmegaConf.merge(_composed(group, name), overrides)})
    return OmegaConf.create(OmegaConf.to_container(root, resolve=True)[group])


def _composed(group: str, name: str) -> DictConfig:
    """A group's YAML with its defaults list applied as Hydra applies it: each named config of the same
    group merged in order, the file's own keys at ``_self_`` (last when not listed); ``embedder/fast.yaml``
    is ``onnx_int8`` this way, ``encoder_training/mnrl_int8.yaml`` is ``mnrl`` plus ``serve_as``; ``name@key``
    puts a config under ``key`` (:func:`_placed`)."""
    path = CONFIG_DIR / group / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown {group} {name!r}; valid names: {', '.join(names(group))}")
    own = OmegaConf.load(path)
    defaults = list(own.pop("defaults", None) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")
    for d in defaults:
        if not isinstance(d, str):
            raise TypeError(f"{path}: defaults: only names of {group} configs (``name`` or ``name@key``) are "
                            f"supported here, got {d!r}")
    return OmegaConf.merge(*(own if d == "_self_" else _placed(group, d) for d in defaults))


def _placed(group: str, entry: str) -> DictConfig:
    """A defaults entry of a group config: ``name`` merged at the top, ``name@key`` under ``key`` (Hydra's
    package override, relative to the including config: ``scorer/cascade.yaml``'s ``tracer_plus@fast``)."""
    name, _, key = entry.partition("@")
    cfg = _composed(group, name)
    return OmegaConf.create({key: cfg}) if key else cfg


# the groups a preset (tracer/configs/experiment/preset/*.yaml) chooses
PRESET_GROUPS = ("scorer", "embedder", "encoder_training")


def load_preset(name: str, /, seed: int = 0) -> dict[str, DictConfig | None]:
    """A preset of ``tracer/configs/experiment/preset/`` without Hydra, as ``train.py experiment=preset/NAME``
    composes it: per group of :data:`PRESET_GROUPS`, the config its ``override /group: NAME`` names with the
    file's own keys for that group merged in (``None`` for ``null``); a recipe gets ``seed``."""
    path = CONFIG_DIR / "experiment" / "preset" / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown preset {name!r}; valid names: {', '.join(names('experiment/preset'))}")
    own = OmegaConf.load(path)
    chosen = {}
    for entry in own.pop("defaults", None) or []:
        ((key, value),) = OmegaConf.to_container(entry).items()
        chosen[key.removeprefix("override").strip().lstrip("/")] = value
    if set(chosen) != set(PRESET_GROUPS) or set(own) - set(PRESET_GROUPS):
        raise ValueError(f"{path}: a preset overrides exactly {', '.join(PRESET_GROUPS)} and sets only their "
                         f"keys, got overrides {sorted(chosen)} and keys {sorted(own)}")
    keys = {group: plain(own.get(group)) or {} for group in PRESET_GROUPS}
    for group in PRESET_GROUPS:
        if chosen[group] is None and keys[group]:
            raise ValueError(f"{path}: {group} is null but the file sets {sorted(keys[group])}")
    return {group: None if chosen[group] is None else
            load_config(group, chosen[group], **keys[group], **({"seed": seed} if group == "encoder_training"
                                                                 else {}))
            for group in PRESET_GROUPS}


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
    return CachedEmbedder(inner, cache_dir, config=getattr(inner, "loads_as", None) or cfg,
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
