"""``python llama_shim.py ARGS``: llama_cpp.server (same arguments), accepting null message content.

Run by the engine's Python (its own venv, without tracer), so it imports nothing from tracer.

OpenAI's chat format lets an assistant message that makes tool calls carry ``"content": null`` (the
``openai`` client and tracer's BFCL histories send exactly that), and a tool result may be empty.
llama_cpp.server 0.3.36 refuses such a message with a 500 (its request type wants a string), and its
``chatml-function-calling`` template fails on an assistant message without ``content``. This shim puts an
ASGI middleware in front of its app that rewrites, in ``POST .../chat/completions`` bodies only, a null or
missing ``content`` of an assistant or tool message to ``""``; every other byte reaches the server as sent.
It also keeps the RAM prompt cache's states to their KV bytes (:func:`light_states`).
"""

from __future__ import annotations

import json
import sys


def fill_content(body: bytes) -> bytes:
    """``body`` with each assistant or tool message's null or missing ``content`` set to ``""``
    (unchanged when it is not a JSON object with a ``messages`` list, or nothing needed filling)."""
    try:
        request = json.loads(body)
    except ValueError:
        return body
    messages = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(messages, list):
        return body
    filled = False
    for message in messages:
        if (isinstance(message, dict) and message.get("role") in ("assistant", "tool")
                and message.get("content") is None):
            message["content"] = ""
            filled = True
    return json.dumps(request).encode() if filled else body


class FillContent:
    """ASGI middleware: :func:`fill_content` on chat-completions request bodies."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith(
                "/chat/completions"):
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return await self.app(scope, receive, send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = fill_content(b"".join(chunks))
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def light_states(llama_class) -> None:
    """Make ``llama_class.save_state`` keep one row of logits instead of one per token.

    llama_cpp's ``Llama.save_state`` copies ``scores[:n_tokens]``, ``n_vocab`` floats per token of the
    context (912 MB for a 1,500-token BFCL prompt with Qwen2.5's 151,936-token vocabulary), into every state
    its RAM prompt cache keeps, and the cache counts only the KV bytes (``llama_state_size``, 45 MB for that
    prompt) against its capacity, so it can grow far past it. With ``logits_all`` off (``server_command``) a
    loaded state is evaluated again before any token is sampled (``load_state`` sets ``_requires_eval``),
    so only the last row is read; it broadcasts into ``load_state``'s assignment.
    ``tests/integration/models/test_light_states.py`` checks it on the real engine.
    """
    save_state = llama_class.save_state

    def save_light_state(self):
        state = save_state(self)
        state.scores = state.scores[-1:].copy()
        return state

    llama_class.save_state = save_light_state


def main() -> None:
    import llama_cpp  # the engine's venv only
    import llama_cpp.server.__main__ as server
    import uvicorn

    light_states(llama_cpp.Llama)

    run = uvicorn.run
    server.uvicorn.run = lambda app, **options: run(FillContent(app), **options)
    sys.argv[0] = "llama_cpp.server"
    server.main()


if __name__ == "__main__":
    main()
