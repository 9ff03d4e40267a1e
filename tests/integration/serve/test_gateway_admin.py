"""The gateway's admin endpoints against hostile traffic, on real servers over loopback (issue 32): who
may report a conversation's outcome, rewards that are not finite numbers, the outcome body's limit,
reloads by the admin token (coalesced, rate-limited), and a corrupt snapshot (tried once per version,
reported by /health) or one that failed for a passing reason (tried again with back-off)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
from gateway_harness import CHAT, TOOLS, make_gateway, raw_request, serving
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.retriever import Retriever
from tracer.serve.http.gateway import Gateway, GatewayConfig
from tracer.serve.log.sink import ConversationLog
from tracer.serve.reload import IndexHolder, version_name


# ---- 11: the admin endpoints ---------------------------------------------------------------------------
def outcome(url: str, body: dict | bytes, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + "/v1/tracer/outcome", content=content, headers=headers, timeout=30)


def test_only_the_conversations_owner_or_the_admin_can_report_its_outcome(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with (
        StubOpenAIServer() as stub,
        serving(make_gateway(index_dir, minilm, stub.url, sink=sink, admin_token="adm-1").app) as url,
    ):
        answers = [
            httpx.post(
                url + "/v1/chat/completions",
                json={**CHAT, "tools": TOOLS},
                headers={"x-tracer-conversation": conv},
            )
            for conv in ("a", "b", "c")
        ]
        token = {a.headers["x-tracer-conversation"]: a.headers["x-tracer-outcome-token"] for a in answers}
        no_token = outcome(url, {"conversation": "a", "success": True})
        others = outcome(
            url, {"conversation": "a", "success": True}, **{"x-tracer-outcome-token": token["b"]}
        )
        wrong_admin = outcome(url, {"conversation": "a", "success": True}, authorization="Bearer adm-2")
        owner = outcome(
            url,
            {"conversation": "a", "success": True, "reward": 0.5},
            **{"x-tracer-outcome-token": token["a"]},
        )
        admin = outcome(url, {"conversation": "b", "success": False}, authorization="Bearer adm-1")
        again = outcome(url, {"conversation": "a", "success": True}, **{"x-tracer-outcome-token": token["a"]})
    assert len(set(token.values())) == 3 and all(len(t) == 64 for t in token.values())
    assert [r.status_code for r in (no_token, others, wrong_admin)] == [403] * 3
    assert no_token.json()["error"]["type"] == "permission_error"
    assert (owner.status_code, admin.status_code, again.status_code) == (200, 200, 404)
    by_group = {t.group: t for t in load_native(tmp_path / "log").trajectories}
    assert (by_group["a"].success, by_group["a"].reward, by_group["a"].metadata["outcome"]) == (
        True,
        0.5,
        "reported",
    )
    assert (by_group["b"].success, by_group["b"].metadata["outcome"]) == (False, "reported")
    assert by_group["c"].metadata["outcome"] == "unreported"


@pytest.mark.parametrize(
    "reward", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"1" + b"0" * 400, b"true", b'"1"']
)
def test_a_reward_that_is_not_a_finite_number_is_a_400_naming_reward(index_dir, minilm, tmp_path, reward):
    sink = ConversationLog(tmp_path / "log")
    with serving(
        make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1", sink=sink, admin_token="t").app
    ) as url:
        r = outcome(
            url, b'{"conversation": "a", "success": true, "reward": %s}' % reward, authorization="Bearer t"
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == "reward"


def test_the_outcome_body_is_limited_before_it_is_read(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with serving(make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1", sink=sink).app) as url:
        declared, _ = raw_request(
            url,
            b"POST /v1/tracer/outcome HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: 41943040",
        )
        chunked = httpx.post(
            url + "/v1/tracer/outcome", content=iter([b'{"conversation": "' + b"x" * 65536] * 8)
        )
    assert declared == 413 and chunked.status_code == 413  # 40 MB announced, 512 KiB streamed: 16 KiB at most


def test_reload_is_off_without_the_admin_token_and_coalesced_and_rate_limited_with_it(index_dir, minilm):
    async def flood(url: str, n: int, token: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(
                *(c.post(url + "/v1/tracer/reload", headers={"authorization": token}) for _ in range(n))
            )

    with serving(make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1").app) as url:
        off = httpx.post(url + "/v1/tracer/reload", headers={"authorization": "Bearer x"})
    assert off.status_code == 403 and "--admin-token" in off.json()["error"]["message"]
    gateway = make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1", admin_token="adm", reload_interval_s=0)
    with serving(gateway.app) as url:
        assert asyncio.run(flood(url, 2, "Bearer wrong"))[0].status_code == 403
        answers = asyncio.run(flood(url, 20, "Bearer adm"))
        after = httpx.post(url + "/v1/tracer/reload", headers={"authorization": "Bearer adm"})
    statuses = [a.status_code for a in answers]
    assert gateway.holder.reloads == 1 and set(statuses) <= {200, 429} and statuses.count(200) >= 1
    assert all(a.json() == {"reloaded": True, "reloads": 1} for a in answers if a.status_code == 200)
    assert after.status_code == 429 and 1 <= int(after.headers["retry-after"]) <= 10


# ---- 12: a corrupt snapshot is tried once per version, and /health says so -----------------------------
def test_a_corrupt_snapshot_is_loaded_once_and_health_reports_it_until_a_good_one_is_published(
    index_dir, minilm, tmp_path
):
    served = tmp_path / "index"
    shutil.copytree(index_dir, served)
    loads: list[str] = []

    def load(d: Path) -> Retriever:
        loads.append((d / "CURRENT").read_text().strip())
        return Retriever.load(d, embedder=minilm, device="cpu")

    holder = IndexHolder(served, load)
    good = loads[0]
    gateway = Gateway(holder, GatewayConfig(upstream="http://127.0.0.1:9/v1", k=2, reload_interval_s=0.05))
    holder.retriever.save(served)  # publish a snapshot, then flip one byte of it
    bad = (served / "CURRENT").read_text().strip()
    victim = max((served / bad).glob("*.npy"), key=lambda p: p.stat().st_size)
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with serving(gateway.app) as url:
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health").json()["status"] == "ok":
            assert time.monotonic() < deadline, "the corrupt snapshot was never tried"
            time.sleep(0.02)
        time.sleep(1.0)  # 20 polls
        degraded = httpx.get(url + "/health")
        tries = loads.count(bad)
        holder.retriever.save(served)  # a good snapshot again: a new version, loaded at the next poll
        while httpx.get(url + "/health").json()["status"] != "ok":
            assert time.monotonic() < deadline + 10, "the good snapshot was not loaded"
            time.sleep(0.02)
        healthy = httpx.get(url + "/health").json()
        metrics = httpx.get(url + "/metrics").text
    assert tries == 1 and degraded.status_code == 200
    report = degraded.json()
    assert report["status"] == "degraded" and report["version"] == good and report["failed_version"] == bad
    assert victim.name in report["reload_error"] and "SHA-256" in report["reload_error"]
    assert healthy["version"] == (served / "CURRENT").read_text().strip() and "reload_error" not in healthy
    assert 'tracer_errors_total{kind="reload_failed"} 1.0' in metrics and holder.reloads == 1


def test_a_version_that_failed_for_a_passing_reason_is_tried_again_with_backoff(index_dir, minilm, tmp_path):
    served, now, loads = tmp_path / "index", [0.0], []
    shutil.copytree(index_dir, served)

    def load(d: Path) -> Retriever:
        loads.append(now[0])
        if len(loads) > 1 and now[0] < 15:
            raise OSError(24, "Too many open files")
        return Retriever.load(d, embedder=minilm, device="cpu")

    holder = IndexHolder(served, load, clock=lambda: now[0])
    holder.retriever.save(served)  # a new version
    for now[0] in (0.0, 0.5, 1.0, 1.5, 2.9, 3.0, 6.9, 7.0, 14.0, 14.9):
        assert not holder.maybe_reload()
    assert loads[1:] == [0.0, 1.0, 3.0, 7.0] and holder.failure.attempts == 4  # after 1, 2, 4 s; next 8 s
    assert "Too many open files" in holder.failure.error and holder.version != version_name(
        holder.failure.token
    )
    now[0] = 15.0
    assert holder.maybe_reload() and holder.failure is None and loads[-1] == 15.0
