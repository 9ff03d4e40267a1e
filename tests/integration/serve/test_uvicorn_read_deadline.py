"""tracer.serve.http.deadline exists because uvicorn has no deadline on reading a request; these tests pin
that against the installed uvicorn, so that an upgrade which changes it fails here rather than going
unnoticed: the version the module was checked on, uvicorn's settings, and a plain uvicorn server (no tracer
protocol) that keeps a dripping client and a silent one well past its own keep-alive timeout."""

from __future__ import annotations

import inspect
import math
from concurrent.futures import ThreadPoolExecutor

import uvicorn
from gateway_harness import drip, serving
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tracer.serve.http.deadline import CHECKED_UVICORN

RECHECK = ("tracer/serve/http/deadline.py subclasses uvicorn's HttpToolsProtocol and was checked on uvicorn "
           f"{CHECKED_UVICORN}: see whether uvicorn now bounds the time to read a request (then use its "
           "setting), run tests/integration/serve/test_gateway_slow_clients.py, and update CHECKED_UVICORN")


def test_the_uvicorn_installed_is_the_one_deadline_was_checked_on():
    installed = tuple(int(part) for part in uvicorn.__version__.split(".")[:2])
    assert installed == CHECKED_UVICORN, RECHECK


def test_uvicorn_has_no_setting_for_how_long_a_request_may_take_to_arrive():
    timeouts = {name for name in inspect.signature(uvicorn.Config).parameters if "timeout" in name}
    assert timeouts == {"timeout_keep_alive", "timeout_notify", "timeout_graceful_shutdown",
                        "timeout_worker_healthcheck", "ws_ping_timeout"}, RECHECK


def test_plain_uvicorn_keeps_a_dripping_or_silent_client_past_its_keep_alive():
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    head = b"GET / HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 40  # never finished
    with serving(app, http="httptools", timeout_keep_alive=1) as url, ThreadPoolExecutor(2) as pool:
        dripping = pool.submit(drip, url, b"", head, 1, 0.1, 3.5)
        silent = pool.submit(drip, url, b"", b"", 1, 0.1, 3.5)
        # neither closed nor answered after 3.5 s (math.inf: still open when drip gave up)
        assert dripping.result() == [(math.inf, b"")], RECHECK
        assert silent.result() == [(math.inf, b"")], RECHECK
