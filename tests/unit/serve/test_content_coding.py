"""Decoding an answer's Content-Encoding for the log (tracer/serve/log/content_coding.py) against the standard
library's own compressors, fed whole and a byte at a time, and bounded against a zip bomb; the incremental
SSE reading of a stream that goes out (tracer/serve/log/stream_reply.py) against the whole-stream one."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib

import pytest

from tracer.serve.log.content_coding import BodyDecoder, decode_body
from tracer.serve.log.stream_reply import SseEvents, StreamCopy, sse_data

TEXT = json.dumps({"choices": [{"message": {"role": "assistant", "content": "é" * 3000}}]}).encode()


def deflate(data: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(wbits=wbits)
    return packer.compress(data) + packer.flush()


ENCODED = {
    "gzip": gzip.compress(TEXT),
    "x-gzip": gzip.compress(TEXT),
    "deflate": deflate(TEXT, 15),                     # RFC 9110's deflate: the zlib format
    "Deflate ": deflate(TEXT, -15),                   # raw deflate, as some servers send it
    "identity": TEXT,
    "gzip, deflate": deflate(gzip.compress(TEXT), 15),  # applied in order: undone in reverse
}


@pytest.mark.parametrize("header", list(ENCODED))
def test_each_coding_decodes_whole_and_byte_by_byte(header):
    body = ENCODED[header]
    assert decode_body(body, header, 1 << 20) == TEXT
    decoder = BodyDecoder(header, 1 << 20)
    assert b"".join(decoder.feed(body[i:i + 1]) for i in range(len(body))) == TEXT and not decoder.stopped


def test_gzip_members_one_after_another_decode_as_one_body():
    assert decode_body(gzip.compress(TEXT[:100]) + gzip.compress(TEXT[100:]), "gzip", 1 << 20) == TEXT


def test_a_zip_bomb_costs_the_cap_not_its_size():
    packer = zlib.compressobj(9, wbits=31)
    zeros = b"\0" * (1 << 20)
    bomb = b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()  # 256 MiB in ~250 KB
    t0 = time.perf_counter()
    decoder = BodyDecoder("gzip", 1 << 20)
    out = sum(len(decoder.feed(bomb[i:i + 65536])) for i in range(0, len(bomb), 65536))
    assert decoder.over and out <= 1 << 20 and decoder.size <= 1 << 20
    assert time.perf_counter() - t0 < 1.0  # stopped at the cap (the whole 256 MiB take seconds)
    assert decode_body(bomb, "gzip", 1 << 20) is None


@pytest.mark.parametrize("header, body", [("br", b"\x8b\x02\x80hi\x03"), ("zstd", b"x"),
                                          ("gzip", b"not gzip")])
def test_a_coding_not_decoded_here_or_a_corrupt_body_is_no_body(header, body):
    assert decode_body(body, header, 1 << 20) is None


# ---- the stream as it goes out ------------------------------------------------------------------------
HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def events(*deltas: dict, finish: str | None = "stop", done: bool = True) -> bytes:
    chunks = [{**HEAD, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    if finish:
        chunks.append({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    return out + (b"data: [DONE]\r\n\r\n" if done else b"")


def test_events_split_incrementally_as_the_whole_stream_splits():
    stream = b": ping\r\n\r\n" + events({"content": "a\rb"}, {"content": "c"}) + b"data: x\rdata: y\r\r"
    whole = list(sse_data(stream))
    for step in (1, 2, 3, 7):
        reader = SseEvents(1 << 20)
        assert [d for i in range(0, len(stream), step) for d in reader.feed(stream[i:i + step])] == whole
    assert whole[-1] == b"x\ny" and len(whole) == 5
    small = SseEvents(40)  # an event over the cap is skipped whole, the next one still read
    assert list(small.feed(b"data: " + b"z" * 50 + b"\n\ndata: [DONE]\n\n")) == [b"[DONE]"]


async def _handed(copy: StreamCopy, parts: list[bytes], take: int) -> list[bool]:
    """A server that hands ``take`` chunks to its client, then the client is gone (the stream closed)."""
    ended: list[bool] = []

    async def source():
        for p in parts:
            yield p

    stream = copy.tee(source(), ended.append)
    for _ in range(take):
        await anext(stream)
    if take < len(parts):
        await anext(stream)          # the server comes back for more: the last chunk went out
        await stream.aclose()        # and the client is gone
    else:
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
    return ended


@pytest.mark.parametrize("coding", [None, "gzip"])
def test_a_stream_is_whole_once_done_went_out_whatever_follows(coding):
    body = events({"role": "assistant", "content": "hi"})
    if coding:
        packer = zlib.compressobj(wbits=31)
        parts = [packer.compress(body) + packer.flush(zlib.Z_SYNC_FLUSH), packer.flush()]
    else:
        parts = [body, b""]
    copy = StreamCopy(1 << 20, coding)
    assert asyncio.run(_handed(copy, parts, 1)) == [True]  # closed after [DONE], before the body's end
    assert copy.reply() == {"role": "assistant", "content": "hi"}
    cut = StreamCopy(1 << 20)
    half = body.index(b"data: [DONE]")
    assert asyncio.run(_handed(cut, [body[:half], body[half:]], 1)) == [False]  # gone before [DONE]
    assert cut.reply() is None


def test_a_finish_reason_needs_the_upstream_body_to_end_by_itself():
    body = events({"content": "hi"}, done=False)
    whole = StreamCopy(1 << 20)
    assert asyncio.run(_handed(whole, [body], 1)) == [True] and whole.reply()["content"] == "hi"
    cut = StreamCopy(1 << 20)
    assert asyncio.run(_handed(cut, [body, b": more"], 1)) == [False]
