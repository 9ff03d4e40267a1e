"""Fixtures of the executor tests: no proxy from the environment (the stub is on loopback), and a stub
OpenAI-compatible server."""

from __future__ import annotations

import pytest
from stub_openai_server import StubOpenAIServer


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    """The client honours *_proxy like any HTTP client; the stub is on loopback."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("TRACER_TEST_KEY", raising=False)


@pytest.fixture
def stub():
    with StubOpenAIServer() as server:
        yield server
