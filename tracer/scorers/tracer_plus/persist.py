"""A ``tracer_plus`` index on disk: one snapshot (:func:`tracer.core.store.save_snapshot`: atomic for readers,
verified by a manifest; a directory that is not a tracer index is refused).

Files: ``meta.json`` (format version, class, config, embedder name and dim, feature names, trie sizes, fit
summary), ``tools.json`` (the registry), ``trie_<j>.pt`` (one per key), ``model.pt`` (weights and the
standardisation buffers), ``tools.faiss`` + ``tools_idmap.json`` + ``tool_vectors.npy`` (the vector index and
its id map).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tracer.core.store import Verify, save_snapshot
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.persist import check_trie, load_tensors, open_index, saved_config, write_common
from tracer.scorers.tracer_plus.model import CandidateModel

FORMAT_VERSION = 1
CLASS_PATH = "tracer.scorers.tracer_plus.TracerPlusScorer"


def save_plus(scorer, directory: str | Path) -> Path:
    """Write a fitted scorer's index as a new snapshot of ``directory``."""
    scorer._check_fitted()
    out = Path(directory)
    with save_snapshot(out) as tmp:
        write_common(tmp, {"format_version": FORMAT_VERSION, "class": CLASS_PATH, "scorer": scorer.config(),
                           "features": list(scorer.feature_names),
                           "tries": [{"key": t.key.label, "n_nodes": t.n_nodes, "n_edges": t.n_edges}
                                     for t in scorer.tries],
                           "fit": {k: v for k, v in scorer.history.items() if not isinstance(v, list)}},
                     scorer.res)
        for j, trie in enumerate(scorer.tries):
            torch.save(trie.state_dict(), tmp / f"trie_{j}.pt")
        torch.save(scorer.model.state_dict(), tmp / "model.pt")
    return out


def load_plus(cls, directory: str | Path, embedder, device: str | None = None, verify: Verify = "sha256"):
    """Load a saved index with the checks of :meth:`TracerScorer.load`, and the feature names'."""
    with open_index(directory, embedder, CLASS_PATH, FORMAT_VERSION, device, verify) as (d, meta, res):
        cfg = saved_config(meta["scorer"], "tracer_plus")
        if "zero_shot" not in meta["scorer"]:  # written before the guard: served the model, vector when cold
            cfg["zero_shot"] = {"kind": "vector", "guard": False}
        cfg.setdefault("request", None)  # written before the request evidence: none
        saved_request = meta["scorer"].get("request")
        # written before the semantic evidence, which was then off, whatever the YAML's default is now
        if saved_request is not None:
            cfg["request"] = {**cfg["request"], "semantic": False, "open_slot": False, **saved_request}
        obj = cls(**cfg)
        if list(obj.feature_names) != meta["features"]:
            raise ValueError(f"{d / 'meta.json'}: feature names differ from this version's; "
                             "rebuild the index")
        tries = [check_trie(ExecutionTrie.from_state_dict(load_tensors(d / f"trie_{j}.pt"), res.device),
                            res, d / f"trie_{j}.pt")
                 for j in range(len(obj.keys))]
        obj.attach(tries, res)
        obj.model = CandidateModel.from_state_dict(load_tensors(d / "model.pt"), obj.model_kind,
                                                   int(obj.head_cfg["hidden"]), obj.members)
        obj.history = dict(meta.get("fit") or {})
    return obj
