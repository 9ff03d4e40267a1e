"""The ``tracer`` command: a small dispatcher over subcommands, each a module with
``add_arguments(parser)`` and ``run(args)``.

    tracer serve --index DIR --upstream http://localhost:8000/v1     # docs/gateway.md
    tracer mcp --config servers.json --index DIR                     # docs/gateway.md
    tracer update --index DIR --log FILE_OR_DIR [--refit --history DATASET]   # docs/learning.md
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tracer.cli import mcp, serve, update

SUBCOMMANDS = {
    "serve": (serve, "OpenAI-compatible gateway that presents each request's best k tools"),
    "mcp": (mcp, "MCP server aggregating upstream MCP servers, tools/list filtered to the best k"),
    "update": (update, "add logged trajectories to a saved index"),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    return SUBCOMMANDS[args.command][0].run(args) or 0

