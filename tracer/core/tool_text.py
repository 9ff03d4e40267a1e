"""How a tool reads to an encoder: the text its vector is computed from.

An encoder is trained and served with one rendering of tools, so the rendering belongs to the embedder
(``tool_text`` on :class:`tracer.encode.embedders.SentenceTransformerEmbedder`, kept in a saved index's
embedder config) and every place that embeds tools asks it (:func:`tracer.encode.embedders.tool_rows`).

==================  ==========================================================================================
``name_description``  ``name: description`` (:attr:`Tool.search_text`), what every committed result embeds
``parameters``        the same, then `` | name: description`` for each top-level parameter, in schema order
==================  ==========================================================================================

What each rendering measures, zero-shot and for the general encoder: docs/encoders.md (tool text).
"""

from __future__ import annotations

from collections.abc import Mapping

from tracer.core.types import Tool

TOOL_TEXTS = ("name_description", "parameters")


def check_tool_text(style: str, where: str = "tool_text") -> str:
    """``style`` when it is a rendering of :data:`TOOL_TEXTS`, else a ``ValueError`` naming ``where``."""
    if style not in TOOL_TEXTS:
        raise ValueError(f"{where} must be one of {', '.join(TOOL_TEXTS)}, got {style!r}")
    return style


def tool_text(tool: Tool, style: str = "name_description") -> str:
    """The text of ``tool`` under rendering ``style``."""
    if check_tool_text(style) == "name_description":
        return tool.search_text
    props = tool.parameters.get("properties") if isinstance(tool.parameters, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    return tool.search_text + "".join(
        f" | {name}: {(p.get('description', '') if isinstance(p, Mapping) else '')}"
        for name, p in props.items())
