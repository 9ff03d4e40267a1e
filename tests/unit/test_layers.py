"""The package's layers, checked on the source: imports point down only, and no function imports tracer code;
and every module of the repository's code short enough to read in one sitting (a warning past
WARN_LINES, a failure past MAX_LINES).

A layer may import its own layer and any lower one; inside ``tracer/serve`` the same rule holds between its
parts (:data:`SERVE_LAYERS`). An import inside a function body that names a
``tracer`` module is how a cycle gets dodged, so it is refused everywhere (heavy optional third-party
packages may still be imported lazily). The length cap covers every tracked ``.py`` file under
``tracer/``, ``benchmarks/``, ``experiments/`` and ``tests/`` (``git ls-files``; every ``.py`` file there
outside a git checkout).
"""

from __future__ import annotations

import ast
import subprocess
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tracer"
# the folders of code whose modules are held to MAX_LINES
CODE = ("tracer", "benchmarks", "experiments", "tests")
# a module past WARN_LINES is worth a look (split by job where two jobs meet); past MAX_LINES it fails.
# Both sit well above where modules naturally end, so that the cap is never a reason to compress code.
WARN_LINES = 400
MAX_LINES = 600
# lowest first; one entry per layer, a layer is a set of top-level modules/packages of tracer
LAYERS: list[set[str]] = [
    {"core"},
    {"data", "encode", "memory", "executors", "models"},
    {"scorer_base"},
    {"learn"},
    {"scorers"},
    {"online", "envs"},
    {"eval", "jobs", "retriever", "build", "run_dir"},
    {"serve"},
    {"cli"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# the same rule one level down, inside tracer/serve: the modules both servers share, then the gateway's
# conversation log, then the two servers (``tracer serve`` and ``tracer mcp``)
SERVE_LAYERS: list[set[str]] = [
    {"bounded", "conversations", "reload", "selection"},
    {"log"},
    {"http", "mcp"},
]
SERVE_LEVEL = {name: i for i, layer in enumerate(SERVE_LAYERS) for name in layer}


def part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def tracer_imports(tree: ast.AST) -> list[tuple[ast.AST, str, bool]]:
    """(node, imported tracer module, inside a function) for every import of tracer code."""
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom) and child.level:
                raise AssertionError(f"relative import at line {child.lineno}: use absolute tracer imports")
            names = ([child.module] if isinstance(child, ast.ImportFrom) and child.module else
                     [a.name for a in child.names] if isinstance(child, ast.Import) else [])
            for name in names:
                if name == "tracer" or name.startswith("tracer."):
                    if isinstance(child, ast.ImportFrom) and name == "tracer":
                        out.extend((child, f"tracer.{a.name}", in_function) for a in child.names)
                    else:
                        out.append((child, name, in_function))
            visit(child, inside)

    visit(tree, False)
    return out


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_top_level_part_has_a_layer():
    parts = {part_of(p) for p in MODULES} - {"__init__"}
    assert parts <= set(LEVEL), f"modules outside every layer: {sorted(parts - set(LEVEL))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_and_sit_at_module_level(path):
    here = part_of(path)
    if here == "__init__":
        return
    problems = []
    for node, module, in_function in tracer_imports(ast.parse(path.read_text(), str(path))):
        target = module.split(".")[1] if "." in module else None
        if in_function:
            problems.append(f"line {node.lineno}: imports {module} inside a function")
        if target in LEVEL and LEVEL[target] > LEVEL[here]:
            problems.append(f"line {node.lineno}: {here} (layer {LEVEL[here]}) imports {module} "
                            f"(layer {LEVEL[target]})")
    assert not problems, "\n".join(problems)


SERVE = PACKAGE / "serve"
SERVE_MODULES = [p for p in MODULES if SERVE in p.parents and p != SERVE / "__init__.py"]


def serve_part(path: Path) -> str:
    return path.relative_to(SERVE).parts[0].removesuffix(".py")


def test_every_part_of_serve_has_a_layer():
    parts = {serve_part(p) for p in SERVE_MODULES}
    outside = sorted(parts - set(SERVE_LEVEL))
    assert not outside, f"parts of tracer/serve outside every layer: {outside}"


@pytest.mark.parametrize("path", SERVE_MODULES, ids=lambda p: str(p.relative_to(SERVE)))
def test_serve_imports_point_down(path):
    here = serve_part(path)
    problems = []
    for node, module, _ in tracer_imports(ast.parse(path.read_text(), str(path))):
        parts = module.split(".")
        if parts[:2] != ["tracer", "serve"] or len(parts) < 3:
            continue
        target = parts[2]
        if target in SERVE_LEVEL and SERVE_LEVEL[target] > SERVE_LEVEL[here]:
            problems.append(f"line {node.lineno}: serve/{here} (layer {SERVE_LEVEL[here]}) imports {module} "
                            f"(layer {SERVE_LEVEL[target]})")
    assert not problems, "\n".join(problems)


def code_modules() -> list[Path]:
    """Every tracked ``.py`` file under :data:`CODE` (outside a git checkout: every ``.py`` file there)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", *CODE], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for d in CODE for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(ROOT / name for name in listed if name.endswith(".py") and (ROOT / name).is_file())


def test_a_module_stays_readable_in_one_sitting():
    modules = code_modules()
    assert any(p.parent == PACKAGE for p in modules), f"no module of tracer/ found under {ROOT}"
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in modules}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    longish = {name: n for name, n in lines.items() if n > WARN_LINES}
    if longish:
        warnings.warn(f"modules over {WARN_LINES} lines (split by job?): {longish}", stacklevel=1)
