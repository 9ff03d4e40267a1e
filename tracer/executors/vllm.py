"""vLLM in-process: the model runs inside this Python process (``pip install 'tracer-toolret[vllm]'``).

Each request is rendered with the model's own chat template, its presented tools included, and all
requests of a :meth:`VLLMExecutor.choose` call are generated in one batch. (``LLM.chat`` takes one
``tools`` list for all the conversations it is given, and every step presents its own tools, so
batching through it would mean one call per distinct tool set.) The tool calls are then read back
from the generated text by :func:`parse_tool_calls`, which accepts the formats that the common
chat templates produce:

* hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one block per call);
* Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
* Llama 3.1: ``<|python_tag|>{"name": ..., "parameters": {...}}`` or the bare object;
* a bare JSON object or list of objects (optionally in a ```` ```json ```` fence); ``arguments``
  may also be called ``parameters``, be a JSON string, or sit under ``{"function": {...}}``.

``tool_choice`` is kept for config parity with the server executor; in-process generation is
always "auto" (the model may answer in text).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tracer.core.types import ToolCall
from tracer.executors.base import Decision, Request

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_MARKERS = ("[TOOL_CALLS]", "<|python_tag|>")
_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.DOTALL)
_DECODER = json.JSONDecoder()


def parse_tool_calls(text: str) -> tuple[list[ToolCall], bool]:
    """Tool calls in generated ``text``, in order, and whether a call attempt could not be parsed.

    Parsing stops at the first attempt that fails: the calls before it are returned along with
    ``malformed=True``. Plain prose is ``([], False)``.

    >>> parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    ([ToolCall(name='f', arguments={'x': 1}, id='')], False)
    >>> parse_tool_calls('{"name": "f", "arguments": {"x": ')
    ([], True)
    >>> parse_tool_calls('The answer is 4.')
    ([], False)
    """
    calls, malformed, _ = split_tool_calls(text)
    return calls, malformed


def split_tool_calls(text: str) -> tuple[list[ToolCall], bool, str]:
    """``(calls, malformed, content)`` of generated ``text``, as :func:`parse_tool_calls`; ``content`` is the
    text before the first call (all of it when there is none), what a server-side tool-call parser returns as
    the message's ``content`` beside its ``tool_calls``."""
    start = text.find("<tool_call>")
    if start >= 0:
        calls: list[ToolCall] = []
        for block in _HERMES.findall(text, start):
            try:
                values = _json_values(block.strip())
            except ValueError:
                return calls, True, text[:start].strip()
            for value in values:
                call = _to_call(value)
                if call is None:
                    return calls, True, text[:start].strip()
                calls.append(call)
        return calls, not calls, text[:start].strip()

    for marker in _MARKERS:
        start = text.find(marker)
        if start >= 0:
            calls, malformed = _parse_json_calls(text[start + len(marker):].strip())
            return calls, malformed or not calls, text[:start].strip()

    body = text.strip()
    fenced = _FENCE.match(body)
    body = fenced.group(1) if fenced else body
    if body.startswith(("{", "[")):
        calls, malformed = _parse_json_calls(body)
        if calls or (malformed and '"name"' in body):
            return calls, malformed, ""
    return [], False, text.strip()


def _parse_json_calls(body: str) -> tuple[list[ToolCall], bool]:
    try:
        values = _json_values(body)
    except ValueError:
        return [], True
    calls: list[ToolCall] = []
    for value in values:
        call = _to_call(value)
        if call is None:
            return calls, True
        calls.append(call)
    return calls, False


def _json_values(body: str) -> list[Any]:
    """The JSON values at the start of ``body`` (separated by whitespace, ``,`` or ``;``), lists
    flattened. Trailing prose after at least one value is ignored; a truncated value raises."""
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(body) and body[pos] in " \t\r\n,;":
            pos += 1
        if pos == len(body):
            break
        if values and body[pos] not in "{[":
            break  # prose after the calls
        value, pos = _DECODER.raw_decode(body, pos)  # ValueError on bad or truncated JSON
        values.extend(value if isinstance(value, list) else [value])
    if not values:
        raise ValueError("no JSON value")
    return values


