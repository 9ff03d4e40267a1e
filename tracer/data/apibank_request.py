"""API-Bank's ``API-Request`` text: ``[Name(k='v', ...), ...]``, optionally followed by ``->result``,
parsed with :mod:`ast` as a Python list of calls with literal keyword arguments (:mod:`tracer.data.apibank`
rebuilds its dialogues from it).

Some requests quote a list or dict literal that itself holds single quotes (``attendees='['John']'``), which
is not valid Python: :func:`parse_request` then drops the quotes around ``[...]`` and ``{...}``, parses again
and keeps each such value as the string it was meant to be (its source text), and says it did.
"""

from __future__ import annotations

import ast
from typing import Any


class RequestError(ValueError):
    """An ``API-Request`` text that is not a list of calls with literal keyword arguments."""


def _calls_of(text: str, as_source: bool) -> list[tuple[str, dict[str, Any]]]:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise RequestError(f"not Python syntax: {e.msg}") from None
    if not isinstance(tree, ast.List) or not tree.elts:
        raise RequestError("expected a non-empty list of calls [Name(k=v, ...)]")
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise RequestError("expected calls of the form Name(k=v, ...)")
        if node.args or any(k.arg is None for k in node.keywords):
            raise RequestError(f"{node.func.id}: positional or ** arguments")
        args = {}
        for kw in node.keywords:
            if as_source and isinstance(kw.value, (ast.List, ast.Dict)):
                args[kw.arg] = ast.get_source_segment(text.strip(), kw.value)
                continue
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except ValueError:
                raise RequestError(f"{node.func.id}: argument {kw.arg!r} is not a literal") from None
        calls.append((node.func.id, args))
    return calls


def _unquote_literals(text: str) -> str:
    """Drop the quotes around quoted list/dict literals (``k='[...]'`` → ``k=[...]``)."""
    for a, b in (("='[", "=["), ("='{", "={"), ("]',", "],"), ("}',", "},"), ("]')", "])"), ("}')", "})")):
        text = text.replace(a, b)
    return text


def parse_request(text: str) -> tuple[list[tuple[str, dict[str, Any]]], str | None, bool]:
    """Parse ``[Name(k='v', ...), ...]`` optionally followed by ``->result``.

    Returns:
        (calls as (name, arguments) pairs, the result text or None when there is no ``->``,
        whether the quoting repair was needed).

    Raises:
        RequestError: no prefix of the text ending at a ``->`` (or the whole text) parses.
    """
    cuts = [i for i in range(len(text)) if text.startswith("->", i)] + [len(text)]
    error: RequestError | None = None
    for cut in cuts:
        head = text[:cut]
        result = text[cut + 2:] if cut < len(text) else None
        for repaired in (False, True):
            try:
                return _calls_of(_unquote_literals(head) if repaired else head, repaired), result, repaired
            except RequestError as e:
                error = error or e
    raise RequestError(f"{text[:80]!r}: {error}")
