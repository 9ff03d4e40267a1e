"""A registry of up to ~100k real tools from public API catalogues, for the registry-scale benchmark.

    python -m benchmarks.catalogue --mirrors DIR      # writes data/catalogue/tools.jsonl (git-ignored)

``DIR`` holds git clones named ``owner+name`` (or ``owner+name/repo``, as the fetch tool leaves them) of the
repositories below; each is read at its ``HEAD`` with ``git show``, so a bare clone is enough. Sources, in
the order their tools are kept (a later tool whose name is taken is dropped); licenses in docs/data.md:

=========================================  ==========================================================
``bfcl_eval`` (installed)                  BFCL v4 function documents of every non-multi-turn category
``boto/botocore``                          AWS: every operation of each service's newest API version
``stackql/stackql-provider-registry``      OpenAPI operations of Azure, Google, Cloudflare, GitHub, ...
                                           (its ``aws`` provider left out: botocore has AWS)
``googleapis/googleapis``                  gRPC methods of Google's APIs with their doc comments
``fairyshine/Seal-Tools``                  4,076 generated tools (``tool.jsonl``)
``twilio/twilio-oai``                      Twilio's OpenAPI operations
``ShishirPatil/gorilla``                   APIBench: Hugging Face, TensorFlow Hub and Torch Hub models
``oracle/oci-python-sdk``                  Oracle Cloud: every client method with its docstring's summary
``aliyun/aliyun-openapi-meta``             Alibaba Cloud actions (no summary upstream: name, product and
                                           parameter names make the description)
=========================================  ==========================================================

A tool's description is its source's summary (HTML tags and Markdown links removed, at most
``MAX_DESC`` characters), its parameters the names, types and descriptions of its inputs. Names are made
OpenAI-valid (``[A-Za-z0-9_-]``, at most 64 characters; a long one keeps a hash suffix).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

from tracer.core.types import Registry, Tool
from tracer.data.base import Dataset
from tracer.data.pool import distractor_pool, pool_registry

OUT = Path("data/catalogue/tools.jsonl")
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


class Repo:
    """A mirrored repository read at HEAD."""

    def __init__(self, root: Path, slug: str):
        base = root / slug.replace("/", "+")
        self.git = base / "repo" if (base / "repo").exists() else base
        if not self.git.exists():
            raise FileNotFoundError(f"{base}: no mirror of {slug} (clone https://github.com/{slug} there)")
        self.slug = slug

    def files(self, prefix: str = "") -> list[str]:
        out = subprocess.run(["git", "-C", str(self.git), "ls-tree", "-r", "--name-only", "HEAD", prefix],
                             capture_output=True, text=True, check=True).stdout
        return out.split()

    def read(self, path: str) -> str | None:
        """A file's text, None when its blob is not in the mirror (a snapshot may leave large files out)."""
        r = subprocess.run(["git", "-C", str(self.git), "show", f"HEAD:{path}"], capture_output=True,
                           check=False)
        return r.stdout.decode("utf-8", "replace") if r.returncode == 0 else None

    def head(self) -> str:
        return subprocess.run(["git", "-C", str(self.git), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()


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


def botocore(repo: Repo) -> Iterator[dict]:
    newest: dict[str, str] = {}
    for f in repo.files("botocore/data"):
        if f.endswith("/service-2.json"):
            svc = f.split("/")[2]
            newest[svc] = max(newest.get(svc, f), f)
    for svc, f in sorted(newest.items()):
        d = json.loads(repo.read(f) or "{}")
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


def stackql(repo: Repo) -> Iterator[dict]:
    for f in repo.files("providers/src"):
        provider = f.split("/")[2]
        if "/services/" not in f or not f.endswith(".yaml") or provider == "aws":
            continue
        text = repo.read(f)
        if text is None:
            continue
        spec = yaml.load(text, Loader=yaml.CSafeLoader) or {}
        yield from openapi_ops(provider, f"{provider}_{Path(f).stem}", spec)


_RPC = re.compile(r"((?:^[ \t]*//[^\n]*\n)*)^[ \t]*rpc\s+(\w+)\s*\(\s*(?:stream\s+)?([\w.]+)", re.MULTILINE)


def googleapis(repo: Repo) -> Iterator[dict]:
    for f in repo.files("google"):
        if not f.endswith(".proto"):
            continue
        text = repo.read(f)
        if text is None or " rpc " not in text:
            continue
        pkg = re.search(r"^package\s+([\w.]+);", text, re.MULTILINE)
        short = (pkg.group(1) if pkg else "").replace("google.", "", 1).replace(".", "_")
        for m in _RPC.finditer(text):
            doc = " ".join(line.strip().lstrip("/").strip() for line in m.group(1).splitlines())
            yield tool("googleapis", tool_name(short, m.group(2)), doc, {"request": {"type": "object",
                                                                              "description": m.group(3)}})


def seal_tools(repo: Repo) -> Iterator[dict]:
    for line in (repo.read("Seal-Tools_Dataset/tool.jsonl") or "").splitlines():
        t = json.loads(line)
        yield tool("seal_tools", tool_name(t["api_name"]), t.get("api_description"), t.get("parameters"),
                   t.get("required"))


def twilio(repo: Repo) -> Iterator[dict]:
    for f in repo.files("spec/json"):
        if f.endswith(".json"):
            yield from openapi_ops("twilio", Path(f).stem, json.loads(repo.read(f) or "{}"))


def gorilla(repo: Repo) -> Iterator[dict]:
    for f in ("data/api/huggingface_api.jsonl", "data/api/tensorflowhub_api.jsonl",
              "data/api/torchhub_api.jsonl"):
        hub = Path(f).stem.removesuffix("_api")
        for line in (repo.read(f) or "").splitlines():
            t = json.loads(line)
            args = t.get("api_arguments")
            params = {str(k): {"type": "string"} for k in args} if isinstance(args, (dict, list)) else {}
            yield tool(f"apibench_{hub}", tool_name(hub, str(t.get("api_name"))),
                       f"{t.get('functionality', '')}. {t.get('description', '')}", params)


_OCI_DEF = re.compile(r'^    def ([a-z]\w*)\(self[^)]*\):\n        """\n(.*?)\n\s*\n(.*?)\n        :return',
                      re.MULTILINE | re.DOTALL)
_OCI_PARAM = re.compile(r":param (\w+) (\w+): \(required\)\n\s*(.*)")


def oci(repo: Repo) -> Iterator[dict]:
    for f in repo.files("src/oci"):
        if not f.endswith("_client.py") or f.endswith("composite_operations.py"):
            continue
        text = repo.read(f) or ""
        svc = f.split("/")[2]
        for m in _OCI_DEF.finditer(text):
            params = {n: {"type": t, "description": d} for t, n, d in _OCI_PARAM.findall(m.group(3))}
            yield tool("oci", tool_name("oci", svc, m.group(1)), m.group(2), params, list(params))


def _words(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)


def aliyun(repo: Repo) -> Iterator[dict]:
    """Alibaba Cloud actions: the metadata has no action summary, so the description is the action's name in
    words, its product, and its parameter names."""
    for f in repo.files("en-US"):
        if not f.endswith(".json"):
            continue
        d = json.loads(repo.read(f) or "{}")
        product, ps = f.split("/")[1], [p for p in d.get("parameters", []) if isinstance(p, dict)]
        params = {p["name"]: {"type": str(p.get("type", "string")).lower(),
                              "description": p.get("description", "")}
                  for p in ps if "name" in p}
        desc = (f"{_words(d.get('name', Path(f).stem))} ({product}). "
                f"Parameters: {', '.join(params) or 'none'}.")
        yield tool("aliyun", tool_name("aliyun", product, d.get("name", Path(f).stem)), desc, params,
                   [p["name"] for p in ps if p.get("required") and "name" in p])


SOURCES = (("boto/botocore", botocore), ("stackql/stackql-provider-registry", stackql),
           ("googleapis/googleapis", googleapis), ("fairyshine/Seal-Tools", seal_tools),
           ("twilio/twilio-oai", twilio), ("ShishirPatil/gorilla", gorilla),
           ("oracle/oci-python-sdk", oci), ("aliyun/aliyun-openapi-meta", aliyun))


def prepare(mirrors: Path, out: Path = OUT, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Write the catalogue (one OpenAI-format tool per line, with ``source``); returns tools per source.
    ``skip``: repositories (``owner/name``) to leave out."""
    unknown = set(skip) - {slug for slug, _ in SOURCES}
    if unknown:
        raise ValueError(f"--skip {', '.join(sorted(unknown))}: not a source "
                         f"({', '.join(s for s, _ in SOURCES)})")
    # every mirror checked before any work
    repos = [(Repo(mirrors, slug), fn) for slug, fn in SOURCES if slug not in skip]
    seen: set[str] = set()
    counts: dict[str, int] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w") as fh:
        streams = [("bfcl_eval", bfcl_docs())] + [(f"{r.slug}@{r.head()[:12]}", fn(r)) for r, fn in repos]
        for label, stream in streams:
            for t in stream:
                if t["name"] in seen or not t["description"]:
                    continue
                seen.add(t["name"])
                counts[label] = counts.get(label, 0) + 1
                fh.write(json.dumps(t) + "\n")
            print(f"{label}: {counts.get(label, 0)} tools", flush=True)
    tmp.replace(out)
    return counts


def load_catalogue(path: Path = OUT) -> list[Tool]:
    """The prepared catalogue's tools, in file order."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: run `python -m benchmarks.catalogue --mirrors DIR` first")
    tools = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        t = json.loads(line)
        try:
            tools.append(Tool(t["name"], t["description"], t["parameters"], t["source"]))
        except KeyError as e:
            raise ValueError(f"{path}:{i}: missing field {e}") from None
    return tools


def with_distractors(registry: Registry, catalogue: list[Tool], size: int | None, seed: int = 0) -> Registry:
    """``registry`` grown to ``size`` tools by catalogue tools in a seeded order (nested: a smaller size is a
    prefix of a larger one); names already taken are skipped; ``None``: every catalogue tool."""
    ds = Dataset("catalogue", registry, ())
    source = Dataset("catalogue", Registry(catalogue), ())
    if size is None:
        size = len(registry) + len(distractor_pool(registry, [source]))
    return pool_registry(ds, size, [source], seed).registry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirrors", type=Path, required=True, help="folder of owner+name git clones")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--skip", nargs="*", default=[], help="sources (owner/name) to leave out")
    args = ap.parse_args()
    counts = prepare(args.mirrors, args.out, tuple(args.skip))
    print(f"{sum(counts.values())} tools -> {args.out}")


if __name__ == "__main__":
    main()
