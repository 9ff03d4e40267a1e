"""Replicated serving: two ``tracer serve`` processes serve one index directory while one writer (``tracer
update``, a real process) publishes a new snapshot under client load. No request fails; every answer was
chosen by one whole snapshot, the one its ``X-Tracer-Index`` header names (the tools the upstream received are
exactly what that snapshot selects); each replica serves the new snapshot within two poll intervals of its
publication and never goes back.

Real components: uvicorn in two processes, the official ``openai`` client, the stub upstream on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from builders import ROOT
from gateway_harness import save_test_index
from stub_openai_server import StubOpenAIServer

from tracer.core.store import current_snapshot
from tracer.data import load_native
from tracer.retriever import Retriever

POLL_S = 2.0
K = 2
TOOLS = [t.to_openai() for t in load_native(ROOT / "data" / "example").registry]


def conversation(*calls: str, request: str) -> list[dict]:
    msgs = [{"role": "user", "content": request}]
    for i, name in enumerate(calls):
        msgs += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"},
        ]
    return msgs


PROBES = [
    conversation("list_files", request="Show my files"),
    conversation("get_weather", request="What's the weather in Oslo? Then tell Ann."),
    conversation(request="Find a flight from SFO to JFK and book it"),
    conversation("search_flights", request="Find a flight from SFO to JFK and book it"),
]


def echo_presented(body: dict) -> dict:
    """The upstream's answer: the names of the tools it was given, in order."""
    return {
        "content": json.dumps([t["function"]["name"] for t in body.get("tools") or []]),
        "tool_calls": None,
    }


def learned_log(path: Path) -> Path:
    """Logged trajectories that change what follows list_files and get_weather (the update's effect)."""
    lines = []
    for i in range(6):
        msgs = (
            conversation("list_files", "cancel_booking", request="Clean up my files and bookings")
            + conversation("get_weather", "cancel_booking", request="Rain? Cancel my trip")[1:]
        )
        lines.append(
            json.dumps(
                {"id": f"log{i}", "group": f"log{i}", "domain": "tiny", "messages": msgs, "success": True}
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # three processes and polls for seconds: make test-all
def test_two_replicas_serve_one_index_and_pick_up_a_writers_snapshot_whole(tmp_path, minilm):
    index = save_test_index(tmp_path / "index", minilm)
    first = current_snapshot(index)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    answers: list[
        tuple[int, float, int, str, int, list[str]]
    ] = []  # replica, time, status, version, probe, tools
    stop = threading.Event()
    with StubOpenAIServer(policy=echo_presented) as stub:
        ports = [free_port(), free_port()]
        logs = [(tmp_path / f"replica{i}.log").open("w") for i in range(2)]  # a pipe nobody reads would fill
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tracer.cli",
                    "serve",
                    "--index",
                    str(index),
                    "--port",
                    str(p),
                    "--k",
                    str(K),
                    "--no-sticky",
                    "--upstream",
                    stub.url,
                    "--reload-interval",
                    str(POLL_S),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            for p, log in zip(ports, logs)
        ]
        try:
            for proc, port in zip(procs, ports):
                deadline = time.monotonic() + 120
                while True:
                    assert proc.poll() is None, (tmp_path / f"replica{ports.index(port)}.log").read_text()
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        assert time.monotonic() < deadline, "a replica did not start"
                        time.sleep(0.2)
            clients = [
                openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="k", max_retries=0) for p in ports
            ]

            def load(worker: int) -> None:  # round robin over the replicas, a new conversation each request
                n = worker
                while not stop.is_set():
                    replica, probe = n % 2, n % len(PROBES)
                    raw = clients[replica].chat.completions.with_raw_response.create(
                        model="m",
                        messages=PROBES[probe],
                        tools=TOOLS,
                        extra_headers={"X-Tracer-Conversation": f"w{worker}-{n}"},
                    )
                    answers.append(
                        (
                            replica,
                            time.time(),
                            raw.status_code,
                            raw.headers.get("x-tracer-index"),
                            probe,
                            json.loads(raw.parse().choices[0].message.content),
                        )
                    )
                    n += 2

            workers = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(2)]
            for w in workers:
                w.start()
            time.sleep(POLL_S)
            update = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tracer.cli",
                    "update",
                    "--index",
                    str(index),
                    "--log",
                    str(learned_log(tmp_path / "log.jsonl")),
                ],
                check=False,
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert update.returncode == 0, update.stderr[-3000:]
            published = (index / "CURRENT").stat().st_mtime
            second = current_snapshot(index)
            deadline = time.monotonic() + 6 * POLL_S
            while {
                httpx.get(f"http://127.0.0.1:{p}/health", timeout=30).json()["version"] for p in ports
            } != {f"snapshots/{second}"}:
                assert time.monotonic() < deadline, "a replica never loaded the new snapshot"
                time.sleep(0.1)
            time.sleep(POLL_S / 2)
        finally:
            stop.set()
            for proc in procs:
                proc.terminate()
            for proc, log in zip(procs, logs):
                proc.wait(timeout=60)
                log.close()

    # what each snapshot selects, loaded here on its own
    expected = {}
    for sid in (first, second):
        r = Retriever.load(index / "snapshots" / sid, device="cpu")
        expected[f"snapshots/{sid}"] = [[r.registry[i].name for i in r.select_ids(m, K)] for m in PROBES]
    assert expected[f"snapshots/{first}"] != expected[f"snapshots/{second}"]  # the update changed answers
    assert answers and all(status == 200 for _, _, status, _, _, _ in answers)
    assert all(tools == expected[version][probe] for _, _, _, version, probe, tools in answers)
    for replica in (0, 1):
        mine = sorted((t, v) for r, t, _, v, _, _ in answers if r == replica)
        versions = [v for _, v in mine]
        assert versions[0] == f"snapshots/{first}" and versions[-1] == f"snapshots/{second}"
        switched = versions.index(f"snapshots/{second}")
        assert f"snapshots/{first}" not in versions[switched:]  # never back to the old one
        # the first answer from the new snapshot came within two poll intervals of its publication
        assert mine[switched][0] - published <= 2 * POLL_S, (replica, mine[switched][0] - published)
