"""What every corpus reader shares: :class:`Example`, :class:`Clone` (a git clone read at ``HEAD``) and the
helpers that clip a text, reduce a parameters schema and read JSON or JSON lines naming the file on error."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tracer.core.errors import DataError
from tracer.core.types import Tool
from tracer.data.native import json_line

MAX_DESC = 400
_WS = re.compile(r"\s+")


@dataclass(frozen=True)
class Example:
    """One request of a corpus: the user's words, the tools a correct answer calls (at least one), in the
    order it calls them."""

    query: str
    golds: tuple[Tool, ...]
    corpus: str
    id: str


def clone_dir(mirrors: str | Path, slug: str) -> Path:
    """Where :class:`Clone` looks for ``owner/name``'s clone: ``mirrors/owner+name``."""
    return Path(mirrors) / slug.replace("/", "+")


def clone_command(mirrors: str | Path, slug: str) -> str:
    """The command that puts ``slug``'s clone where :class:`Clone` looks for it."""
    return f"git clone https://github.com/{slug} {clone_dir(mirrors, slug)}"


def require_clones(slugs: Iterable[str], mirrors: str | Path) -> None:
    """A DataError naming every clone of ``slugs`` missing under ``mirrors``, with the commands that make
    them, before any of them is read."""
    missing = [s for s in dict.fromkeys(slugs) if not clone_dir(mirrors, s).is_dir()]
    if missing:
        run = "; ".join(clone_command(mirrors, s) for s in missing)
        raise DataError(Path(mirrors), f"no clone of {', '.join(missing)} (point paths.mirrors or "
                        f"TRACER_MIRRORS at them, or run: {run})")


class Clone:
    """A git clone under ``mirrors`` (a checkout or a bare repository), read at ``HEAD`` with git."""

    def __init__(self, mirrors: str | Path, slug: str):
        base = clone_dir(mirrors, slug)
        self.root = base / "repo" if (base / "repo").is_dir() else base
        if not self.root.is_dir():
            raise DataError(base, f"no clone of {slug} ({clone_command(mirrors, slug)})")
        self.slug = slug

    def _git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, check=check)

    def read(self, path: str) -> bytes | None:
        """A file's bytes; None where the clone lacks it (a snapshot may leave large files out)."""
        r = self._git("show", f"HEAD:{path}", check=False)
        return r.stdout if r.returncode == 0 else None

    def text(self, path: str) -> str | None:
        """A file's text (undecodable bytes replaced), None as :meth:`read`."""
        data = self.read(path)
        return None if data is None else data.decode("utf-8", "replace")

    def json(self, path: str, default: object = None) -> object:
        """A JSON file's value; ``default`` where the clone lacks it (or it is empty); a DataError naming
        it if it is not JSON."""
        text = self.text(path)
        if not text:
            return default
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(self.root / path, f"not JSON: {e}") from None

    def files(self, prefix: str = "") -> list[str]:
        """The paths at ``HEAD`` under ``prefix``."""
        under = [prefix] if prefix else []  # git refuses an empty path
        return self._git("ls-tree", "-r", "--name-only", "HEAD", *under).stdout.decode().split()

    def head(self) -> str:
        return self._git("rev-parse", "HEAD").stdout.decode().strip()


def clip(value: object) -> str:
    """A text with its whitespace folded, clipped to :data:`MAX_DESC` characters."""
    return _WS.sub(" ", str(value or "")).strip()[:MAX_DESC]


def schema(value: object) -> dict:
    """A parameters schema's top-level properties, each kept to its description (clipped as descriptions
    are): what a tool's ``parameters`` rendering reads (:mod:`tracer.core.tool_text`)."""
    props = value.get("properties") if isinstance(value, dict) else None
    return {"type": "object", "properties": {
        str(k): {"description": clip(p.get("description") if isinstance(p, dict) else "")}
        for k, p in (props if isinstance(props, dict) else {}).items()}}


def json_lines(data: bytes | None, where: str | Path) -> Iterator[dict]:
    """The objects of a JSON-lines file (bytes); a bad line is a DataError naming ``where`` and the line."""
    start = 0
    for i, raw in enumerate((data or b"").split(b"\n"), 1):
        if (row := json_line(where, raw, i, start)) is not None:
            yield row
        start += len(raw) + 1


def malformed(where: Path, what: str, e: Exception) -> DataError:
    return DataError(where, f"{what}: malformed ({type(e).__name__}: {e})")
