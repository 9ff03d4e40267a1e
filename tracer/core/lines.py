"""Reading a file of lines that a client or a log wrote, bounded: no line costs more than a cap, no file
blocks or never ends.

- **Regular files only.** The file is opened without blocking (``O_NONBLOCK``: a FIFO with no writer does
  not hang the open) and checked with ``fstat`` on the open descriptor (no swap between a check and the
  open): a device (``/dev/zero`` never ends), a FIFO or a socket is a :class:`DataError` naming it.
- **A cap per line.** A line is read with ``readline(cap + 1)``, so at most ``cap + 1`` bytes of it are ever
  held; a longer line is not materialised: the rest of it is read past in chunks of :data:`CHUNK` bytes
  and the reader yields ``None`` for it with its length, for the caller to report as ``file:line`` and skip.
  The length of a regular file bounds the time.

:data:`LOG_LINE_BYTES` is the gateway's ``--log-max-record-bytes`` default, the longest line it writes:
what ``tracer update`` accepts unless told otherwise (``--max-line-bytes``). A dataset (trusted, written once)
is read with the larger :data:`DATASET_LINE_BYTES`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from tracer.core.errors import DataError

LOG_LINE_BYTES = 1 << 20       # tracer serve's default --log-max-record-bytes: one written line
DATASET_LINE_BYTES = 64 << 20  # a dataset's line (one conversation), read by the dataset loaders
CHUNK = 1 << 16                # how an over-long line is read past
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


@contextmanager
def open_regular(path: str | Path) -> Iterator[BinaryIO]:
    """``with open_regular(path) as f:`` a regular file opened for binary reading; anything else (a device,
    a FIFO, a socket, a directory) is a :class:`DataError` naming it, and a missing file FileNotFoundError."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise DataError(path, "is a directory, not a file of lines") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise DataError(path, f"is {kind}: only a regular file is read (a device or a pipe may "
                                  "never end)")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def bounded_lines(f: BinaryIO, cap: int) -> Iterator[tuple[int, int, bytes | None, int]]:
    """``(line number, byte offset, raw line or None, its length in bytes)`` for every line of ``f`` (the
    newline included); a line longer than ``cap`` bytes comes as None, read past without being held."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"the line cap must be a positive int of bytes, got {cap!r}")
    lineno, offset = 0, 0
    while raw := f.readline(cap + 1):
        lineno += 1
        size = len(raw)
        if size > cap:
            while not raw.endswith(b"\n") and (raw := f.readline(CHUNK)):
                size += len(raw)
            yield lineno, offset, None, size
        else:
            yield lineno, offset, raw, size
        offset += size
