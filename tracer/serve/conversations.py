"""Which conversation a chat request belongs to, and whose it is.

**Tenants.** Every conversation belongs to the credential that sent it: its tenant is a keyed digest of
the request's credential (:func:`credential_of`: ``Authorization``, ``api-key``, ``x-api-key``; the key
is random per process, the credential itself is never stored or logged). A request without a credential
belongs to the anonymous tenant, apart from every key. Every piece of per-conversation state (the sticky
presentation list, the pending log, the outcome token) is kept under a :class:`ConversationKey`, the tenant
and the id together, so two API keys that send the same ``X-Tracer-Conversation`` (``1``, ``2``, ...), or
one key that sends another's continuation id, never share a conversation.

**Which conversation, without asking the client for a header.**

An agent resends its whole conversation at every step: the messages it sent last time, the assistant
message the gateway returned, then what happened since (tool results, a new user message). So a request
continues the conversation whose remembered prefix it extends. The rule (:class:`ConversationIds`):

- ``X-Tracer-Conversation``, when sent, is the id within the request's tenant (authoritative; nothing is
  remembered for it).
- Else the messages are hashed as a chain, ``h[i] = H(h[i-1], message i)``, starting from the tenant's
  digest (two API keys never continue each other's conversations).
- Each conversation remembers two points: the hash of the last request's messages and, when the answer
  was a plain JSON completion, of those messages plus the assistant message returned. A request continues
  the conversation of the longest remembered point that is a *proper* prefix of its messages (it adds at
  least one message); that conversation then remembers the new request's points instead of the old ones,
  so two requests that extend the same point get two conversations (the first continues, the second starts
  anew: a fork, or a second agent).
- A request that extends no point, or repeats one exactly (a second agent whose first request is
  the same system and user message as another's, or a retry), starts a new conversation with a random id.

A message's hash reads its role, content, tool calls (id, name, arguments) and ``tool_call_id``, not the
fields clients add or drop when they send an answer back (``refusal: null``, ``annotations``). What is
remembered is bounded: ``max_conversations`` conversations, least recently used first out, two 16-byte
points each. After a restart, or on another replica, a conversation's next request starts a new id.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import secrets
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from tracer.core.lru import LRU
from tracer.core.types import Message

CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")  # OpenAI's, Azure OpenAI's, Anthropic's


def credential_of(headers: Mapping[str, str]) -> str | None:
    """The request's credential (its credential headers' values, in order), or None without one."""
    sent = [f"{h}: {headers[h]}" for h in CREDENTIAL_HEADERS if headers.get(h)]
    return "\n".join(sent) if sent else None


class ConversationKey(str):
    """A conversation's key in every per-conversation store: ``"<tenant>/<id>"``.

    ``tenant`` is the 32-hex-digit keyed digest of the credential (:meth:`ConversationIds.tenant`), ``id``
    the id the client knows (the answer's ``X-Tracer-Conversation``, the logged record's ``group``). As a
    string it is the two together, so any dict keyed by it keeps tenants apart."""

    tenant: str
    id: str

    def __new__(cls, tenant: str, id: str) -> ConversationKey:  # noqa: PYI034 (no typing.Self on 3.10)
        key = super().__new__(cls, f"{tenant}/{id}")
        key.tenant, key.id = tenant, id
        return key


def conversation_id(key: str) -> str:
    """The id the client knows of ``key`` (a :class:`ConversationKey`; a plain string is its own id)."""
    return key.id if isinstance(key, ConversationKey) else key


@dataclass(frozen=True)
class Turn:
    """A request's conversation id, how it was found (``header``, ``continued``, ``new``), its point and
    its key (the tenant and the id: what per-conversation state is kept under)."""

    id: str
    how: str
    point: bytes | None = None
    key: ConversationKey | None = None


def _canonical(m: Any) -> bytes:
    if not isinstance(m, Mapping):
        return orjson.dumps(repr(m))
    calls = m.get("tool_calls") or ()
    fns = [(c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
           if isinstance(c, Mapping) else repr(c) for c in calls] if isinstance(calls, list) else repr(calls)
    canon = [m.get("role"), m.get("content") or "", fns, m.get("tool_call_id")]
    try:
        return orjson.dumps(canon, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:  # not JSON data (a caller from Python): its repr still tells messages apart
        return repr(canon).encode()


class ConversationIds:
    """Conversation ids by continuation (see the module docstring); thread-safe."""

    def __init__(self, max_conversations: int = 10000):
        self.max_conversations = max_conversations
        self._key = secrets.token_bytes(32)                 # digests mean nothing outside this process
        self._points: dict[bytes, deque[str]] = {}          # point -> conversations holding it, oldest first
        # conversation -> its points; the least recently used one's points are forgotten to make room
        # (a function of the points alone, not a method: what this holds never refers back to the lock)
        self._held = LRU(max_conversations, on_evict=functools.partial(_unlink, self._points))
        self._lock = threading.Lock()

    def _chain(self, start: bytes, messages: Sequence[Message]) -> list[bytes]:
        out, h = [], start
        for m in messages:
            h = hashlib.blake2b(h + _canonical(m), digest_size=16, key=self._key).digest()
            out.append(h)
        return out

    def tenant(self, credential: str | None) -> str:
        """The tenant of a credential (:func:`credential_of`): 32 hex digits, the same for the process's
        lifetime; None (no credential) is the anonymous tenant."""
        sent = b"" if credential is None else b"\x01" + credential.encode("utf-8", "replace")
        return hashlib.blake2b(sent, digest_size=16, key=self._key, person=b"tracer-auth").hexdigest()

    def assign(self, messages: Sequence[Message], credential: str | None = None,
               header: str | None = None) -> Turn:
        """The conversation of a request (its messages, its credential (:func:`credential_of`), the
        ``X-Tracer-Conversation`` header)."""
        tenant = self.tenant(credential)
        if header:
            return Turn(header, "header", key=ConversationKey(tenant, header))
        chain = self._chain(bytes.fromhex(tenant), messages)
        with self._lock:
            conv = next((q[0] for h in reversed(chain[:-1]) if (q := self._points.get(h))), None)
            how = "new" if conv is None else "continued"
            if conv is None:
                conv = secrets.token_hex(16)
            self._remember(conv, [chain[-1]] if chain else [])
        return Turn(conv, how, chain[-1] if chain else None, ConversationKey(tenant, conv))

    def answered(self, turn: Turn, reply: Mapping[str, Any] | None) -> None:
        """Remember the point after the assistant message ``reply`` returned for ``turn`` (when known)."""
        if turn.point is None or reply is None:
            return
        point = self._chain(turn.point, [reply])[0]
        with self._lock:
            held = self._held.peek(turn.id)  # an answer does not make its conversation recent
            if held is not None and turn.point in held and point not in held:
                held.append(point)
                self._points.setdefault(point, deque()).append(turn.id)

    def __len__(self) -> int:
        return len(self._held)

    def _remember(self, conv: str, points: list[bytes]) -> None:
        """``conv`` now holds ``points`` only (under the lock)."""
        _unlink(self._points, conv, self._held.pop(conv, ()))
        for p in points:
            self._points.setdefault(p, deque()).append(conv)
        self._held[conv] = points  # evicts the least recently used conversation when full


def _unlink(index: dict[bytes, deque[str]], conv: str, points: Sequence[bytes]) -> None:
    """``conv`` no longer holds ``points`` in ``index`` (point -> conversations): it was given new ones, or
    evicted (under the owner's lock)."""
    for p in points:
        q = index.get(p)
        if q is not None:
            with contextlib.suppress(ValueError):
                q.remove(conv)
            if not q:
                del index[p]


def reply_message(response: Response) -> dict[str, Any] | None:
    """The assistant message of a plain JSON completion (``choices[0].message``), else None."""
    if isinstance(response, StreamingResponse) or response.status_code != 200 \
            or "content-encoding" in response.headers:
        return None
    try:
        message = orjson.loads(response.body)["choices"][0]["message"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    return message if isinstance(message, dict) else None
