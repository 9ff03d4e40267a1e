"""``tracer select``: the tools a saved index presents for a conversation, from the shell.

    tracer select --index runs/example/index --messages conversation.json [--k 5]
    echo '[{"role": "user", "content": "book a flight to Oslo"}]' | tracer select --index runs/example/index

``--messages`` is a JSON file holding one conversation (a list of OpenAI chat messages) or a list of them
(``-``, the default: standard input). For each conversation it prints the tools presented for the next call,
best first, and how the conversation was read (:meth:`tracer.retriever.Retriever.read`); ``--json`` prints
one JSON object per conversation instead. A file that is not JSON, or a conversation that cannot be read at
all, is an error naming it (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracer.retriever import Retriever

MAX_INPUT = 64 << 20  # bytes read from --messages: a conversation, not a corpus


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", required=True, help="a saved index directory (train.py's <run dir>/index)")
    p.add_argument("--messages", default="-", help="JSON file: a conversation or a list of them; - = stdin")
    p.add_argument("--k", type=int, default=5, help="tools presented")
    p.add_argument("--device", default=None)
    p.add_argument("--json", action="store_true", help="one JSON object per conversation")


def _conversations(source: str) -> list[list[dict]]:
    name = "<stdin>" if source == "-" else source
    text = sys.stdin.read(MAX_INPUT + 1) if source == "-" else Path(source).read_text()[: MAX_INPUT + 1]
    if len(text) > MAX_INPUT:
        raise ValueError(f"{name}: more than {MAX_INPUT >> 20} MiB")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}:{e.lineno}: not JSON ({e.msg})") from None
    if isinstance(doc, list) and doc and all(isinstance(c, list) for c in doc):
        return doc
    if isinstance(doc, list):
        return [doc]
    raise ValueError(
        f"{name}: expected a list of chat messages or a list of such lists, got {type(doc).__name__}"
    )


def run(args: argparse.Namespace) -> int:
    try:
        conversations = _conversations(args.messages)
        r = Retriever.load(args.index, k=args.k, device=args.device)
        for i, messages in enumerate(conversations):
            live = r.read(messages, f"conversations[{i}]")
            names = [r.registry[t].name for t in r.select_ids(messages)]
            if args.json:
                print(json.dumps({"conversation": i, "tools": names, "lenient": dict(live.lenient)}))
                continue
            last = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
            read = ", ".join(f"{what} {n}" for what, n in sorted(live.lenient.items()))
            print(f"[{i}] {str(last)[:100]!r} -> {', '.join(names)}"
                  + (f"  (read leniently: {read})" if read else ""))
    except (OSError, ValueError) as e:  # DataError and CorruptIndex are ValueErrors naming the file
        print(f"tracer select: {e}", file=sys.stderr)
        return 2
    return 0
