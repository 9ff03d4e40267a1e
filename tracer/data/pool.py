"""Larger registries: a dataset's own tools plus seeded distractors from other datasets.

:func:`pool_registry` appends tools drawn from other datasets' registries until the registry has
``size`` tools. The original tools come first, in their order, then the distractors in a seeded
order. A candidate whose name is already taken (by the dataset's own tools or by an earlier
candidate) is never added, and ``Tool.source`` stays the dataset it came from. With one seed, a
smaller size gives a prefix of a larger one, so the presets are nested.

:data:`REGISTRY_PRESETS` names three sizes per dataset; :func:`apply_preset` loads the distractor
sources on first use. Sizes are absolute and chosen to be reachable from the sources available here
(counts with the default loaders, after names that collide are dropped):

=========  ============  ============================  ====  ==================
dataset    native tools  distractor sources            pool  small/medium/large
=========  ============  ============================  ====  ==================
bfcl       128           tau2 (43) + apibank (75)      116   native/192/240
tau2       43 (all)      bfcl (128) + apibank (75)     201   native/128/192
apibank    75 (all)      bfcl (128) + tau2 (43)        169   native/128/184
=========  ============  ============================  ====  ==================

BFCL's multi-turn tools share two names with tau2: ``get_order_details`` (retail) and
``list_all_airports`` (airline). No other names are shared. So BFCL's pool drops tau2's two, tau2's
pool drops BFCL's two, and API-Bank's pool (BFCL first) drops tau2's two. Every preset also fits a
single tau2 domain (retail 16 + 202, airline 14 + 202, telecom 13 + 203 available) or a single
API-Bank level; level 3 alone (22 + 169 = 191 at most) is why API-Bank's large is 184, not 192.
Without the BFCL loader only the tau2 and API-Bank pools exist, and a preset that then cannot be
reached raises an error that names the missing source.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from functools import cache

from tracer.core.types import Registry, Tool
from tracer.data.base import Dataset, load_dataset

REGISTRY_PRESETS: dict[str, dict[str, int | None]] = {
    "bfcl": {"small": None, "medium": 192, "large": 240},
    "tau2": {"small": None, "medium": 128, "large": 192},
    "apibank": {"small": None, "medium": 128, "large": 184},
}

# Where each dataset's distractors come from, loaded with the loaders' defaults.
DISTRACTOR_SOURCES: dict[str, tuple[str, ...]] = {
    "bfcl": ("tau2", "apibank"),
    "tau2": ("bfcl", "apibank"),
    "apibank": ("bfcl", "tau2"),
}


def distractor_pool(registry: Registry, distractors_from: Sequence[Dataset]) -> list[Tool]:
    """Candidate distractors in source order: every tool whose name is not yet taken."""
    taken = set(registry.names)
    pool = []
    for ds in distractors_from:
        for tool in ds.registry:
            if tool.name not in taken:
                taken.add(tool.name)
                pool.append(tool)
    return pool


def pool_registry(dataset: Dataset, size: int | None, distractors_from: Sequence[Dataset],
                  seed: int = 0) -> Dataset:
    """The dataset with its registry grown to ``size`` tools by seeded distractors.

    Args:
        dataset: the dataset whose trajectories and own tools are kept as they are.
        size: the registry size wanted; None keeps the native registry.
        distractors_from: datasets whose registries supply the distractors.
        seed: seeds the draw order of the distractors.

    Raises:
        ValueError: ``size`` is below the native registry size or above what the sources can supply.
    """
    if size is None or size == len(dataset.registry):
        return dataset
    native = len(dataset.registry)
    if size < native:
        raise ValueError(f"{dataset.name}: registry size {size} is below its {native} native tools")
    pool = distractor_pool(dataset.registry, distractors_from)
    need = size - native
    if need > len(pool):
        sources = ", ".join(ds.name for ds in distractors_from) or "none"
        raise ValueError(f"{dataset.name}: registry size {size} needs {need} distractors, but the sources "
                         f"({sources}) offer {len(pool)} tools with new names (at most {native + len(pool)})")
    random.Random(seed).shuffle(pool)
    return replace(dataset, registry=dataset.registry.extend(pool[:need]))


@cache
def _load_source(name: str) -> Dataset | None:
    """A distractor source with its loader's defaults, or None when its loader is not registered."""
    try:
        return load_dataset(name, execute=False) if name == "bfcl" else load_dataset(name)
    except KeyError as e:
        if "unknown dataset" in str(e):
            return None
        raise


def apply_preset(dataset_name: str, dataset: Dataset, preset: str | None, seed: int = 0,
                 sources: Sequence[Dataset] | None = None) -> Dataset:
    """The dataset with the registry of preset ``small``/``medium``/``large`` (see :data:`REGISTRY_PRESETS`).

    Args:
        dataset_name: ``bfcl``, ``tau2`` or ``apibank``: picks the sizes and the distractor sources.
        dataset: the loaded dataset (any domains or levels of it).
        preset: a key of ``REGISTRY_PRESETS[dataset_name]``; ``None``: the dataset unchanged.
        seed: seeds the distractor draw.
        sources: distractor datasets to use instead of loading :data:`DISTRACTOR_SOURCES` (loaded
            once per process, on first use; a source whose loader is missing, BFCL until its
            module exists, is left out).
    """
    if preset is None:  # registry=native
        return dataset
    if dataset_name not in REGISTRY_PRESETS:
        raise KeyError(f"no registry presets for {dataset_name!r}; valid: {', '.join(REGISTRY_PRESETS)}")
    presets = REGISTRY_PRESETS[dataset_name]
    if preset not in presets:
        raise KeyError(f"unknown registry preset {preset!r} for {dataset_name}; valid: {', '.join(presets)}")
    size = presets[preset]
    if size is None:
        return dataset
    missing: list[str] = []
    if sources is None:
        loaded = {name: _load_source(name) for name in DISTRACTOR_SOURCES[dataset_name]}
        missing = [name for name, ds in loaded.items() if ds is None]
        sources = [ds for ds in loaded.values() if ds is not None]
    try:
        return pool_registry(dataset, size, sources, seed)
    except ValueError as e:
        if missing:
            raise ValueError(
                f"{e}; distractor source(s) without a registered loader: {', '.join(missing)}"
            ) from None
        raise
