"""A served index writes no embedding cache: ``tracer serve`` (its own build of the gateway) answers many
distinct conversations, each offering a tool the index does not know, and leaves its working directory and the
index as they were, its memory of vectors at its bound (issue 32, defect 6: a 2 KB shard per conversation,
never evicted)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import openai
from builders import TINY_TOOLS
from gateway_harness import serving
from stub_openai_server import StubOpenAIServer

from tracer.cli import serve

TOOLS = [t.to_openai() for t in TINY_TOOLS]


def _files(root):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_served_index_persists_no_vector_and_its_memory_stays_at_its_bound(saved_index, tmp_path,
                                                                           monkeypatch):
    index = Path(shutil.copytree(saved_index, tmp_path / "index"))
    work = tmp_path / "work"
    work.mkdir()
    # where the cache once landed: the working directory
    monkeypatch.chdir(work)
    before = _files(tmp_path)
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    with StubOpenAIServer() as stub:
        gateway = serve.build(p.parse_args(["--index", str(index), "--upstream", stub.url, "--k", "2"]))
        emb = gateway.holder.retriever.res.embedder
        emb.max_entries = 8                                     # a small bound, reached within the test
        with serving(gateway.app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
            for i in range(30):
                extra = {"type": "function",
                         "function": {"name": f"lookup_{i}", "description": f"Look up record {i}",
                                      "parameters": {"type": "object", "properties": {}}}}
                client.chat.completions.create(model="m", tools=TOOLS + [extra], messages=[
                    {"role": "user", "content": f"Conversation {i}: what is the weather in city {i}?"}])
    assert len(stub.requests) == 30
    # nothing written, in the working dir or the index
    assert _files(tmp_path) == before
    assert emb.n_encoded >= 60 and len(emb) == emb.max_entries   # a context and a new tool each: 8 kept
