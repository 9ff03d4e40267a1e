"""Soak of ``tracer serve --log`` on loopback: mixed traffic for minutes, then ``tracer update`` twice.

    python -m benchmarks.soak_gateway                                # 10 minutes, 16 clients -> outputs/soak/
    python -m benchmarks.soak_gateway --minutes 1 --clients 4 --out /tmp/soak   # a short check of the script

This file starts the processes: itself as the stub upstream (``--role stub``), the gateway, and itself again
to build the index (``--role build``) and to check the updated one (``--role check``). The parts are in the
package ``benchmarks/soak/``, whose docstring says what the run does, what it counts and what it writes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.loopback import free_port, wait_ready
from benchmarks.soak.constants import DATA, ROOT, MiB
from benchmarks.soak.index import build_index, check_index, index_key
from benchmarks.soak.load import Soak
from benchmarks.soak.mcp_load import McpLoad, write_config
from benchmarks.soak.readings import help_flags
from benchmarks.soak.report import markdown
from benchmarks.soak.results import analyze_log, result, run_update, source
from benchmarks.soak.stub import stub_app
from benchmarks.soak.traffic import KINDS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("soak", "stub", "build", "check"), default="soak")
    p.add_argument("--port", type=int, default=0, help="(--role stub)")
    p.add_argument("--index", type=Path, default=None, help="(--role build/check) the index directory")
    p.add_argument("--original", type=Path, default=None, help="(--role check) the index before the update")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--tenants", type=int, default=4,
                   help="API keys the clients share out (client i: tenant i mod N), each reusing the same "
                        "X-Tracer-Conversation ids 1, 2, ...; 0: one key, ids unique per episode")
    p.add_argument("--mcp-clients", type=int, default=4,
                   help="MCP SDK clients against tracer mcp --transport http meanwhile, half of them in the "
                        "legacy handshake mode (0: no tracer mcp)")
    p.add_argument("--think-ms", type=float, default=250.0, help="mean pause of an agent between requests")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-presented", type=int, default=None, help="passed to the gateway (default: its 4 k)")
    p.add_argument("--max-body-bytes", type=int, default=8 * MiB, help="passed to the gateway")
    p.add_argument("--log-idle", type=float, default=120.0,
                   help="passed to the gateway: idle conversations end")
    p.add_argument("--extra-tools", type=int, default=30,
                   help="tools of each agent's own beside the index's 6")
    p.add_argument("--scorer", default="tracer_plus", choices=("tracer_plus", "tracer_fixed", "tracer"))
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=60.0, help="seconds excluded from the slope (a third of a "
                                                               "shorter run)")
    p.add_argument("--max-episodes", type=int, default=100_000, help="per client (a bound beside the time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", type=lambda s: s.split(","), default=None,
                   help="only these episode kinds, comma-separated "
                        "(a check of the script; default: all, weighted)")
    p.add_argument("--gateway-log-level", default="warning")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="an extra argument for tracer serve (repeat), e.g. --gateway-arg=--no-sticky")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "soak")  # gitignored: no doc quotes it
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (index, log, cache)")
    args = p.parse_args()

    if args.role == "stub":
        import uvicorn

        uvicorn.run(stub_app(), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                    timeout_keep_alive=75)
        return 0
    if args.role == "build":
        build_index(args.index, args.scorer)
        return 0
    if args.role == "check":
        print(json.dumps(check_index(args.index, args.original)))
        return 0
    if not 0.05 <= args.minutes <= 120 or not 1 <= args.clients <= 256:
        p.error("--minutes in [0.05, 120], --clients in [1, 256]")
    if not 0 <= args.mcp_clients <= 64:
        p.error("--mcp-clients in [0, 64]")
    if not 0 <= args.tenants <= 8:
        p.error("--tenants in [0, 8]")
    if args.extra_tools > 60:
        p.error("--extra-tools: at most 60")
    if args.kinds and not set(args.kinds) <= set(KINDS):
        p.error(f"--kinds: unknown {sorted(set(args.kinds) - set(KINDS))}; known: {', '.join(KINDS)}")
    return soak(args)


def soak(args: argparse.Namespace) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    module = "tracer" if (ROOT / "tracer" / "__main__.py").exists() else "tracer.cli"
    cli = [sys.executable, "-m", module]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    source_start = source()  # the working tree may be shared: what the run started from
    load_start = os.getloadavg()
    flags = help_flags([*cli, "serve"], env)  # fails here, before any build, when tracer does not import
    original = cached_index(args.scorer, env)
    work = Path(tempfile.mkdtemp(prefix="soak_gateway_"))
    index, log_dir, gw_cwd = work / "index", work / "log", work / "gateway_cwd"
    shutil.copytree(original, index, symlinks=True)
    gw_cwd.mkdir()
    stub_port, gw_port = free_port(), free_port()
    wanted = {"--port": str(gw_port), "--k": str(args.k), "--log-level": args.gateway_log_level,
              "--max-body-bytes": str(args.max_body_bytes), "--log-idle": str(args.log_idle)}
    if args.max_presented is not None:
        wanted["--max-presented"] = str(args.max_presented)
    gw_cmd = [*cli, "serve", "--index", str(index), "--upstream", f"http://127.0.0.1:{stub_port}/v1",
              "--log", str(log_dir)]
    for flag, value in wanted.items():
        if flag in flags:
            gw_cmd += [flag, value]
    gw_cmd += args.gateway_arg
    stderr_path = args.out / "gateway.stderr.log"
    procs: list[subprocess.Popen] = []

    def stop_all(*_: Any) -> None:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    res: dict[str, Any] = {}
    soak_: Soak | None = None
    try:
        with open(args.out / "stub.stderr.log", "wb") as stub_err:
            procs.append(subprocess.Popen([sys.executable, __file__, "--role", "stub", "--port",
                                           str(stub_port)],
                                          env=env, stdout=stub_err, stderr=subprocess.STDOUT))
        with open(stderr_path, "wb") as gw_err:
            gateway = subprocess.Popen(gw_cmd, env=env, cwd=gw_cwd, stdout=gw_err, stderr=subprocess.STDOUT)
        procs.append(gateway)
        mcp_proc = None
        if args.mcp_clients:
            shutil.copytree(original, work / "mcp_index", symlinks=True)
            mcp_port = free_port()
            mcp_cmd = [*cli, "mcp", "--transport", "http", "--host", "127.0.0.1", "--port", str(mcp_port),
                       "--config", str(write_config(work / "servers.json", sys.executable)),
                       "--index", str(work / "mcp_index")]
            with open(args.out / "mcp.stderr.log", "wb") as mcp_err:
                mcp_proc = subprocess.Popen(mcp_cmd, env=env, cwd=gw_cwd, stdout=mcp_err,
                                            stderr=subprocess.STDOUT)
            procs.append(mcp_proc)
        wait_ready(f"http://127.0.0.1:{stub_port}/health", procs[0])
        wait_ready(f"http://127.0.0.1:{gw_port}/health", gateway)
        if mcp_proc is not None:
            wait_ready(f"http://127.0.0.1:{mcp_port}/mcp", mcp_proc)
        print(f"gateway up ({' '.join(gw_cmd[1:])}); {args.clients} clients for {args.minutes:g} min"
              + (f", {args.mcp_clients} MCP clients" if mcp_proc is not None else ""), flush=True)
        soak_ = Soak(args, gw_port, stub_port, gateway, log_dir, gw_cwd / ".cache")
        if mcp_proc is not None:
            soak_.mcp = McpLoad(f"http://127.0.0.1:{mcp_port}/mcp", args.mcp_clients, args.tenants, args.seed)
            soak_.mcp_proc = mcp_proc
        asyncio.run(soak_.run())
        stub_view = _stub_records(stub_port)
        metrics_end = soak_.samples[-1].get("metrics", {}) if soak_.samples else {}
        # SIGTERM: the gateway drains and writes its pending conversations
        t = time.monotonic()
        rc = None
        if gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
            try:
                rc = gateway.wait(120)
            except subprocess.TimeoutExpired:
                gateway.kill()
                rc = f"killed after 120 s ({gateway.wait(10)})"
        else:
            rc = gateway.returncode
        shutdown = {"seconds": round(time.monotonic() - t, 1), "rc": rc}
        log_report = analyze_log(log_dir, soak_)
        upd = [*cli, "update", "--index", str(index), "--log", str(log_dir)]
        updates = [run_update(upd, env, gw_cwd)]
        updates.append(run_update(upd, env, gw_cwd))
        try:
            ck = subprocess.run([sys.executable, __file__, "--role", "check", "--index", str(index),
                                 "--original", str(original)], check=False, env=env, cwd=gw_cwd,
                                capture_output=True, text=True, timeout=900)
            check = json.loads(ck.stdout.strip().splitlines()[-1]) if ck.returncode == 0 else \
                {"loads": False, "error": ck.stderr[-2000:]}
        except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
            check = {"loads": False, "error": repr(e)}
        res = result(args, soak_, stub_view, metrics_end, shutdown, log_report, updates, check, gw_cmd,
                     started, load_start, stderr_path)
        res["source"] = source_start
    except KeyboardInterrupt:
        print("interrupted: stopping the gateway and the stub", file=sys.stderr)
        return 130
    finally:
        stop_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", flush=True)
    (args.out / "soak.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = markdown(res)
    (args.out / "soak.md").write_text(md)
    print(md)
    return 0 if res["passed"] else 1


def _stub_records(port: int) -> dict[str, Any]:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/soak/records", timeout=60).json()
    except (httpx.HTTPError, ValueError) as e:
        return {"records": {}, "outside": [], "outside_count": 0, "by_kind": {}, "error": repr(e)}


def cached_index(scorer: str, env: dict[str, str]) -> Path:
    key = index_key(scorer)
    target = ROOT / ".cache" / "soak" / f"{scorer}-{key}"
    if (target / "meta.json").exists() or (target / "CURRENT").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"building the index ({scorer} on {DATA.relative_to(ROOT)}) -> {target}", flush=True)
    subprocess.run([sys.executable, __file__, "--role", "build", "--index", str(tmp), "--scorer", scorer],
                   env=env, cwd=ROOT, check=True, timeout=1200)
    try:
        os.replace(tmp, target)
    except OSError:  # built meanwhile by another run
        shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    sys.exit(main())
