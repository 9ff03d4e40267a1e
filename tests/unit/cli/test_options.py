"""Flags declared by the bounds dataclasses they fill (tracer/cli/options.py)."""

import argparse

import pytest

from tracer.cli import mcp as mcp_cli
from tracer.cli.options import add_fields, from_args
from tracer.serve.log.sink import LogLimits
from tracer.serve.mcp.sessions import SessionCaps


def parser_for(cls, prefix="--"):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_fields(parser, cls, prefix)
    return parser


def test_defaults_are_the_dataclass_defaults():
    assert from_args(SessionCaps, parser_for(SessionCaps).parse_args([])) == SessionCaps()
    assert from_args(LogLimits, parser_for(LogLimits, "--log-").parse_args([]), "--log-") == LogLimits()


def test_each_field_is_its_flag_with_its_type():
    args = parser_for(SessionCaps).parse_args(
        ["--max-sessions", "9", "--max-tenant-sessions", "3", "--session-idle", "2.5",
         "--handshake-deadline", "4", "--max-messages", "6", "--max-text", "100"])
    assert from_args(SessionCaps, args) == SessionCaps(max_sessions=9, max_tenant_sessions=3, idle_s=2.5,
                                                       handshake_s=4.0, max_messages=6, max_text=100)
    with pytest.raises(argparse.ArgumentError, match="--max-text: invalid int value"):
        parser_for(SessionCaps).parse_args(["--max-text", "1.5"])


def test_tracer_mcp_refuses_a_bad_bound_naming_the_field():
    parser = argparse.ArgumentParser()
    mcp_cli.add_arguments(parser)
    args = parser.parse_args(["--config", "servers.json", "--index", "none", "--max-messages", "0"])
    with pytest.raises(SystemExit, match="tracer mcp: max_messages must be at least 1, got 0"):
        mcp_cli.build(args)
