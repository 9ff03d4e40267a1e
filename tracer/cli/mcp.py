"""``tracer mcp``: its arguments (see :mod:`tracer.serve.mcp_server` and docs/gateway.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio
import uvicorn

from tracer.retriever import Retriever
from tracer.serve.mcp_server import ToolRouter, serve_stdio
from tracer.serve.reload import IndexHolder


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, type=Path, help='JSON file with {"mcpServers": {...}}')
    p.add_argument("--index", required=True, type=Path, help="a saved index directory (Retriever.save)")
    p.add_argument("--k", type=int, default=5, help="tools listed besides find_tools")
    p.add_argument("--no-sticky", dest="sticky", action="store_false", help="plain top-k at every change")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="with --transport http")
    p.add_argument("--port", type=int, default=8081, help="with --transport http (path /mcp)")
    p.add_argument("--device", default="cpu")


def build(args: argparse.Namespace) -> ToolRouter:
    if args.k < 1:
        raise SystemExit(f"--k {args.k}: must be at least 1")
    holder = IndexHolder(args.index, lambda d: Retriever.load(d, k=args.k, device=args.device))
    return ToolRouter(args.config, holder, k=args.k, sticky=args.sticky)


async def _serve_http(router: ToolRouter, host: str, port: int) -> None:
    app = router.server.streamable_http_app(host=host)
    async with router:
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()


def run(args: argparse.Namespace) -> None:
    router = build(args)
    if args.transport == "stdio":
        anyio.run(serve_stdio, router)
    else:
        anyio.run(_serve_http, router, args.host, args.port)
