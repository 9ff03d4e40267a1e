"""Executors by name: ``oracle`` (offline default), ``openai`` (any OpenAI-compatible endpoint), ``vllm``."""

from __future__ import annotations

from typing import Any

from tracer.executors.base import Decision, Executor, Request
from tracer.executors.oracle import OracleExecutor


def build_executor(name: str = "oracle", **cfg: Any) -> Executor:
    if name == "oracle":
        return OracleExecutor()
    if name == "openai":
        from tracer.executors.openai import OpenAIExecutor

        return OpenAIExecutor(**cfg)
    if name == "vllm":
        from tracer.executors.vllm import VLLMExecutor

        return VLLMExecutor(**cfg)
    raise KeyError(f"unknown executor {name!r}; valid names: oracle, openai, vllm")


__all__ = ["Decision", "Executor", "OracleExecutor", "Request", "build_executor"]
