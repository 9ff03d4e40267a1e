"""The report of a run: ``soak.md`` (:func:`markdown`) and the findings listed in it (:func:`findings`)."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.soak.constants import MiB
from benchmarks.soak.traffic import HOSTILE, VALID


def brief(report: Any) -> Any:
    """A report with each list cut to its length and first item (the JSON keeps them whole)."""
    if not isinstance(report, dict):
        return report
    return {k: (f"{len(v)} items, first: {str(v[0])[:160]}" if v else "[]") if isinstance(v, list) else v
            for k, v in report.items()}


def counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(c.items())) or "-"


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(res: dict[str, Any]) -> str:
    cfg, m = res["config"], res["machine"]
    out = [f"# Soak of `tracer serve --log`: {cfg['minutes']:g} min, {cfg['clients']} clients\n",
           f"Command: `{res['command']}`  ",
           f"Gateway: `{res['gateway_command']}`  ",
           (f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; load average (1/5/15 min) at start "
            f"{' / '.join(f'{x:.2f}' for x in res['load_start'])}, at end "
            f"{' / '.join(f'{x:.2f}' for x in res['load_end'])}  "),
           (f"Index: `{cfg['scorer']}` on data/example (6 tools), k = {cfg['k']}, sticky cap {res['cap']}; "
            f"each agent carries the 6 indexed tools + {cfg['extra_tools']} of its own; pause "
            f"{cfg['think_ms']:g} ms (x U[0.5, 1.5]); started {res['started']}\n")]
    tot = res["totals"]
    verdict = "PASS" if res["passed"] else "FAIL"
    out.append(f"**{verdict}**: valid requests {tot['valid']['requests']}, errors "
               f"**{tot['valid']['errors']}**, fell back to the whole list **{res['fallbacks']['total']}** "
               f"(at the upstream {res['fallbacks']['at_upstream']}, selection header missing/0 "
               f"{res['fallbacks']['no_selection']}, gateway's tracer_errors{{kind=\"selection\"}} "
               f"{fmt(res['fallbacks']['metrics_selection_errors'], 0)}); hostile "
               f"{tot['hostile']['requests']} (unexpected answers {tot['hostile']['unexpected']}, 5xx "
               f"{tot['hostile']['server_errors']}); disconnects {tot['disconnect']['requests']}; gateway "
               f"{'died at ' + fmt(res['died_at']) + ' s' if res['died_at'] is not None else 'up throughout'}"
               f". Wanted tool presented: {res['want_presented']}.\n")
    out.append("| class | kind | requests | statuses | exceptions | errors / unexpected | fell back | "
               "selection p50 / max (ms) | latency p50 / p99 / max (ms) |")
    out.append("|---|---|---:|---|---|---:|---:|---:|---:|")
    for kind, st in sorted(res["kinds"].items(), key=lambda kv: (kv[1]["class"], kv[0])):
        bad = st["errors"] if st["class"] == VALID else st["unexpected"] if st["class"] == HOSTILE else "-"
        out.append(f"| {st['class']} | {kind} | {st['requests']} | {counts(st['status'])} | "
                   f"{counts(st['exceptions'])} | {bad} | {st['fell_back'] if st['class'] == VALID else '-'} "
                   f"| {fmt(st['selection_ms_p50'], 1)} / {fmt(st['selection_ms_max'], 1)} | "
                   f"{fmt(st['latency_ms_p50'], 0)} / {fmt(st['latency_ms_p99'], 0)} / "
                   f"{fmt(st['latency_ms_max'], 0)} |")
    r = res["resources"]
    out.append(f"\nResources (start = first sample at or after {r['warmup_s']:g} s; slope: least squares "
               f"over the samples from then on, {r['samples_fitted']} samples every {cfg['sample_every']:g} s"
               + ("; a window this short says little about a slope" if not r["slopes_meaningful"] else "")
               + "):\n")
    out.append("| | start | end | max | slope per minute |")
    out.append("|---|---:|---:|---:|---:|")
    for label, key, unit in (("gateway RSS (MB)", "rss_mb", 1), ("log dir (MB)", "log_bytes", MiB),
                             ("gateway .cache (MB)", "cache_bytes", MiB),
                             ("gateway .cache files", "cache_files", 1),
                             ("gateway open fds", "fds", 1), ("gateway threads", "threads", 1)):
        row = r[key]
        out.append(f"| {label} | {fmt(row['start'], 2)} | {fmt(row['end'], 2)} | {fmt(row['max'], 2)} | "
                   f"{fmt(row['slope'], 3)} |")
    h = res["health"]
    out.append(
        f"\nGateway CPU: {fmt(r['cpu_ms_per_request'], 2)} ms per request. `/health` every second: "
        f"{h['probes']} probes, p50 {fmt(h['p50_ms'])} ms, p99 {fmt(h['p99_ms'])} ms, max "
        f"{fmt(h['max_ms'])} ms, {h['over_1s']} over 1 s, {h['failed']} failed. Valid selection "
        f"(`X-Tracer-Selection-Ms`) p50 / p99 / max: {fmt(res['selection_ms']['p50'], 2)} / "
        f"{fmt(res['selection_ms']['p99'], 2)} / {fmt(res['selection_ms']['max'], 2)} ms. Shutdown "
        f"after SIGTERM: {fmt(res['shutdown']['seconds'])} s, exit code {res['shutdown']['rc']}"
        f"{' (uvicorn re-raises the SIGTERM once it has drained)' if res['shutdown']['rc'] == -15 else ''}"
        ".\n")
    stalls = [f"t={t:g} s {ms:.0f} ms" for t, ms, _ in res["health_probes"] if ms > 1000][:10]
    if stalls:
        out.append(f"`/health` over 1 s: {'; '.join(stalls)}. Answers over 1 s: "
                   + ("; ".join(f"t={x['t']:g} s {x['kind']} ({x['tools']} tools) {x['latency_ms']} ms, "
                                f"selection {fmt(x['selection_ms'], 0)} ms" for x in res["slow"][:10])
                      or "none") + ".\n")
    lg = res["log"]
    if lg.get("exists"):
        out.append(f"Conversation log: {lg['lines']} lines, {lg['bytes'] / MiB:.2f} MB "
                   f"({lg['bytes_per_line']} B a line, longest {lg['max_line_bytes']} B); by outcome "
                   f"{counts(lg['by_outcome'])}; unparsable {lg['unparsable_lines']}, non-finite rewards "
                   f"{lg['nonfinite_rewards']}, conversations logged twice "
                   f"{lg['conversations_logged_twice']}; clients reported {lg['reported_by_clients']} "
                   f"({lg['reported_missing_from_log']} missing from the log, "
                   f"{lg['reported_success_logged_as_success']} of {lg['reported_success']} successes logged "
                   "as such); cut streams with `X-Tracer-Outcome: success` logged as a success: "
                   f"{lg['cut_streams_logged_as_success']} of {lg['cut_streams']}; tools.json holds "
                   f"{lg['tools_json_tools']} tools, {lg['tools_json_never_called']} never called.\n")
    else:
        out.append("Conversation log: none written.\n")
    for i, up in enumerate(res["updates"], 1):
        out.append(f"`tracer update` run {i}: exit {up['rc']} in {up['seconds']} s; report "
                   f"`{json.dumps(brief(up.get('report')))}`"
                   + (f"; stderr: `{up.get('stderr_tail', '').strip()[-300:]}`" if up.get("rc") != 0 else "")
                   + "  ")
    ck = res["check"]
    if ck.get("loads"):
        out.append(f"\nUpdated index loads: {ck['tools_before']} -> {ck['tools_after']} tools "
                   f"(new: {', '.join(ck['new_tools'][:10]) or '-'}). Rank of the first wanted tool for a "
                   "probe context, original -> updated:\n")
        out.append("| probe context | wanted | rank | top 3 after |")
        out.append("|---|---|---:|---|")
        for p in ck["probes"]:
            out.append(f"| {p['context']} | {p['want']} | {p['rank_before']} -> {p['rank_after']} | "
                       f"{', '.join(p['top3_after'])} |")
    else:
        out.append(f"\nUpdated index check failed: `{ck.get('error', '')[-500:]}`")
    se = res["stderr"]
    out.append(f"\nGateway stderr (`gateway.stderr.log`, log level {cfg['gateway_log_level']}): "
               f"{se['lines']} lines, levels {counts(se['levels'])}, events {counts(se['events'])}, "
               f"{se['raw_lines']} non-JSON lines, {se['tracebacks']} tracebacks.")
    for s in se["samples"]:
        out.append(f"- `{s}`")
    if res["findings"]:
        out.append("\nFindings:\n")
        out += [f"- {f}" for f in res["findings"]]
    if res["error_samples"]:
        out.append("\nFirst valid errors:\n")
        out += [f"- t={e['t']} {e['kind']} status {e['status']} {e['exception'] or ''}: `{e['detail'][:200]}`"
                for e in res["error_samples"][:10]]
    if res["unexpected_samples"]:
        out.append("\nFirst unexpected answers to hostile requests:\n")
        out += [f"- t={e['t']} {e['kind']} status {e['status']} {e['exception'] or ''}: `{e['detail'][:200]}`"
                for e in res["unexpected_samples"][:10]]
    return "\n".join(out) + "\n"


def findings(res: dict[str, Any]) -> list[str]:
    out = []
    tot, lg = res["totals"], res["log"]
    if tot["valid"]["errors"]:
        out.append(f"{tot['valid']['errors']} valid requests errored")
    if res["fallbacks"]["total"]:
        out.append(f"{res['fallbacks']['total']} valid requests fell back to the whole tool list")
    if tot["hostile"]["server_errors"]:
        out.append(f"{tot['hostile']['server_errors']} hostile requests got a 5xx")
    if res["outside_v1"]:
        out.append(
            f"{res['outside_v1']} requests reached the upstream outside /v1/: {res['outside_paths'][:5]}")
    if res["died_at"] is not None:
        out.append(f"the gateway died at {res['died_at']:.0f} s")
    if res["health"]["over_1s"]:
        out.append(
            f"/health took over 1 s {res['health']['over_1s']} times (max {res['health']['max_ms']:.0f} ms)")
    if lg.get("exists"):
        if lg["nonfinite_rewards"]:
            out.append(f"the log holds {lg['nonfinite_rewards']} non-finite rewards")
        if lg["cut_streams_logged_as_success"]:
            out.append(f"{lg['cut_streams_logged_as_success']} cut streams logged as a success")
        if lg["conversations_logged_twice"]:
            out.append(f"{lg['conversations_logged_twice']} conversations logged more than once")
        if lg["reported_missing_from_log"]:
            out.append(f"{lg['reported_missing_from_log']} reported conversations missing from the log")
        if lg["tools_json_never_called"]:
            out.append(f"tools.json registers {lg['tools_json_never_called']} tools that were never called")
    ups = res["updates"]
    if ups and ups[0].get("rc") != 0:
        out.append(f"`tracer update` on the gateway's log failed (exit {ups[0].get('rc')}): "
                   f"{(ups[0].get('stderr_tail') or '').strip()[-200:]}")
    if len(ups) > 1 and ups[1].get("rc") == 0:
        second = ups[1].get("report") or {}
        again = second.get("applied", second.get("steps"))
        if again:
            out.append(f"the second update applied again: {json.dumps(second)}")
    if not res["check"].get("loads"):
        out.append("the updated index does not load")
    if res["shutdown"]["rc"] not in (0, -15):
        out.append(f"the gateway's exit after SIGTERM: {res['shutdown']['rc']}")
    # flat: what a slope past these would add over an hour is worth a look
    for key, label, limit in (("rss_mb", "gateway RSS (MB)", 1.0),
                              ("cache_bytes", "the gateway's .cache (MB)", 0.5),
                              ("fds", "open fds", 1.0), ("threads", "threads", 1.0)):
        slope = res["resources"][key]["slope"]
        if res["resources"]["slopes_meaningful"] and slope is not None and slope > limit:
            out.append(f"{label} grows by {slope:.3f} per minute after the warm-up")
    if res["stderr"]["tracebacks"]:
        out.append(f"{res['stderr']['tracebacks']} tracebacks in the gateway's stderr")
    return out
