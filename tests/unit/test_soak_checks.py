"""The soak's leak and duplicate detectors (benchmarks/soak/): they must count what they claim to, or a soak
that reports 0 proves nothing. The stub upstream in process (Starlette's TestClient), and the log reader
on a written log; no gateway, no model."""

from __future__ import annotations

import argparse
import json

from starlette.testclient import TestClient

from benchmarks.soak.results import analyze_log
from benchmarks.soak.stub import stub_app
from benchmarks.soak.traffic import COMPANIES, family, known_tools


def post(client: TestClient, rid: str, tools: list[dict], **headers: str):
    h = {"x-soak-id": rid, "x-soak-kind": "normal", "x-soak-tenant": "1", "x-soak-k": "5", **headers}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi [globex]"}], "tools": tools}
    if "tool_choice" in headers:
        body["tool_choice"] = json.loads(h.pop("tool_choice"))
    return client.post("/v1/chat/completions", json=body, headers=h)


def test_stub_counts_duplicates_first_requests_over_k_and_allowed_violations():
    client = TestClient(stub_app())
    known = known_tools()
    assert post(client, "a", known[:5], **{"x-soak-first": "1"}).status_code == 200
    post(client, "a", known[:5])  # the same request id again: a duplicate upstream POST
    post(client, "b", known, **{"x-soak-first": "1"})  # 6 tools on a first request: k is 5
    post(client, "c", known)  # a later request may carry more than k
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]}}
    post(client, "d", [*known[:2], family(0)[0]],
         **{"x-soak-allowed": "1", "tool_choice": json.dumps(allowed)})
    view = client.get("/soak/records").json()
    t = view["tenancy"]
    assert view["duplicate_posts"] == 1 and t["duplicates"][0]["id"] == "a"
    assert (t["first_requests"], t["first_over_k"], t["later_over_k"]) == (2, 1, 1)
    assert t["allowed_violations"] == 1  # acme's tool for globex, get_weather listed but not sent
    assert t["allowed_samples"][0]["outside_allowed"] == [family(0)[0]["function"]["name"]]
    assert t["foreign_presented"] == 1


def test_stub_never_calls_another_tenants_tool_and_compresses_as_asked():
    client = TestClient(stub_app())
    tools = [family(0)[0], family(1)[0]]  # acme's first: the stub must call globex's (tenant 1)
    r = post(client, "e", tools, **{"x-soak-encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip"
    call = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]  # httpx decodes it
    assert call["name"].startswith("globex_") and "[globex]" in call["arguments"]
    raw = client.post("/v1/chat/completions", json={"messages": [], "tools": tools, "stream": True},
                      headers={"x-soak-id": "f", "x-soak-tenant": "1", "x-soak-encoding": "deflate",
                               "accept-encoding": "identity"})
    assert raw.headers["content-encoding"] == "deflate"
    assert b"[DONE]" in raw.content  # decoded by the client, whole


def test_log_reader_counts_mixed_records_cross_tenant_finishes_and_completions(tmp_path):
    def rec(group: str, tenant: int, success: bool, outcome: str = "reported", extra: str = "") -> str:
        co = COMPANIES[tenant]
        msgs = [{"role": "user", "content": f"hello [{co}]{extra}"},
                {"role": "assistant", "content": "Done: everything you asked is finished."}]
        return json.dumps({"group": group, "success": success, "reward": float(success), "messages": msgs,
                           "metadata": {"outcome": outcome}})

    (tmp_path / "trajectories.jsonl").write_text("\n".join([
        rec("1", 0, True), rec("1", 1, True),  # the same id in two tenants: two conversations
        rec("2", 0, True),                      # finished, but only tenant 1 reported "2": a leak
        rec("3", 2, False, extra=" [acme]"),    # two tenants' messages in one record
        rec("4", 3, True), rec("4", 3, True),   # logged twice
    ]) + "\n")

    soak = argparse.Namespace(
        args=argparse.Namespace(tenants=4), cut_conversations=set(), conv_kind={},
        reported={(0, "1"): ("normal", True), (1, "1"): ("normal", True), (1, "2"): ("sdk", True),
                  (3, "4"): ("normal", True), (2, "5"): ("stream", False)})
    out = analyze_log(tmp_path, soak)
    assert out["mixed_tenants"] == 1 and out["cross_tenant_finished"] == 1
    done = out["completed"]
    assert (done["completed"], done["logged_once"], done["twice"], done["missing"]) == (5, 2, 1, 2)
