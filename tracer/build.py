"""Config glue: turn Hydra/OmegaConf (or plain dict) configs into library objects.

Hydra stays at the edges: ``train.py`` and ``evaluate.py`` compose a config and call these
builders; the library itself never imports Hydra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate

from tracer.data import Dataset, load_dataset
from tracer.encode.embedders import CachedEmbedder
from tracer.encode.embedders import build_embedder as _build_embedder


def plain(cfg: Any) -> Any:
    """OmegaConf node -> plain Python containers (no-op for plain data)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(cfg, (DictConfig, ListConfig)):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return cfg


def build_dataset(dataset_cfg: Mapping, registry_cfg: Mapping | None = None, seed: int = 0) -> Dataset:
    """Load a dataset config (``loader`` plus its options) and apply the registry-size preset."""
    cfg = dict(plain(dataset_cfg))
    loader = cfg.pop("loader", cfg.get("name"))
    ds = load_dataset(loader, **cfg)
    preset = (plain(registry_cfg) or {}).get("preset")
    if preset:
        from tracer.data.pool import apply_preset

        ds = apply_preset(loader, ds, preset, seed)
    return ds


def build_embedder(embedder_cfg: Mapping | None) -> CachedEmbedder:
    """An embedder config behind the disk cache: a ``_target_`` class (``configs/embedder/onnx_int8.yaml``)
    or the sentence-transformers default (``model``, ``batch_size``, ``device``)."""
    cfg = dict(plain(embedder_cfg) or {})
    if "_target_" in cfg:
        cache_dir = cfg.pop("cache_dir", ".cache/embeddings")
        return CachedEmbedder(instantiate(cfg), cache_dir)
    return _build_embedder(cfg.get("model"), cfg.get("cache_dir", ".cache/embeddings"), cfg.get("batch_size", 64),
                           cfg.get("device"))


def build_scorer_cfg(scorer_cfg: Mapping):
    from tracer.scorers import build_scorer

    cfg = dict(plain(scorer_cfg))
    return build_scorer(cfg["name"], **cfg)


def build_executor_cfg(executor_cfg: Mapping | None):
    from tracer.executors import build_executor

    cfg = dict(plain(executor_cfg) or {"name": "oracle"})
    return build_executor(cfg.pop("name"), **cfg)
