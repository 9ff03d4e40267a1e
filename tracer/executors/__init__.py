"""Executors: ``oracle`` (offline default), ``openai`` (any OpenAI-compatible endpoint), ``vllm``; each built
from its YAML in ``tracer/configs/executor/`` (``_target_``)."""

from tracer.executors.base import Decision, Executor, Request
from tracer.executors.oracle import OracleExecutor

__all__ = ["Decision", "Executor", "OracleExecutor", "Request"]
