"""``tracer serve``: its arguments and how they build the gateway (see docs/gateway.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import uvicorn

from tracer.cli.options import add_fields, from_args
from tracer.cli.served_index import add_index_arguments, check_k, index_holder
from tracer.serve.bounded import safe_url
from tracer.serve.http.deadline import deadline_protocol
from tracer.serve.http.gateway import Gateway, GatewayConfig
from tracer.serve.http.metrics import setup_json_logging
from tracer.serve.log.sink import ConversationLog, LogLimits, load_callable
from tracer.serve.reload import freeze_long_lived


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_index_arguments(p, k_help="tools presented per request",
                        sticky_help="plain per-step top-k instead of prompt-cache-stable presentation")
    p.add_argument("--upstream", required=True,
                   help="the upstream's OpenAI base URL, e.g. http://localhost:8000/v1")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-presented", type=int, default=None,
                   help="cap on a conversation's sticky list (4 k)")
    p.add_argument("--log", type=Path, default=None, help="log finished conversations here (off by default)")
    p.add_argument("--log-idle", type=float, default=600.0,
                   help="seconds idle before a conversation is finished")
    p.add_argument("--redact", default=None, help="module:function run on each record before it is written")
    add_fields(p, LogLimits, prefix="--log-")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--upstream-timeout", type=float, default=300.0, help="per-request upstream deadline (s)")
    p.add_argument("--reload-interval", type=float, default=2.0,
                   help="seconds between checks of the index's version (0: only on SIGHUP)")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds for a request's headers, and then its body, to arrive (408 past it)")
    p.add_argument("--limit-concurrency", type=int, default=None,
                   help="connections and requests at once before new requests get a 503 (off by default)")
    p.add_argument("--admin-token", default=None,
                   help="enables POST /v1/tracer/reload and admin outcomes; prefer $TRACER_ADMIN_TOKEN, "
                        "which ps does not show (off when neither is set)")
    p.add_argument("--max-admin-body-bytes", type=int, default=16 * 1024,
                   help="body limit of POST /v1/tracer/* (413 beyond)")
    p.add_argument("--reload-min-interval", type=float, default=10.0,
                   help="POST /v1/tracer/reload starts a reload at most this often (429 before)")
    p.add_argument("--max-unknown-embed", type=int, default=256,
                   help="new texts of tools the index does not know embedded per request "
                        "(the rest rank last)")
    p.add_argument("--tools-from-index", action="store_true",
                   help="the registry is held here: requests send no tools, or only their own additions")
    p.add_argument("--log-level", default="info")


def build(args: argparse.Namespace) -> Gateway:
    """The gateway the arguments describe (bad arguments fail here, before anything is served)."""
    check_k(args)
    if not args.upstream.startswith(("http://", "https://")):
        raise SystemExit(f"--upstream {safe_url(args.upstream)!r}: expected an http(s) URL such as "
                         "http://localhost:8000/v1")
    redact = load_callable(args.redact) if args.redact else None
    holder = index_holder(args)
    try:
        limits = from_args(LogLimits, args, prefix="--log-")
    except ValueError as e:
        raise SystemExit(str(e)) from None
    sink = ConversationLog(args.log, redact, args.log_idle, limits=limits) if args.log is not None else None
    config = GatewayConfig(upstream=args.upstream, k=args.k, sticky=args.sticky,
                           max_presented=args.max_presented,
                           max_body_bytes=args.max_body_bytes, upstream_timeout_s=args.upstream_timeout,
                           reload_interval_s=args.reload_interval, log_idle_s=args.log_idle,
                           read_timeout_s=args.read_timeout,
                           admin_token=args.admin_token or os.environ.get("TRACER_ADMIN_TOKEN") or None,
                           max_admin_body_bytes=args.max_admin_body_bytes,
                           reload_min_interval_s=args.reload_min_interval,
                           max_unknown_embed=args.max_unknown_embed, tools_from_index=args.tools_from_index)
    return Gateway(holder, config, sink)


def run(args: argparse.Namespace) -> None:
    setup_json_logging(args.log_level)
    gateway = build(args)
    # the loaded index, torch and the libraries are ~450k long-lived objects that every full collection
    # would walk again; freezing them, and collecting young objects rarely, cuts the gateway's CPU per
    # request and its stalls (docs/gateway.md, Latency)
    freeze_long_lived()
    # uvicorn handles SIGINT/SIGTERM: stops accepting, drains requests in flight, then runs the lifespan exit
    # keep-alive longer than clients' own (httpx: 5 s), so a client never reuses a connection we just closed
    # uvicorn has no deadline on reading a request: the protocol adds one (tracer/serve/http/deadline.py)
    http = deadline_protocol(args.read_timeout, lambda kind: gateway.metrics.errors.labels(kind).inc())
    uvicorn.run(gateway.app, host=args.host, port=args.port, access_log=False, log_level=args.log_level,
                log_config=None,  # uvicorn's own records go through setup_json_logging's handler
                timeout_graceful_shutdown=30, timeout_keep_alive=75, http=http,
                limit_concurrency=args.limit_concurrency)
