"""The sources of the public tool catalogue (:mod:`benchmarks.catalogue`, whose docstring lists them): a
reader per mirrored repository, each yielding OpenAI-format tools with ``source``, in ``SOURCES`` order, and
the helpers they share (a mirror read at ``HEAD``, names made OpenAI-valid, descriptions cleaned)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from tracer.data.corpora import Clone

MAX_DESC = 400
_TAG, _LINK, _WS = re.compile(r"<[^>]+>"), re.compile(r"\[([^\]]*)\]\([^)]*\)"), re.compile(r"\s+")
_BAD = re.compile(r"[^A-Za-z0-9_-]+")


def clean(text: object) -> str:
    text = _LINK.sub(r"\1", _TAG.sub(" ", str(text or "")))
    return _WS.sub(" ", text).strip()[:MAX_DESC]


def tool_name(*parts: str) -> str:
    name = _BAD.sub("_", "_".join(p for p in parts if p)).strip("_")
    if len(name) > 64:
        name = name[:55] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return name


def tool(source: str, name: str, desc: object, params: dict | None = None,
         required: list | None = None) -> dict:
    props = {str(k): {"type": str(v.get("type", "string")), "description": clean(v.get("description"))[:120]}
             for k, v in (params or {}).items() if isinstance(v, dict)}
    return {"name": name, "description": clean(desc), "source": source,
            "parameters": {"type": "object", "properties": props, "required": list(required or [])}}


# ---- sources ---------------------------------------------------------------------------------------
def bfcl_docs() -> Iterator[dict]:
    from tracer.data.bfcl import data_dir
    for path in sorted(data_dir().glob("BFCL_v4_*.json")):
        if any(s in path.name for s in ("multi_turn", "memory", "web_search", "format_sensitivity")):
            continue
        for line in path.read_text().splitlines():
            for fn in json.loads(line).get("function", []):
                p = fn.get("parameters") or {}
                yield tool("bfcl", tool_name(fn["name"].replace(".", "_")), fn.get("description"),
                           p.get("properties"), p.get("required"))


def botocore(repo: Clone) -> Iterator[dict]:
    newest: dict[str, str] = {}
    for f in repo.files("botocore/data"):
        if f.endswith("/service-2.json"):
            svc = f.split("/")[2]
            newest[svc] = max(newest.get(svc, f), f)
    for svc, f in sorted(newest.items()):
        d = json.loads(repo.text(f) or "{}")
        shapes = d.get("shapes", {})
        for op, spec in d.get("operations", {}).items():
            members = shapes.get(spec.get("input", {}).get("shape", ""), {})
            params = {k: {"type": shapes.get(v.get("shape", ""), {}).get("type", "string"),
                          "description": v.get("documentation", "")}
                      for k, v in members.get("members", {}).items()}
            yield tool("aws", tool_name("aws", svc, op), spec.get("documentation"), params,
                       members.get("required"))


def openapi_ops(source: str, prefix: str, spec: dict) -> Iterator[dict]:
    for path, item in (spec.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        for method, op in item.items():
            if method not in ("get", "put", "post", "delete", "patch") or not isinstance(op, dict):
                continue
            op_id = op.get("operationId") or f"{method}_{path}"
            params = {p["name"]: {"type": (p.get("schema") or {}).get("type", "string"),
                                  "description": p.get("description", "")}
                      for p in op.get("parameters", []) if isinstance(p, dict) and "name" in p}
            yield tool(source, tool_name(prefix, op_id), op.get("summary") or op.get("description"), params)


def stackql(repo: Clone) -> Iterator[dict]:
    for f in repo.files("providers/src"):
        provider = f.split("/")[2]
        if "/services/" not in f or not f.endswith(".yaml") or provider == "aws":
            continue
        text = repo.text(f)
        if text is None:
            continue
        spec = yaml.load(text, Loader=yaml.CSafeLoader) or {}
        yield from openapi_ops(provider, f"{provider}_{Path(f).stem}", spec)


_RPC = re.compile(r"((?:^[ \t]*//[^\n]*\n)*)^[ \t]*rpc\s+(\w+)\s*\(\s*(?:stream\s+)?([\w.]+)", re.MULTILINE)


def googleapis(repo: Clone) -> Iterator[dict]:
    for f in repo.files("google"):
        if not f.endswith(".proto"):
            continue
        text = repo.text(f)
        if text is None or " rpc " not in text:
            continue
        pkg = re.search(r"^package\s+([\w.]+);", text, re.MULTILINE)
        short = (pkg.group(1) if pkg else "").replace("google.", "", 1).replace(".", "_")
        for m in _RPC.finditer(text):
            doc = " ".join(line.strip().lstrip("/").strip() for line in m.group(1).splitlines())
            yield tool("googleapis", tool_name(short, m.group(2)), doc, {"request": {"type": "object",
                                                                              "description": m.group(3)}})


def seal_tools(repo: Clone) -> Iterator[dict]:
    for line in (repo.text("Seal-Tools_Dataset/tool.jsonl") or "").splitlines():
        t = json.loads(line)
        yield tool("seal_tools", tool_name(t["api_name"]), t.get("api_description"), t.get("parameters"),
                   t.get("required"))


def twilio(repo: Clone) -> Iterator[dict]:
    for f in repo.files("spec/json"):
        if f.endswith(".json"):
            yield from openapi_ops("twilio", Path(f).stem, json.loads(repo.text(f) or "{}"))


def gorilla(repo: Clone) -> Iterator[dict]:
    for f in ("data/api/huggingface_api.jsonl", "data/api/tensorflowhub_api.jsonl",
              "data/api/torchhub_api.jsonl"):
        hub = Path(f).stem.removesuffix("_api")
        for line in (repo.text(f) or "").splitlines():
            t = json.loads(line)
            args = t.get("api_arguments")
            params = {str(k): {"type": "string"} for k in args} if isinstance(args, (dict, list)) else {}
            yield tool(f"apibench_{hub}", tool_name(hub, str(t.get("api_name"))),
                       f"{t.get('functionality', '')}. {t.get('description', '')}", params)


_OCI_DEF = re.compile(r'^    def ([a-z]\w*)\(self[^)]*\):\n        """\n(.*?)\n\s*\n(.*?)\n        :return',
                      re.MULTILINE | re.DOTALL)
