"""``tracer mcp``: its arguments (see :mod:`tracer.serve.mcp.server` and docs/gateway.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio
import uvicorn

from tracer.cli.options import add_fields, from_args
from tracer.cli.served_index import add_index_arguments, check_k, index_holder
from tracer.serve.mcp.server import ToolRouter, serve_stdio
from tracer.serve.mcp.sessions import SessionCaps


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, type=Path, help='JSON file with {"mcpServers": {...}}')
    add_index_arguments(p, k_help="tools listed besides find_tools",
                        sticky_help="plain top-k at every change")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="with --transport http")
    p.add_argument("--port", type=int, default=8081, help="with --transport http (path /mcp)")
    add_fields(p, SessionCaps)
    p.add_argument("--upstream-retries", type=int, default=5,
                   help="reconnection attempts in a row for a lost upstream (0: none)")
    p.add_argument("--upstream-retry-delay", type=float, default=1.0,
                   help="seconds before the first reconnection attempt, doubling up to 60")


def build(args: argparse.Namespace) -> ToolRouter:
    check_k(args)
    try:
        caps = from_args(SessionCaps, args)
        if args.upstream_retries < 0 or not args.upstream_retry_delay > 0:
            raise ValueError("--upstream-retries must be >= 0 and --upstream-retry-delay > 0")
    except ValueError as e:
        raise SystemExit(f"tracer mcp: {e}") from None
    return ToolRouter(args.config, index_holder(args), k=args.k, sticky=args.sticky, caps=caps,
                      retries=args.upstream_retries, retry_delay_s=args.upstream_retry_delay)


async def _serve_http(router: ToolRouter, host: str, port: int) -> None:
    app = router.http_app(host=host)
    async with router:
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()


def run(args: argparse.Namespace) -> None:
    router = build(args)
    if args.transport == "stdio":
        anyio.run(serve_stdio, router)
    else:
        anyio.run(_serve_http, router, args.host, args.port)
