"""Decoding an upstream answer's ``Content-Encoding`` for the conversation log, within a cap.

The gateway passes an answer to the client as the upstream sent it: compressed bytes stay compressed, with
their ``Content-Encoding`` (the client asked for it with its ``Accept-Encoding``; decoding would cost CPU on
every answer and change the bytes the client verifies). The log needs the assistant message, so it decodes a
copy (:class:`BodyDecoder`), fed as the body goes out.

- Codings: ``gzip`` (and ``x-gzip``), ``deflate`` (the zlib format RFC 9110 names, and the raw deflate some
  servers send instead, told apart by the zlib header as aiohttp and browsers do), ``identity``; several in
  one header (``gzip, deflate``) are undone in reverse order. Any other (``br``, ``zstd``, which the standard
  library cannot decode within a bound) leaves the answer undecoded: the log keeps the request without it.
- Bounded: at most ``limit`` decoded bytes in all (and out of each coding when there are several), each
  step asking zlib for no more than the room left (``max_length``), so a small body that inflates to
  gigabytes (a zip bomb) costs ``limit`` bytes of memory and the CPU to produce them, never more. Past the
  cap :attr:`BodyDecoder.over` is set and decoding stops. An identity body is not copied or capped here.
- A corrupt body sets :attr:`BodyDecoder.failed`; what was decoded before it stays.
"""

from __future__ import annotations

import zlib
from typing import Any

# wbits of zlib.decompressobj for each coding: 16 + 15 reads a gzip member, 15 a zlib stream, -15 raw deflate
_GZIP, _ZLIB, _RAW = 31, 15, -15
CODINGS = {"gzip": _GZIP, "x-gzip": _GZIP, "deflate": _ZLIB}


def codings(header: str | None) -> list[str] | None:
    """The codings of a ``Content-Encoding`` value in the order to undo them (last applied first), identity
    left out; None when one of them cannot be decoded here."""
    names = [c.strip().lower() for c in (header or "").split(",")]
    names = [c for c in names if c and c != "identity"]
    return None if any(c not in CODINGS for c in names) else names[::-1]


class _Inflater:
    """One coding, streamed: gzip members one after another, deflate as zlib or raw (by its first bytes)."""

    def __init__(self, coding: str):
        self.wbits = CODINGS[coding]
        self._z: Any = None if self.wbits == _ZLIB else zlib.decompressobj(self.wbits)
        self._head = b""  # deflate's first bytes, until the zlib header can be told from raw deflate

    def feed(self, data: bytes, room: int) -> bytes:
        """Up to ``room`` + 1 decoded bytes of ``data`` (one more than ``room`` says the cap was passed)."""
        if self._z is None:
            self._head += data
            if len(self._head) < 2:
                return b""
            data, self._head = self._head, b""
            zlib_header = data[0] & 0x0F == 8 and int.from_bytes(data[:2], "big") % 31 == 0
            self._z = zlib.decompressobj(_ZLIB if zlib_header else _RAW)
        out = self._z.decompress(data, room + 1)
        while len(out) <= room and self.wbits == _GZIP and self._z.eof and self._z.unused_data:
            rest, self._z = self._z.unused_data, zlib.decompressobj(_GZIP)  # the next gzip member
            out += self._z.decompress(rest, room + 1 - len(out))
        return out


class BodyDecoder:
    """A body's bytes as they come in, decoded (see the module docstring).

    Args:
        header: the answer's ``Content-Encoding`` (None: not encoded).
        limit: decoded bytes kept at most.
    """

    def __init__(self, header: str | None, limit: int):
        names = codings(header)
        self.supported = names is not None
        self._stages = [_Inflater(c) for c in names or ()]
        self.limit, self.size = limit, 0
        self.over = False    # more than ``limit`` bytes decoded: stopped
        self.failed = False  # a corrupt body: stopped

    @property
    def stopped(self) -> bool:
        """Nothing more will come out (an unknown coding, past the cap, or corrupt)."""
        return not self.supported or self.over or self.failed

    def feed(self, data: bytes) -> bytes:
        """The decoded bytes of ``data`` (b"" once stopped); an identity body passes as it is (nothing is
        inflated: no cap)."""
        if self.stopped:
            return b""
        if not self._stages:
            return data
        room = self.limit - self.size
        try:
            for stage in self._stages:  # each stage within the room (an inner one past it: over as well)
                data = stage.feed(data, room)
                if len(data) > room:
                    self.over = True
                    return b""
        except zlib.error:
            self.failed = True
            return b""
        self.size += len(data)
        return data


def decode_body(body: bytes, header: str | None, limit: int) -> bytes | None:
    """A whole body decoded (at most ``limit`` bytes); None when it cannot be (unknown coding, corrupt,
    over the cap)."""
    decoder = BodyDecoder(header, limit)
    out = decoder.feed(body)
    return None if decoder.stopped else out
