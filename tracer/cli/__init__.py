"""The ``tracer`` command: a small dispatcher over subcommands, each a module with
``add_arguments(parser)`` and ``run(args)``.

    tracer serve --index DIR --upstream http://localhost:8000/v1     # docs/gateway.md    (extra: serve)
    tracer mcp --config servers.json --index DIR                     # docs/gateway.md    (extra: serve)
    tracer update --index DIR --log FILE_OR_DIR [--refit --history DATASET]   # docs/learning.md
    tracer select --index DIR [--messages FILE]                       # a conversation's tools, from the shell

A subcommand whose extra is not installed stays listed; running it says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

SUBCOMMANDS = {  # name -> (module, help, the pip extra it needs)
    "serve": ("tracer.cli.serve", "OpenAI-compatible gateway that presents each request's best k tools",
              "serve"),
    "mcp": ("tracer.cli.mcp",
            "MCP server aggregating upstream MCP servers, tools/list filtered to the best k", "serve"),
    "update": ("tracer.cli.update", "add logged trajectories to a saved index", None),
    "select": ("tracer.cli.select",
               "the tools a saved index presents for a conversation (JSON on stdin or a file)", None),
}


def _load(module: str, extra: str | None) -> ModuleType | str:
    """The subcommand's module, or why it cannot run (its extra is missing)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if extra is None:
            raise
        return f"needs the [{extra}] extra ({e.name} is not installed): pip install 'tracer-toolret[{extra}]'"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="tracer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    # only the named subcommand's module is imported (with its dependencies: MCP's SDK alone takes about a
    # second), so `tracer update` does not pay for the gateway's; the others are listed by their help
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module: ModuleType | str | None = None
    for name, (path, help_text, extra) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = _load(path, extra)
            if not isinstance(module, str):
                module.add_arguments(p)
    args, rest = parser.parse_known_args(argv)
    if isinstance(module, str):
        parser.error(f"tracer {args.command} {module}")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return module.run(args) or 0