_OCI_PARAM = re.compile(r":param (\w+) (\w+): \(required\)\n\s*(.*)")


def oci(repo: Clone) -> Iterator[dict]:
    for f in repo.files("src/oci"):
        if not f.endswith("_client.py") or f.endswith("composite_operations.py"):
            continue
        text = repo.text(f) or ""
        svc = f.split("/")[2]
        for m in _OCI_DEF.finditer(text):
            params = {n: {"type": t, "description": d} for t, n, d in _OCI_PARAM.findall(m.group(3))}
            yield tool("oci", tool_name("oci", svc, m.group(1)), m.group(2), params, list(params))


def _words(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)


def aliyun(repo: Clone) -> Iterator[dict]:
    """Alibaba Cloud actions: the metadata has no action summary, so the description is the action's name in
    words, its product, and its parameter names."""
    for f in repo.files("en-US"):
        if not f.endswith(".json"):
            continue
        d = json.loads(repo.text(f) or "{}")
        product, ps = f.split("/")[1], [p for p in d.get("parameters", []) if isinstance(p, dict)]
        params = {p["name"]: {"type": str(p.get("type", "string")).lower(),
                              "description": p.get("description", "")}
                  for p in ps if "name" in p}
        desc = (f"{_words(d.get('name', Path(f).stem))} ({product}). "
                f"Parameters: {', '.join(params) or 'none'}.")
        yield tool("aliyun", tool_name("aliyun", product, d.get("name", Path(f).stem)), desc, params,
                   [p["name"] for p in ps if p.get("required") and "name" in p])


_TC_DEF = re.compile(r'^    def (\w+)\(self, request[^)]*\):\n        r"""(.*?)"""', re.MULTILINE | re.DOTALL)
_TC_REQUEST = re.compile(r"^class (\w+)Request\(AbstractModel\):\n(.*?)(?=^class |\Z)",
                         re.MULTILINE | re.DOTALL)
_TC_INIT = re.compile(r'def __init__\(self\):\n\s*r"""(.*?)"""', re.DOTALL)
_TC_PARAM = re.compile(r":param _?(\w+):(.*?)\n\s*:type \1: ([^\n]*)", re.DOTALL)
_TC_TYPES = {"str": "string", "int": "integer", "bool": "boolean", "float": "number"}


def _tc_params(request_class: str) -> dict:
    """A request model's parameters from its ``__init__`` docstring's ``:param``/``:type`` lines."""
    init = _TC_INIT.search(request_class)
    return {n: {"type": "array" if t.startswith("list of") else _TC_TYPES.get(t.strip(), "object"),
                "description": d} for n, d, t in _TC_PARAM.findall(init.group(1) if init else "")}


def tencentcloud(repo: Clone) -> Iterator[dict]:
    """Tencent Cloud actions: every client method of each product's newest API version (``vYYYYMMDD``), its
    docstring's first paragraph, and the parameters of its request model (``models.py``)."""
    newest: dict[str, str] = {}
    for f in repo.files("tencentcloud"):
        parts = f.split("/")
        if len(parts) == 4 and parts[3] == f"{parts[1]}_client.py":
            newest[parts[1]] = max(newest.get(parts[1], f), f)
    for product, f in sorted(newest.items()):
        models = repo.text(f.rsplit("/", 1)[0] + "/models.py") or ""
        requests = {m.group(1): m.group(2) for m in _TC_REQUEST.finditer(models)}
        for m in _TC_DEF.finditer(repo.text(f) or ""):
            summary = re.split(r"\n\s*\n", m.group(2).split(":param request:")[0].strip())[0]
            yield tool("tencentcloud", tool_name("tencent", product, m.group(1)), summary,
                       _tc_params(requests.get(m.group(1), "")))


SOURCES = (("boto/botocore", botocore), ("stackql/stackql-provider-registry", stackql),
           ("googleapis/googleapis", googleapis), ("fairyshine/Seal-Tools", seal_tools),
           ("twilio/twilio-oai", twilio), ("ShishirPatil/gorilla", gorilla),
           ("oracle/oci-python-sdk", oci), ("aliyun/aliyun-openapi-meta", aliyun),
           ("TencentCloud/tencentcloud-sdk-python-intl-en", tencentcloud))
