"""The conversation log's files on disk, bounded: ``tools.json`` plus ``trajectories.jsonl`` and its rotated
segments, never more than ``max_bytes`` in all.

**Rotation.** When a line would take ``trajectories.jsonl`` past ``segment_bytes``, the file is renamed
``trajectories-NNNNNN.jsonl`` (the next number; a hard link then an unlink, so an existing segment is never
overwritten) and a new one is started. :func:`tracer.data.native.trajectory_files` reads the segments by
number, then ``trajectories.jsonl``: the write order. Segments are complete (a rename happens between
lines) and never written again, so an operator may archive or delete the ones ``tracer update`` applied
(the index's ledger makes re-reading them harmless, and deleting them frees the budget below).

**Bound.** A line that would take the directory's files (segments, ``trajectories.jsonl``, ``tools.json``)
past ``max_bytes`` is not written; the caller counts it. The sizes are re-read from disk before a line is
refused (at most once a second), so space an operator freed is used again.

**Durability.** A batch of lines is written, each by ``write`` calls on a file opened for appending, then
fsynced once; ``tools.json`` is replaced atomically before the first line that calls a tool it lacks. A
line torn by a crash (no newline at the end of ``trajectories.jsonl``) is cut off when the log opens.
One gateway writes a log directory.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tracer.core.io import atomic_write, fsync_dir
from tracer.data.native import SEGMENT, trajectory_files

log = logging.getLogger("tracer.serve")
RESCAN_S = 1.0


class LogFiles:
    """Appends lines to a log directory within ``max_bytes``, rotating ``trajectories.jsonl`` at
    ``segment_bytes``."""

    def __init__(self, directory: str | Path, max_bytes: int, segment_bytes: int):
        if not 0 < segment_bytes <= max_bytes:
            raise ValueError(f"log segment size {segment_bytes} must be positive and at most the log's size "
                             f"limit {max_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.active = self.directory / "trajectories.jsonl"
        self.max_bytes, self.segment_bytes = max_bytes, segment_bytes
        self._cut_torn_line()
        os.close(os.open(self.active, os.O_WRONLY | os.O_CREAT, 0o644))  # an empty log reads as empty
        self.tools: dict[str, dict] = self._read_tools()
        self.size = self._disk_size()
        self._scanned = time.monotonic()

    def write(self, lines: Sequence[tuple[bytes, Mapping[str, dict]]]) -> list[bool]:
        """Append each ``(line, schemas of the tools it calls)`` that fits; whether each was written."""
        written = []
        fd = os.open(self.active, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for line, calls in lines:
                new = {n: t for n, t in calls.items() if n not in self.tools}
                tools = self._tools_text(new) if new else None
                if not self._room(len(line) + (len(tools) - self._tools_size() if tools else 0)):
                    written.append(False)
                    continue
                if tools:
                    self._write_tools(new, tools)
                if os.fstat(fd).st_size and os.fstat(fd).st_size + len(line) > self.segment_bytes:
                    os.fsync(fd)
                    os.close(fd)
                    self._rotate()
                    fd = os.open(self.active, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                view = memoryview(line)
                while view:  # one line, one writer: a short write continues where it stopped
                    view = view[os.write(fd, view):]
                self.size += len(line)
                written.append(True)
            os.fsync(fd)
        finally:
            os.close(fd)
        return written

    # ---- the bound ---------------------------------------------------------------------------------
    def _room(self, n: int) -> bool:
        if self.size + n <= self.max_bytes:
            return True
        if time.monotonic() - self._scanned >= RESCAN_S:  # an operator may have removed applied segments
            self.size, self._scanned = self._disk_size(), time.monotonic()
        return self.size + n <= self.max_bytes

    def _disk_size(self) -> int:
        files = [*trajectory_files(self.directory), self.directory / "tools.json"]
        return sum(p.stat().st_size for p in files if p.exists())

    # ---- files -------------------------------------------------------------------------------------
    def _rotate(self) -> None:
        numbers = [int(m.group(1)) for p in self.directory.iterdir() if (m := SEGMENT.fullmatch(p.name))]
        n = max(numbers, default=0) + 1
        while True:
            try:
                os.link(self.active, self.directory / f"trajectories-{n:06d}.jsonl")
                break
            except FileExistsError:
                n += 1
        os.unlink(self.active)
        fsync_dir(self.directory)
        log.info("log rotated", extra={"event": "log_rotated", "segment": n, "path": str(self.directory)})

    def _tools_size(self) -> int:
        path = self.directory / "tools.json"
        return path.stat().st_size if path.exists() else 0

    def _tools_text(self, new: Mapping[str, dict]) -> bytes:
        return (json.dumps([*self.tools.values(), *new.values()], indent=1) + "\n").encode()

    def _write_tools(self, new: Mapping[str, dict], text: bytes) -> None:
        before = self._tools_size()
        atomic_write(self.directory / "tools.json", lambda f: f.write(text), fsync=True)
        self.tools.update(new)
        self.size += len(text) - before

    def _read_tools(self) -> dict[str, dict]:
        path = self.directory / "tools.json"
        if not path.exists():
            return {}
        try:
            tools = json.loads(path.read_bytes())
            return {t["function"]["name"]: t for t in tools}
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}: not the tools.json of a tracer log ({e}); "
                             "move it away or log to a new directory") from None

    def _cut_torn_line(self) -> None:
        """A crash during a write can leave a last line without its newline: cut it off (it is ours)."""
        if not self.active.exists() or self.active.stat().st_size == 0:
            return
        with open(self.active, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            data = self.active.read_bytes()
            f.truncate(data.rfind(b"\n") + 1)
        log.warning("cut a torn last line", extra={"event": "log_repaired", "path": str(self.active)})
