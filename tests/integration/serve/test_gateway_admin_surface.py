"""The admin surface ``/v1/tracer/...`` is matched exactly and answered by the gateway (issue 56, defect 4),
on real servers over loopback: a mistyped admin call is a local 404 or 405, never forwarded with the admin
token, and no forwarded request ever carries the admin token, whatever its path or header."""

from __future__ import annotations

import httpx
import openai
import pytest
from gateway_harness import CHAT, TOOLS, make_gateway, serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

ADMIN = "adm-secret-7"


def recording_upstream() -> Starlette:
    """Answers every path and method with a small completion; records (method, path, headers)."""
    seen: list[tuple[str, str, dict]] = []

    async def anything(request: Request) -> JSONResponse:
        await request.body()
        seen.append((request.method, request.url.path, dict(request.headers)))
        return JSONResponse({"id": "c", "object": "chat.completion", "choices": []})

    app = Starlette(routes=[Route("/{path:path}", anything,
                                  methods=["GET", "POST", "DELETE", "PUT", "PATCH"])])
    app.state.seen = seen
    return app


MISTYPED = [("GET", "/v1/tracer/reload", 405), ("DELETE", "/v1/tracer/outcome", 405),
            ("POST", "/v1/tracer/reload/", 404), ("POST", "/v1/tracer/relaod", 404),
            ("POST", "/v1/tracer/outcome/", 404), ("GET", "/v1/tracer", 404), ("GET", "/v1/tracer/", 404),
            ("POST", "/v1//tracer/reload", 404), ("POST", "/v1/Tracer/reload", 404),
            ("POST", "/v1/%54racer/reload", 404), ("PUT", "/v1/tracer/reload", 405)]


@pytest.mark.parametrize("with_token", [True, False], ids=["admin-token", "no-token"])
def test_a_mistyped_admin_path_is_answered_locally_and_never_forwarded(index_dir, minilm, with_token):
    upstream = recording_upstream()
    headers = {"authorization": f"Bearer {ADMIN}"} if with_token else {}
    with serving(upstream) as up, \
            serving(make_gateway(index_dir, minilm, up + "/v1", admin_token=ADMIN).app) as url:
        answers = [httpx.request(method, url + path, headers=headers, content=b"{}")
                   for method, path, _ in MISTYPED]
        admin_ok = httpx.post(url + "/v1/tracer/reload", headers={"authorization": f"Bearer {ADMIN}"})
    assert [(m, p, a.status_code) for (m, p, _), a in zip(MISTYPED, answers)] == MISTYPED
    assert all(a.json()["error"]["message"] for a in answers)
    assert answers[0].headers["allow"] == "POST"
    assert admin_ok.status_code == 200                        # the exact route still works
    assert upstream.state.seen == []                          # nothing reached the upstream


def test_no_forwarded_request_carries_the_admin_token(index_dir, minilm):
    upstream = recording_upstream()
    with serving(upstream) as up, \
            serving(make_gateway(index_dir, minilm, up + "/v1", admin_token=ADMIN).app) as url:
        as_key = openai.OpenAI(base_url=url + "/v1", api_key=ADMIN, max_retries=0, timeout=30)
        with pytest.raises(openai.PermissionDeniedError) as chat:
            as_key.chat.completions.create(model="m", messages=CHAT["messages"], tools=TOOLS)
        with pytest.raises(openai.PermissionDeniedError):
            as_key.models.list()
        other_header = httpx.get(url + "/v1/models", headers={"api-key": ADMIN})
        user = openai.OpenAI(base_url=url + "/v1", api_key="sk-user", max_retries=0, timeout=30)
        user.chat.completions.create(model="m", messages=CHAT["messages"], tools=TOOLS)
        httpx.get(url + "/v1/models", headers={"authorization": "Bearer sk-user"})
    assert chat.value.status_code == 403 and chat.value.body["param"] == "authorization"
    assert other_header.status_code == 403
    # the user's two requests went through; none of the admin-token ones did
    assert [(m, p) for m, p, _ in upstream.state.seen] == [("POST", "/v1/chat/completions"),
                                                           ("GET", "/v1/models")]
    assert all(ADMIN not in str(h) for _, _, h in upstream.state.seen)
