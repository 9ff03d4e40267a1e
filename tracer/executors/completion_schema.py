"""The shape of an OpenAI chat-completion reply, checked strictly (what :mod:`.openai` reads of it).

Strict means no coercion: ``"5"`` is not a token count and a string is not a message. Fields we do
not read are ignored, and so are extra keys. ``arguments`` may be a JSON string (the protocol) or
an object (some servers); whether it parses is the model's affair (a malformed call), not the
reply's shape. A tool call's ``name`` may be missing or empty for the same reason.

Example::

    Completion.model_validate({"choices": [{"message": {"content": "hi"}}]})
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

__all__ = ["Completion", "ValidationError", "describe_error"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class Function(_Strict):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None


class ToolCallItem(_Strict):
    id: str | None = None
    function: Function


class Message(_Strict):
    content: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    reasoning_content: str | None = None  # vLLM's reasoning parsers put the thinking here


class Choice(_Strict):
    message: Message
    finish_reason: str | None = None


class Usage(_Strict):
    prompt_tokens: NonNegativeInt | None = None
    completion_tokens: NonNegativeInt | None = None


class Completion(_Strict):
    choices: list[Choice] = Field(min_length=1)
    usage: Usage | None = None


def describe_error(e: ValidationError, limit: int = 3) -> str:
    """The first few problems of a failed validation, one line: ``choices.0.message: should be an object``."""
    parts = [f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in e.errors()[:limit]]
    more = e.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
