"""What :class:`tracer.executors.openai.OpenAIExecutor` reads off a server's answer: a tool call's arguments
(a JSON object, an object, or nothing), a failed request's error message, how long a ``Retry-After`` asks to
wait (capped), what a connection error was, and a reply clipped for an error message."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

RETRY_AFTER_CAP_S = 60.0  # never sleep longer than this on a server's Retry-After


def _parse_arguments(arguments: Any) -> dict | None:
    """The arguments of a tool call as a dict, or None when they are not a JSON object."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, Mapping):  # some servers send an object instead of a JSON string
        return dict(arguments)
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _error_detail(raw: bytes, reason: str) -> str:
    """The server's error message (OpenAI's ``{"error": {"message": ...}}``, else the body's start)."""
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else body
        message = err.get("message") if isinstance(err, dict) else err
        if message:
            return str(message)[:500]
    except ValueError:
        pass
    return _clip(raw) or reason


def _causes(e: BaseException) -> str:
    """An exception and what caused it (httpx says "All connection attempts failed"; the cause says
    refused)."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen and len(parts) < 4:
        seen.add(id(e))
        text = f"{type(e).__name__} {e}" if type(e) is not OSError and isinstance(e, OSError) else str(e)
        if text and text not in parts:
            parts.append(text)
        e = e.__cause__ or e.__context__
    return ": ".join(parts) or "connection failed"


def _retry_after(headers: Mapping[str, str]) -> float:
    try:
        return min(max(float(headers.get("Retry-After") or 0), 0.0), RETRY_AFTER_CAP_S)
    except (TypeError, ValueError):  # an HTTP date, or garbage: fall back to our own back-off
        return 0.0


def _clip(obj: Any, n: int = 300) -> str:
    text = obj.decode("utf-8", "replace") if isinstance(obj, bytes) else str(obj)
    return text if len(text) <= n else text[:n] + "..."