def _to_call(obj: Any) -> ToolCall | None:
    """``{"name", "arguments"|"parameters"}`` (optionally under ``"function"``) -> ToolCall, else None."""
    if not isinstance(obj, dict):
        return None
    call_id = obj.get("id") or ""
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    arguments = obj.get("arguments", obj.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(name=name, arguments=arguments, id=str(call_id))


def _template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages -> what HF chat templates expect: tool-call arguments as dicts, not JSON
    strings (vLLM's server does the same before rendering)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                    except ValueError:
                        pass  # leave it as text; the template renders it verbatim
                c["function"] = fn
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


class VLLMExecutor:
    """A local model run by vLLM in this process.

    Args:
        model: a Hugging Face model id or local path.
        tool_choice: recorded only (see the module docstring).
        temperature, max_tokens: sampling settings.
        llm_kwargs: passed to ``vllm.LLM`` (e.g. ``tensor_parallel_size``, ``max_model_len``,
            ``gpu_memory_utilization``).
    """

    name = "vllm"
    is_oracle = False

    def __init__(self, model: str, tool_choice: Any = "auto", temperature: float = 0.0, max_tokens: int = 512,
                 llm_kwargs: Mapping[str, Any] | None = None, **_: Any):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as e:
            raise ImportError(
                "the vllm executor needs vLLM installed: pip install 'tracer-toolret[vllm]' "
                "(or use executor=openai against `vllm serve`)"
            ) from e
        if not model:
            raise ValueError("VLLMExecutor needs a model (e.g. executor.model=Qwen/Qwen2.5-7B-Instruct)")
        self.model = model
        self.tool_choice = tool_choice
        self.tokenizer_name = model  # prompt tokens are counted by the model's own tokenizer
        self.llm = LLM(model=model, **dict(llm_kwargs or {}))
        self.sampling_params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        self._ids = itertools.count()
        self.n_requests = self.n_errors = self.n_malformed = 0
        self.prompt_tokens = self.completion_tokens = 0

    def _render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> dict:
        """A ``TokensPrompt``: the chat template's token ids (special tokens included by the template)."""
        tokenizer = self.llm.get_tokenizer()
        ids = tokenizer.apply_chat_template(_template_messages(messages),
                                            tools=[dict(t) for t in tools] or None,
                                            add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # tokenizers that return a BatchEncoding
            ids = ids["input_ids"]
        return {"prompt_token_ids": list(ids)}

    def _generate(self, prompts: list[dict]) -> list[tuple[str, int, int]]:
        """``(text, prompt tokens, completion tokens)`` per prompt, in order."""
        outputs = self.llm.generate(prompts, self.sampling_params, use_tqdm=False)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            results.append((completion.text, len(out.prompt_token_ids or ()),
                            len(completion.token_ids or ())))
        self.n_requests += len(results)
        self.prompt_tokens += sum(r[1] for r in results)
        self.completion_tokens += sum(r[2] for r in results)
        return results

    def choose(self, requests: Sequence[Request]) -> list[Decision]:
        requests = list(requests)
        if not requests:
            return []
        results = self._generate([self._render(r.messages, r.tools) for r in requests])
        decisions = []
        for request, (text, n_prompt, n_completion) in zip(requests, results):
            calls, malformed, content = split_tool_calls(text)
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n_completion}
            raw: dict[str, Any] = {"generated": text}
            if not calls:
                self.n_malformed += malformed
                decisions.append(Decision(call=None, text=content, malformed=malformed, raw=raw, **usage))
                continue
            raw["n_tool_calls"] = len(calls)
            if malformed:
                raw["malformed_tail"] = True  # a later call in the same message did not parse
            call = calls[0]
            if call.name not in {t["function"]["name"] for t in request.tools}:
                raw["not_presented"] = True
            if not call.id:
                call = ToolCall(name=call.name, arguments=call.arguments, id=f"call_{next(self._ids)}")
            decisions.append(Decision(call=call, text=content, raw=raw, **usage))
        return decisions

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> str:
        [(text, _, _)] = self._generate([self._render(messages, ())])
        return text.strip()
