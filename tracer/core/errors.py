"""Errors for bad input: each names the file, the line or record id, and the field."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """Bad input data. The message always says where: file, line (or record id) and field."""

    def __init__(self, path: str | Path, problem: str, *, line: int | None = None, record: str | None = None,
                 field: str | None = None):
        self.path = str(path)
        self.problem = problem
        self.line = line
        self.record = record
        self.field = field
        where = self.path
        if line is not None:
            where += f", line {line}"
        if record is not None:
            where += f", record {record!r}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {problem}")
