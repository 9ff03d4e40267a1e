"""``executor@memory_executor=openai``: H-EPM's and Insight's summaries from a model while the oracle chooses
the steps' calls, so a memory made by a real model is measured by recall without asking the model about every
step (issue 58)."""

from __future__ import annotations

import json

from builders import ROOT
from hydra import compose, initialize_config_dir
from stub_openai_server import StubOpenAIServer

from tracer.jobs.evaluate import run_job


def _compose(tmp_path, native_dir, *overrides):
    with initialize_config_dir(str(ROOT / "tracer" / "configs"), version_base="1.3"):
        return compose("evaluate", overrides=[
            "dataset=jsonl", f"dataset.path={native_dir}", "folds=2", "progress=false", "latency_sample=0",
            f"embedder.cache_dir={tmp_path / 'cache'}", *overrides])


def _summary(body: dict) -> dict:
    state = body["messages"][-1]["content"]
    return {"content": f"A summary of a state of {len(state)} characters."}


def test_the_memory_executor_writes_the_summaries_while_the_oracle_chooses(tmp_path, native_dir):
    with StubOpenAIServer(policy=_summary) as server:
        doc = run_job(_compose(tmp_path, native_dir, "scorer=hepm", "executor@memory_executor=openai",
                               f"memory_executor.base_url={server.url}", "memory_executor.model=stub",
                               "memory_executor.api_key_env=null"), tmp_path / "run")
    assert doc["executor"].startswith("oracle")
    # every request was a summary (no tools offered): the oracle made the steps' calls
    assert server.requests and not any(body.get("tools") for body in server.requests)
    assert all("summarise the state" in body["messages"][0]["content"] for body in server.requests)
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())["scorer_info"]
    assert all(fold["model_calls"] > 0 for fold in info)
    assert sum(fold["model_calls"] for fold in info) == len(server.requests)
    assert all("model summaries" in json.dumps(fold) for fold in info)

    offline = run_job(_compose(tmp_path, native_dir, "scorer=hepm"), tmp_path / "offline")
    info = json.loads((tmp_path / "offline" / "run_info.json").read_text())["scorer_info"]
    assert offline["executor"].startswith("oracle") and all(fold["model_calls"] == 0 for fold in info)


def test_insight_distils_its_clusters_with_the_memory_executor(tmp_path, native_dir):
    with StubOpenAIServer(policy=_summary) as server:
        run_job(_compose(tmp_path, native_dir, "scorer=vector", "insight=true",
                         "executor@memory_executor=openai", f"memory_executor.base_url={server.url}",
                         "memory_executor.model=stub", "memory_executor.api_key_env=null"), tmp_path / "run")
    asked = [body["messages"][-1]["content"] for body in server.requests]
    distilled = [a for a in asked if a.startswith("These are summaries of similar past episodes")]
    assert distilled and len(distilled) < len(asked)  # the episodes' summaries, then one per cluster
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())["scorer_info"]
    assert sum(fold["insight"]["model_calls"] for fold in info) == len(server.requests)
    # the lessons it adds to the prompt are the model's answers, one per cluster
    lessons = [lesson for fold in info for lesson in fold["insight"]["lessons"]]
    assert len(lessons) == len(distilled) and all("(distilled by the model): A summary" in x for x in lessons)
