"""After the traffic: the gateway's conversation log, the two ``tracer update`` runs, the gateway's stderr,
the resource slopes, and :func:`result`, the whole run as one dict (``soak.json``)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.soak.constants import MiB
from benchmarks.soak.load import Soak
from benchmarks.soak.readings import machine
from benchmarks.soak.report import findings
from benchmarks.soak.stats import percentile
from benchmarks.soak.traffic import COMPANIES, DISCONNECT, HOSTILE, VALID, tenant_of_text


def analyze_log(log_dir: Path, soak: Soak) -> dict[str, Any]:
    path = log_dir / "trajectories.jsonl"
    out: dict[str, Any] = {"exists": path.exists()}
    if not path.exists():
        return out
    lines = unparsable = nonfinite = media_logged = 0
    outcome: Counter[str] = Counter()
    # (tenant by the markers of its messages, or None; the group: the id as the client knows it)
    groups: Counter[tuple[int | None, str]] = Counter()
    success_groups: set[tuple[int | None, str]] = set()
    finished: dict[tuple[int | None, str], list] = {}  # key -> [success, the answer logged] of each report
    mixed: list[dict[str, Any]] = []
    tenants = soak.args.tenants
    called: set[str] = set()
    roles: Counter[str] = Counter()
    max_line = 0
    with open(path, "rb") as f:
        for line in f:
            lines += 1
            max_line = max(max_line, len(line))
            media_logged += b"data:image/" in line
            try:
                rec = json.loads(line)
            except ValueError:
                unparsable += 1
                continue
            if not isinstance(rec, dict):
                unparsable += 1
                continue
            reward = rec.get("reward")
            if isinstance(reward, float) and not math.isfinite(reward):
                nonfinite += 1
            meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
            outcome[f"{meta.get('outcome')}/{'success' if rec.get('success') else 'failure'}"] += 1
            msgs = rec.get("messages") if isinstance(rec.get("messages"), list) else []
            owners = tenant_of_text(json.dumps(msgs), tenants) if tenants else set()
            if len(owners) > 1:
                mixed.append({"group": rec.get("group"), "tenants": sorted(COMPANIES[t] for t in owners)})
            key = (next(iter(owners)) if len(owners) == 1 else None, str(rec.get("group")))
            groups[key] += 1
            if meta.get("outcome") != "unreported":
                last = msgs[-1] if msgs and isinstance(msgs[-1], dict) else {}
                answered = (last.get("role") == "assistant"
                            and str(last.get("content") or "").startswith("Done:"))
                finished.setdefault(key, []).append([bool(rec.get("success")), answered])
            if rec.get("success"):
                success_groups.add(key)
            called.update(c for c in meta.get("called") or [] if isinstance(c, str))
            for m in rec.get("messages") or []:
                if isinstance(m, dict):
                    roles[str(m.get("role"))[:20]] += 1
    tools_json = log_dir / "tools.json"
    registered: list[str] = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        registered = [t["function"]["name"] for t in json.loads(tools_json.read_text())]
    reported_success = {c for c, (_, s) in soak.reported.items() if s}
    reported = set(soak.reported)
    # a report finishes its own tenant's conversation, once, with the answer whole
    cross_finished = finished_unreported = mismatched = 0
    cross_samples: list[str] = []
    finished_disconnected: Counter[str] = Counter()
    for key, runs in finished.items():
        if key in soak.reported:
            mismatched += sum(1 for ok, _ in runs if ok != soak.reported[key][1])
            continue
        own_kind = soak.conv_kind.get(key)
        if own_kind in ("cut_wait", "cut_stream"):  # its own X-Tracer-Outcome, on an answer it gave up on
            finished_disconnected[own_kind] += len(runs)
            continue
        others = [t for t, g in soak.reported if g == key[1] and t != key[0]]
        if others:
            cross_finished += len(runs)
            if len(cross_samples) < 10:
                cross_samples.append(f"{key} ({own_kind}): finished, reported only by tenant(s) {others}")
        else:
            finished_unreported += len(runs)
    once = {"completed": len(reported), "logged_once": 0, "missing": 0, "twice": 0,
            "without_answer": 0, "missing_samples": []}
    for key in reported:
        n = groups.get(key, 0)
        if n == 0:
            once["missing"] += 1
            if len(once["missing_samples"]) < 10:
                once["missing_samples"].append(f"{key} ({soak.reported[key][0]})")
        elif n == 1:
            once["logged_once"] += 1
        else:
            once["twice"] += 1
        once["without_answer"] += sum(1 for _, answered in finished.get(key, []) if not answered)
    return {
        "exists": True, "lines": lines, "bytes": path.stat().st_size, "max_line_bytes": max_line,
        "bytes_per_line": round(path.stat().st_size / max(lines, 1)), "unparsable_lines": unparsable,
        "nonfinite_rewards": nonfinite, "by_outcome": dict(outcome), "roles": dict(roles),
        "conversations": len(groups), "conversations_logged_twice": sum(1 for n in groups.values() if n > 1),
        "media_logged": media_logged, "mixed_tenants": len(mixed), "mixed_samples": mixed[:10],
        "cross_tenant_finished": cross_finished, "cross_samples": cross_samples,
        "finished_unreported": finished_unreported, "outcome_mismatched": mismatched, "completed": once,
        "disconnected_finished": dict(finished_disconnected),
        "reported_by_clients": len(reported), "reported_missing_from_log": len(reported - set(groups)),
        "reported_success_logged_as_success": len(reported_success & success_groups),
        "reported_success": len(reported_success),
        "cut_streams": len(soak.cut_conversations),
        "cut_streams_logged_as_success": len(soak.cut_conversations & success_groups),
        "tools_json_tools": len(registered), "tools_called": len(called),
        "tools_json_never_called": len([n for n in registered if n not in called]),
    }


def run_update(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return {"rc": None, "seconds": round(time.monotonic() - t, 1), "error": "timed out after 1800 s"}
    report = None
    for line in reversed(p.stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            candidate = json.loads(line)
            if isinstance(candidate, dict):
                report = candidate
                break
    stderr = "\n".join(line for line in p.stderr.splitlines() if "it/s]" not in line)  # no progress bars
    return {"rc": p.returncode, "seconds": round(time.monotonic() - t, 1), "report": report,
            "stdout_tail": p.stdout[-2000:], "stderr_tail": stderr[-3000:]}


def analyze_stderr(path: Path) -> dict[str, Any]:
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    raw_lines = tracebacks = 0
    samples: list[str] = []
    seen: set[str] = set()
    lines = 0
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        for line in f:
            lines += 1
            line = line.rstrip("\n")
            try:
                rec = json.loads(line)
                ok = isinstance(rec, dict)
            except ValueError:
                ok = False
            if ok:
                levels[str(rec.get("level"))] += 1
                events[str(rec.get("event"))] += 1
                if rec.get("exc"):
                    tracebacks += 1
                    key = f"{rec.get('event')}: {str(rec.get('exc')).strip().splitlines()[-1][:200]}"
                    if key not in seen and len(samples) < 10:
                        seen.add(key)
                        samples.append(key)
                continue
            if not line.strip() or "it/s]" in line:  # blank, or a progress bar at start-up
                continue
            raw_lines += 1
            if "Traceback (most recent call last)" in line:
                tracebacks += 1
            if re.search(r"(ERROR|Exception|Error:)", line):
                key = line.strip()[:200]
                if key not in seen and len(samples) < 10:
                    seen.add(key)
                    samples.append(key)
    return {"lines": lines, "levels": dict(levels), "events": dict(events), "raw_lines": raw_lines,
            "tracebacks": tracebacks, "samples": samples}


def source() -> dict[str, Any]:
    """The commit the run started from and the files under ``tracer/`` that differed from it (the working
    tree may be shared)."""
    from benchmarks.soak.constants import ROOT

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], check=False, cwd=ROOT, capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
    return {"commit": git("rev-parse", "--short", "HEAD").strip(),
            "tracer_modified": [line[3:] for line in git("status", "--porcelain", "tracer/").splitlines()]}


def fit_slope(samples: list[dict], key: str, after: float, scale: float = 1.0) -> float | None:
    """Least-squares slope of ``key`` (divided by ``scale``) per minute over samples at t >= ``after``."""
    pts = [(s["t"] / 60, s[key] / scale) for s in samples if s["t"] >= after and key in s]
    if len(pts) < 3:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def result(args, soak_: Soak, stub_view: dict, metrics_end: dict, shutdown: dict, log_report: dict,
           updates: list[dict], check: dict, gw_cmd: list[str], started: str, load_start: tuple,
           stderr_path: Path) -> dict[str, Any]:
    records = stub_view.get("records", {})
    at_upstream = no_selection = 0
    sel_ms: list[float] = []
    fell: set[str] = set()
    for rid, kind, n_tools, sel in soak_.sent:
        got = records.get(rid)
        over = n_tools > soak_.cap and got is not None and got[0] > soak_.cap
        missing_sel = sel is None or sel == 0.0
        at_upstream += over
        no_selection += missing_sel
        if sel is not None:
            sel_ms.append(sel)
        if over or missing_sel:
            fell.add(rid)
            soak_.stat(kind).fell_back += 1
    sel_errors = None
    if metrics_end:
        sel_errors = sum(v
                         for k, v in metrics_end.items() if k.startswith("tracer_errors") and 'selection' in k
                         and not k.endswith("_created"))
    totals = {cls: {"requests": 0, "errors": 0, "unexpected": 0, "server_errors": 0}
              for cls in (VALID, HOSTILE, DISCONNECT)}
    for st in soak_.stats.values():
        for key in ("requests", "errors", "unexpected", "server_errors"):
            totals[st.cls][key] += getattr(st, key)
    samples = soak_.samples
    duration = args.minutes * 60
    warmup = min(args.warmup, duration / 3)
    after = [s for s in samples if s["t"] >= warmup]
    resources: dict[str, Any] = {"warmup_s": warmup, "samples_fitted": len(after),
                                 "slopes_meaningful": duration - warmup >= 180}
    for key, scale in (("rss_mb", 1), ("log_bytes", MiB), ("log_disk_bytes", MiB), ("cache_bytes", MiB),
                       ("cache_files", 1), ("fds", 1), ("threads", 1), ("mcp_rss_mb", 1)):
        vals = [s[key] / scale for s in after if key in s]
        allv = [s[key] / scale for s in samples if key in s]
        resources[key] = {"start": vals[0] if vals else None, "end": vals[-1] if vals else None,
                          "max": max(allv) if allv else None, "slope": fit_slope(samples, key, warmup, scale),
                          "slope_second_half": fit_slope(samples, key, duration / 2, scale)}
    cpu = [s for s in samples if "cpu_s" in s]
    n_req = sum(st.requests for st in soak_.stats.values())
    resources["cpu_ms_per_request"] = ((cpu[-1]["cpu_s"] - cpu[0]["cpu_s"]) * 1e3 / max(
        cpu[-1]["requests"] - cpu[0]["requests"], 1)) if len(cpu) > 1 else None
    lat = [ms for _, ms, _ in soak_.health]
    hits = soak_.want_hits
    ten = stub_view.get("tenancy") or {}
    log_leaks = log_report.get("mixed_tenants", 0) + log_report.get("cross_tenant_finished", 0)
    tenancy = {
        "tenants": args.tenants, "requests_by_tenant": ten.get("by_tenant", {}),
        "first_requests": ten.get("first_requests", 0), "first_over_k": ten.get("first_over_k", 0),
        "later_over_k": ten.get("later_over_k", 0),
        "first_over_k_samples": ten.get("first_over_k_samples", []),
        "allowed_requests": ten.get("allowed_requests", 0),
        "allowed_violations": ten.get("allowed_violations", 0),
        "allowed_samples": ten.get("allowed_samples", []),
        "cross_token_accepted": soak_.cross_token_accepted,
        "log_mixed": log_report.get("mixed_tenants", 0),
        "log_cross_finished": log_report.get("cross_tenant_finished", 0),
        "foreign_family_presented": ten.get("foreign_presented", 0),
        "duplicate_posts": stub_view.get("duplicate_posts", 0),
        "duplicate_samples": ten.get("duplicates", []),
        "encodings": stub_view.get("encodings", {}),
    }
    tenancy["leaks"] = (tenancy["first_over_k"] + tenancy["allowed_violations"]
                        + tenancy["cross_token_accepted"] + log_leaks)
    res: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "gateway_command": " ".join(shlex.quote(str(a)) for a in ["python", *gw_cmd[1:]]),
        "started": started, "machine": machine(), "load_start": list(load_start), "source": source(),
        "load_end": list(os.getloadavg()),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cap": soak_.cap, "requests": n_req,
        "kinds": {k: st.as_dict() for k, st in soak_.stats.items()}, "totals": totals,
        "fallbacks": {"total": len(fell), "at_upstream": at_upstream, "no_selection": no_selection,
                      "metrics_selection_errors": sel_errors, "checked": len(soak_.sent)},
        "selection_ms": {"p50": percentile(sel_ms, 50), "p99": percentile(sel_ms, 99),
                         "max": max(sel_ms) if sel_ms else None},
        "want_presented": (f"{hits['presented'] / max(sum(hits.values()), 1):.1%} of "
                           f"{sum(hits.values())} tool-call turns"),
        "outside_v1": stub_view.get("outside_count", 0), "outside_paths": stub_view.get("outside", [])[:20],
        "stub_by_kind": stub_view.get("by_kind", {}), "stub_error": stub_view.get("error"),
        "extra_answer_headers": dict(soak_.extra_headers_seen), "tenancy": tenancy,
        "mcp": soak_.mcp.report() if soak_.mcp is not None else None,
        "died_at": soak_.died_at, "shutdown": shutdown, "resources": resources,
        "health": {"probes": len(lat), "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                   "max_ms": max(lat) if lat else None, "over_1s": sum(x > 1000 for x in lat),
                   "failed": sum(1 for _, _, s in soak_.health if s != 200)},
        "log": log_report, "updates": updates, "check": check, "stderr": analyze_stderr(stderr_path),
        "error_samples": soak_.error_samples, "unexpected_samples": soak_.unexpected_samples,
        "slow": soak_.slow, "samples": samples, "health_probes": soak_.health,
    }
    res["findings"] = findings(res)
    once = log_report.get("completed") or {}
    res["passed"] = (totals[VALID]["errors"] == 0 and not fell and soak_.died_at is None
                     and totals[VALID]["requests"] > 0 and tenancy["leaks"] == 0
                     and not tenancy["duplicate_posts"] and not once.get("missing") and not once.get("twice")
                     and not (res["mcp"] or {}).get("leaks"))
    return res
