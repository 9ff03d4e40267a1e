"""The encoder a saved index carries, so that the index loads anywhere: no cache, no working directory.

``tracer.scorer_base.persist.write_common`` copies the files an embedder runs on (its ``served()``: a
fine-tuned checkpoint, an ONNX graph with its tokenizer, a static table) into the snapshot under
``encoders/<id>/`` and records that folder in meta.json (``embedder.files``); ``Retriever.load`` builds the
embedder from it (:func:`carried_config`). The snapshot's manifest covers these files like every other, and
the folder keeps an artifact manifest of its own (:mod:`tracer.encode.manifest`), so a flipped byte is refused
naming the file. The MiniLM packaged with tracer is not copied: it is installed wherever tracer is.

``<id>`` is the carried folder's manifest digest, which is also the fingerprint of an embedder loaded from it:
an index saved again by the process that loaded it (``tracer update``) finds the folder in the current
snapshot and hard-links its files (snapshots are never modified) rather than copying the encoder on every
update.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from tracer.core.store import CorruptIndex, inside
from tracer.encode.manifest import MANIFEST, ArtifactMismatch, seal, sha256_file, verify

ENCODERS = "encoders"


class Served(NamedTuple):
    """What an embedder runs on: a folder, the files in it that it reads (relative, ``/``-separated) and the
    config values that rebuild it from a copy of them besides ``model=`` (a sentence-transformers embedder's
    ``name``, which would otherwise become the copy's path)."""

    folder: Path
    files: tuple[str, ...]
    config: dict[str, Any]


@runtime_checkable
class Fingerprinted(Protocol):
    """An embedder whose ``fingerprint`` is the content hash of the files it is built from (an artifact's
    manifest digest or a folder's hash, :mod:`tracer.encode.manifest`; "" when it has none): the embedding
    cache keys its vectors by it, so vectors of other weights are never served under the same name. An
    embedder that is not :class:`Fingerprinted` is keyed by its name alone."""

    fingerprint: str


@runtime_checkable
class Carried(Protocol):
    """An embedder whose ``served()`` names the files a saved index carries for it (None: nothing to carry, as
    for the MiniLM packaged with tracer). An embedder that is not :class:`Carried` carries nothing."""

    def served(self) -> Served | None: ...


def every_file(folder: Path) -> tuple[str, ...]:
    """Every file of ``folder`` but its artifact manifest, relative and sorted."""
    return tuple(
        sorted(
            p.relative_to(folder).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and p != folder / MANIFEST
        )
    )


def carry(embedder: object, snap: Path, current: Path | None = None) -> tuple[str, dict[str, Any]] | None:
    """Put the files ``embedder`` runs on into the snapshot being written at ``snap``; returns the folder's
    path relative to ``snap`` and the config overrides that rebuild the embedder from it, or None when it has
    nothing to carry (the packaged MiniLM, an embedder that is not :class:`Carried`). ``current``: the index's
    current snapshot, whose copy of the same encoder (by the embedder's fingerprint, :class:`Fingerprinted`)
    is hard-linked when it has one."""
    spec = embedder.served() if isinstance(embedder, Carried) else None
    if spec is None:
        return None
    fp = embedder.fingerprint if isinstance(embedder, Fingerprinted) else ""
    if current is not None and fp and (old := current / ENCODERS / fp[:16]).is_dir():
        dest = snap / ENCODERS / fp[:16]
        try:
            _link_tree(old, dest)
            verify(dest)  # the links are the published files: check them as a load would
            return f"{ENCODERS}/{fp[:16]}", spec.config
        except (OSError, ArtifactMismatch):  # collected meanwhile, another file system, damaged: copy instead
            shutil.rmtree(dest, ignore_errors=True)
    staging = snap / ENCODERS / f".incoming-{os.getpid()}"
    staging.mkdir(parents=True)
    for name in spec.files:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec.folder / name, staging / name)
    digest = _sealed(staging, spec)
    dest = snap / ENCODERS / digest[:16]
    if dest.exists():  # the same encoder carried twice (both stages of a cascade on one model)
        shutil.rmtree(staging)
    else:
        staging.rename(dest)
    return f"{ENCODERS}/{digest[:16]}", spec.config


def _sealed(staging: Path, spec: Served) -> str:
    """The copy's manifest digest. A copy of a whole artifact keeps its manifest (same digest, same cache
    keys); a part of one (an ONNX export without its other variant's graph) is sealed anew, each copied file
    first checked against the source's manifest so that a damaged source is refused, never sealed as good; a
    folder that is nobody's artifact (a user's own model) is sealed as it is."""
    source = spec.folder / MANIFEST
    if not source.is_file():
        return seal(staging, {"kind": "carried", "source": spec.folder.name})
    doc = json.loads(source.read_text())
    if set(spec.files) == set(every_file(spec.folder)):
        shutil.copyfile(source, staging / MANIFEST)
        return verify(staging)
    for name in spec.files:
        want = doc["files"].get(name, {}).get("sha256")
        if want is not None and sha256_file(staging / name) != want:
            raise ArtifactMismatch(
                spec.folder / name,
                "SHA-256 differs from the manifest (the file was changed or "
                "damaged); build the encoder again before saving",
            )
    return seal(staging, {**doc["inputs"], "served": sorted(spec.files)})


def _link_tree(src: Path, dest: Path) -> None:
    for f in sorted(src.rglob("*")):
        if f.is_file():
            (dest / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            os.link(f, dest / f.relative_to(src))


def carried_config(entry: dict[str, Any], snap: Path) -> dict[str, Any] | None:
    """The config that builds a saved embedder (meta.json's ``embedder`` or ``slow_embedder``), its ``model``
    the folder the snapshot carries when it carries one; a carried folder that is missing or outside the
    snapshot is a :class:`CorruptIndex`."""
    cfg, files = entry.get("config"), entry.get("files")
    if files is None or cfg is None:
        return cfg
    folder = inside(snap, files)
    if not folder.is_dir():
        raise CorruptIndex(folder, "missing: the encoder this index was saved with")
    return {**cfg, "model": str(folder)}
