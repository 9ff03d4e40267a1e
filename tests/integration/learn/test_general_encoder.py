"""The general encoder (tracer/learn/encoders/general.py): which sources train it without the dataset under
test, the pairs it trains on, and the embedder a config builds, cached and carried by a saved index. Real
MiniLM (one layer kept, a few pairs: seconds), real BFCL data, a real git clone of Seal-Tools' layout."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from builders import ROOT, SEAL_TOOLS_FILES, git_repo

from tracer.build import build_embedder, load_config
from tracer.core.context import ContextRendering
from tracer.core.errors import DataError
from tracer.core.tool_text import tool_text
from tracer.data.base import load_dataset
from tracer.data.corpora import CORPORA, bfcl_single, seal_tools
from tracer.encode.embedders import SentenceTransformerEmbedder, minilm_path, tool_rows, tool_style
from tracer.learn.encoders.general import (
    DATASETS,
    DEFAULT_CORPORA,
    RENDERING,
    SOURCES,
    TOOL_TEXT,
    general_pairs,
    sources_without,
    steps,
)
from tracer.retriever import Retriever

EXAMPLE = ROOT / "data" / "example"
# tau2, API-Bank, APIBench and SGD left out: BFCL (both families) and the Seal-Tools clone remain
LEFT_OUT = ("tau2", "apibank", "apibench", "sgd")
TINY = {"batch_size": 4, "lr": 1e-4, "warmup": 0.0, "epochs": 1, "max_seq_length": 32, "seed": 0,
        "layers": [5]}


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirrors")
    git_repo(root / "fairyshine+Seal-Tools", SEAL_TOOLS_FILES)
    return root


def test_a_dataset_under_test_takes_its_whole_family_out():
    assert sources_without("bfcl") == ("seal_tools", "apibench", "sgd", "tau2", "apibank")
    assert sources_without(["tau2"]) == ("bfcl_single", "seal_tools", "apibench", "sgd", "bfcl", "apibank")
    assert sources_without(()) == (*DEFAULT_CORPORA, *DATASETS)
    # a user's own dataset is no source: nothing of it to leave out
    assert sources_without(["my_agent_logs"]) == (*DEFAULT_CORPORA, *DATASETS)
    with pytest.raises(ValueError, match=r"exclude must name datasets or sources, got \[3\]"):
        sources_without(["tau2", 3])


def test_the_corpora_read_are_chosen_in_order_and_an_unknown_one_is_refused():
    # every readable corpus is a source; the default reads four (NESTFUL and ToolLinkOS measured level)
    assert SOURCES == (*CORPORA, *DATASETS) and set(DEFAULT_CORPORA) < set(CORPORA)
    assert sources_without("bfcl", ["toollinkos", "bfcl_single", "nestful"]) == (
        "toollinkos", "nestful", "tau2", "apibank")
    with pytest.raises(ValueError, match=r"corpora must name one or more of .*toollinkos.*\['toolbench'\]"):
        sources_without("bfcl", ["toolbench"])
    with pytest.raises(ValueError, match=r"corpora must name one or more of .*got \[\]"):
        sources_without("bfcl", [])


def test_every_missing_clone_is_named_with_its_command_before_any_source_is_read(tmp_path, monkeypatch):
    from tracer.learn.encoders import general

    def no_work(*args):
        raise AssertionError("a source was read before the clones were checked")

    monkeypatch.setattr(general, "source_pairs", no_work)
    git_repo(tmp_path / "fairyshine+Seal-Tools", SEAL_TOOLS_FILES)  # present: not named
    with pytest.raises(DataError, match=(
            r"no clone of ShishirPatil/gorilla, IBM/NESTFUL \(point paths.mirrors or TRACER_MIRRORS at them, "
            rf"or run: git clone https://github.com/ShishirPatil/gorilla {tmp_path}/ShishirPatil\+gorilla; "
            rf"git clone https://github.com/IBM/NESTFUL {tmp_path}/IBM\+NESTFUL\)")):
        general_pairs("tau2", tmp_path, ROOT / "../shared/datasets",
                      corpora=["seal_tools", "apibench", "nestful"])


def test_the_mirrors_folder_comes_from_tracer_mirrors_outside_a_run(monkeypatch):
    monkeypatch.delenv("TRACER_MIRRORS", raising=False)
    assert load_config("embedder", "general").mirrors == "data/mirrors"
    monkeypatch.setenv("TRACER_MIRRORS", "/srv/corpora")
    assert load_config("embedder", "general").mirrors == "/srv/corpora"


def test_pairs_come_only_from_the_sources_left_rendered_as_each_step(mirrors):
    pairs, counts = general_pairs(LEFT_OUT, mirrors, ROOT / "../shared/datasets", per_source=50, seed=0)
    assert counts == {"bfcl_single": 50, "seal_tools": 3, "bfcl": 50}  # seal: dev-0's one tool, dev-1's two
    assert len(pairs) == 103
    assert {t.split(":")[0] for t in pairs.trajectory_ids[:53]} == {"bfcl_single", "seal_tools"}
    assert all(t.startswith("multi_turn_") for t in pairs.trajectory_ids[53:])  # BFCL multi-turn trajectories
    rendering = ContextRendering.from_config(RENDERING)
    by_query: dict[str, set[str]] = {}  # a question asked twice may offer its tool with other words
    for e in bfcl_single():
        for context, tool in steps(e):
            by_query.setdefault(rendering.render(context), set()).add(tool_text(tool, TOOL_TEXT))
    for anchor, positive, tid in zip(pairs.anchors, pairs.positives, pairs.trajectory_ids):
        if tid.startswith("bfcl_single:"):
            assert anchor.startswith("user: ")
            assert positive in by_query[anchor]
    seal = [(a, p) for a, p, t in zip(pairs.anchors, pairs.positives, pairs.trajectory_ids)
            if t.startswith("seal_tools:")]
    # tools read with their parameters (whitespace folded), as the embedder will read them when serving; a
    # request's second call after the first, as a logged trajectory's second step renders
    assert TOOL_TEXT == "parameters"
    water = "getWaterQuality: Get the water quality of a lake | lake: Name of the lake"
    customs = "getCustomsInfo: Customs information of a shipment"
    assert seal == [("user: Tell me the water quality of the lake.", water),
                    ("user: Customs of QKE and the lake's water", customs),
                    ("user: Customs of QKE and the lake's water\nassistant: call getCustomsInfo", water)]
    bfcl = load_dataset("bfcl", execute=False)
    logged = [p for p, t in zip(pairs.positives, pairs.trajectory_ids) if t.startswith("multi_turn_")]
    assert set(logged) <= {tool_text(t, TOOL_TEXT) for t in bfcl.registry} and " | " in logged[0]
    again, _ = general_pairs(LEFT_OUT, mirrors, ROOT / "../shared/datasets", per_source=50, seed=0)
    other, _ = general_pairs(LEFT_OUT, mirrors, ROOT / "../shared/datasets", per_source=50, seed=1)
    assert again == pairs and other.anchors != pairs.anchors  # a seeded sample


def test_the_embedder_is_built_once_cached_and_carried_by_a_saved_index(mirrors, tmp_path):
    enc = tmp_path / "enc"
    cfg = {"_target_": "tracer.learn.encoders.general.embedder", "exclude": [*DATASETS, "apibench", "sgd"],
           "mirrors": str(mirrors), "datasets": str(ROOT / "../shared/datasets"), "per_source": 12,
           "train": TINY, "encoder_dir": str(enc), "device": "cpu", "cache_dir": None}
    first = build_embedder(cfg)
    assert first.name == "general-without-apibank+apibench+bfcl+sgd+tau2"
    (folder,) = enc.iterdir()
    assert first.inner.path == folder
    stamp = (folder / "train_info.json").stat().st_mtime_ns
    again = build_embedder(cfg)  # found by content hash, not trained again
    assert again.inner.path == folder and (folder / "train_info.json").stat().st_mtime_ns == stamp
    assert again.fingerprint == first.fingerprint

    r = Retriever.from_dataset(EXAMPLE, scorer="tracer_fixed", embedder=first, device="cpu")
    r.save(tmp_path / "index")
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    expected = (r.rank(msgs), r.context_embedding(msgs).tolist())
    # from_dataset builds it from its config as well, finding the same checkpoint
    by_config = Retriever.from_dataset(EXAMPLE, scorer="tracer_fixed", embedder=cfg, device="cpu")
    assert by_config.res.embedder.inner.path == folder and by_config.res.embedder.name == first.name
    assert (by_config.rank(msgs), by_config.context_embedding(msgs).tolist()) == expected
    assert (folder / "train_info.json").stat().st_mtime_ns == stamp
    shutil.rmtree(enc)
    shutil.rmtree(mirrors / "fairyshine+Seal-Tools" / ".git")  # nothing left to build from
    copy = shutil.copytree(tmp_path / "index", tmp_path / "copy")
    loaded = Retriever.load(copy, device="cpu")
    assert loaded.res.embedder.name == first.name
    assert (loaded.rank(msgs), loaded.context_embedding(msgs).tolist()) == expected


@pytest.mark.slow  # trains an encoder, exports it and MiniLM to ONNX: make test-all
def test_the_checkpoint_records_how_it_reads_tools_for_every_loader_and_its_onnx_export(tmp_path):
    pytest.importorskip("onnxruntime")
    from tracer.encode.onnx import OnnxEmbedder

    mirrors = tmp_path / "mirrors"  # its own clone: the test above takes the shared one's history away
    git_repo(mirrors / "fairyshine+Seal-Tools", SEAL_TOOLS_FILES)
    enc = tmp_path / "enc"
    cfg = {"_target_": "tracer.learn.encoders.general.embedder", "exclude": [*DATASETS, "apibench", "sgd"],
           "mirrors": str(mirrors), "datasets": str(ROOT / "../shared/datasets"), "per_source": 12,
           "train": TINY, "encoder_dir": str(enc), "device": "cpu", "cache_dir": None}
    folder = build_embedder(cfg).inner.path
    assert json.loads((folder / "train_info.json").read_text())["tool_text"] == TOOL_TEXT == "parameters"
    # embedder=finetuned embedder.model=<folder>: no tool_text given, the checkpoint's own
    finetuned = build_embedder({"_target_": "tracer.encode.embedders.SentenceTransformerEmbedder",
                                "model": str(folder), "device": "cpu", "cache_dir": None})
    assert finetuned.tool_text == "parameters" and tool_style(finetuned) == "parameters"
    assert SentenceTransformerEmbedder(str(folder), device="cpu", tool_text="name_description").tool_text \
        == "name_description"  # an explicit setting wins
    onnx = OnnxEmbedder(str(folder), variant="fp32", encoder_dir=tmp_path / "onnx")
    assert onnx.tool_text == "parameters"
    again = OnnxEmbedder(str(onnx.dir), variant="fp32")  # the export as a saved index carries it
    assert again.tool_text == "parameters" and again.name == onnx.name
    plain = OnnxEmbedder(str(minilm_path()), variant="fp32", encoder_dir=tmp_path / "onnx")
    assert plain.tool_text == "name_description" and plain.dir != onnx.dir
    assert "tool_text" not in json.loads((plain.dir / "source.json").read_text())  # MiniLM's export as before
    tool = next(iter(seal_tools(mirrors))).golds[0]
    want = finetuned.encode([tool_text(tool, "parameters")])  # [1, d]
    assert torch.allclose(tool_rows(onnx, [tool]), want, atol=1e-4)
