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
           source_line(res.get("source")),
           (f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; load average (1/5/15 min) at start "
            f"{' / '.join(f'{x:.2f}' for x in res['load_start'])}, at end "
            f"{' / '.join(f'{x:.2f}' for x in res['load_end'])}  "),
           (f"Index: `{cfg['scorer']}` on data/example (6 tools), k = {cfg['k']}, sticky cap {res['cap']}; "
            f"each agent carries the 6 indexed tools + {cfg['extra_tools']} of its own"
            + (f" + every tenant's family ({cfg['tenants']} x 12)" if cfg.get("tenants") else "") + "; pause "
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
    out += tenancy_lines(res)
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
    out.append("| | start | end | max | slope per minute | slope per 10 minutes | per 10 minutes, "
               "second half |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for label, key, unit in (("gateway RSS (MB)", "rss_mb", 1), ("log dir (MB)", "log_bytes", MiB),
                             ("log dir on disk (MB)", "log_disk_bytes", MiB),
                             ("gateway .cache (MB)", "cache_bytes", MiB),
                             ("gateway .cache files", "cache_files", 1),
                             ("gateway open fds", "fds", 1), ("gateway threads", "threads", 1),
                             ("tracer mcp RSS (MB)", "mcp_rss_mb", 1)):
        row = r.get(key) or {"start": None, "end": None, "max": None, "slope": None}
        per10 = None if row["slope"] is None else row["slope"] * 10
        late = row.get("slope_second_half")
        late = None if late is None else late * 10
        out.append(f"| {label} | {fmt(row['start'], 2)} | {fmt(row['end'], 2)} | {fmt(row['max'], 2)} | "
                   f"{fmt(row['slope'], 3)} | {fmt(per10, 2)} | {fmt(late, 2)} |")
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


def source_line(src: dict[str, Any] | None) -> str:
    if not src:
        return ""
    dirty = src.get("tracer_modified") or []
    return (f"Source: commit {src['commit']}"
            + (f", with others' uncommitted changes under tracer/ ({', '.join(dirty[:12])})" if dirty else "")
            + "  ")


def tenancy_lines(res: dict[str, Any]) -> list[str]:
    """The multi-tenant checks: leaks across tenants, duplicate upstream POSTs, completed conversations
    logged once."""
    t = res.get("tenancy")
    if not t:
        return []
    lg = res["log"]
    once = lg.get("completed") or {}
    leaks = (f"**Tenants** ({t['tenants']} API keys; requests at the upstream by tenant "
             f"{counts(t['requests_by_tenant'])}): cross-tenant leaks **{t['leaks']}** = first requests of a "
             "conversation presented more than k tools (a sticky list from elsewhere) "
             f"{t['first_over_k']} of "
             f"{t['first_requests']} + `allowed_tools` requests presented a tool outside the tenant's "
             f"allowed set {t['allowed_violations']} of {t['allowed_requests']} + another tenant's token or "
             f"credential accepted by `/v1/tracer/outcome` {t['cross_token_accepted']} + logged records "
             f"mixing two tenants' messages {t['log_mixed']} + records finished by another tenant's report "
             f"{t['log_cross_finished']}. Tools of another tenant's family presented (every family rides in "
             "every request; chosen on the ranking's own merits, not a leak by itself): "
             f"{t['foreign_family_presented']}. Later requests presented more than k tools (their own "
             "sticky list grown: what a leaked one would show on a first request): "
             f"{t.get('later_over_k')}.\n")
    upstream = (f"**Upstream**: duplicate POSTs of one request id **{t['duplicate_posts']}**; answers by "
                f"coding {counts(t['encodings'])}.\n")
    out = [leaks, upstream]
    if once:
        out.append(f"**Completed conversations** (an outcome the client reported and the gateway took): "
                   f"{once['completed']}, logged exactly once **{once['logged_once']}**, missing "
                   f"**{once['missing']}**, more than once **{once['twice']}**, logged without the final "
                   f"answer {once['without_answer']}; records finished but never reported by their tenant "
                   f"{lg.get('finished_unreported', 0)}, finished with another outcome than reported "
                   f"{lg.get('outcome_mismatched', 0)}; image bytes (`data:image/`) in the log "
                   f"{lg.get('media_logged', 0)}. Disconnects whose own `X-Tracer-Outcome` was applied "
                   "although the client had given up (a 200 the gateway sent after the client left: "
                   f"not a leak): {counts(lg.get('disconnected_finished') or {})}.\n")
    m = res.get("mcp")
    if m:
        out.append(f"**MCP** (`tracer mcp --transport http`, {m['clients']} SDK clients, half current "
                   f"protocol, half `mode=\"legacy\"`): episodes {counts(m['episodes'])}, tool calls "
                   f"{m['calls']}; leaks **{m['leaks']}** = first listings of a session new to its tenant "
                   f"off the fresh list {m['not_fresh']} of {m['fresh_checked']} + another tenant's "
                   f"legacy session id served {m['borrowed_served']} of {m['borrowed_probes']} (statuses "
                   f"{counts(m['borrowed_status'])}); errors {m['error_count']} ({counts(m['errors'])}); "
                   f"episode p50 / max {fmt(m['episode_ms_p50'], 0)} / {fmt(m['episode_ms_max'], 0)} ms; "
                   f"listings after the episode's calls that differ from the fresh list (what a session "
                   f"served to another would show): {m.get('grown_after_calls')}.\n")
        out += [f"- MCP error: `{e}`" for e in m["error_samples"][:5]]
        out += [f"- MCP not fresh: `{json.dumps(x)[:300]}`" for x in m["not_fresh_samples"][:5]]
    for label, items in (("first requests over k", t["first_over_k_samples"]),
                         ("allowed_tools violations", t["allowed_samples"]),
                         ("duplicate POSTs", t["duplicate_samples"]),
                         ("mixed records", lg.get("mixed_samples") or []),
                         ("cross-tenant finishes", lg.get("cross_samples") or []),
                         ("completed but missing", once.get("missing_samples") or [])):
        if items:
            out.append(f"- {label}: " + "; ".join(f"`{json.dumps(x)[:300]}`" for x in items[:5]))
    return out


def findings(res: dict[str, Any]) -> list[str]:
    out = []
    tot, lg = res["totals"], res["log"]
    t = res.get("tenancy") or {}
    if t.get("leaks"):
        out.append(f"{t['leaks']} cross-tenant leaks")
    if t.get("duplicate_posts"):
        out.append(f"{t['duplicate_posts']} duplicate upstream POSTs")
    if (res.get("mcp") or {}).get("leaks"):
        out.append(f"{res['mcp']['leaks']} MCP cross-tenant leaks")
    if (res.get("mcp") or {}).get("error_count"):
        out.append(f"{res['mcp']['error_count']} MCP client errors")
    once = lg.get("completed") or {}
    if once.get("missing") or once.get("twice") or once.get("without_answer"):
        out.append(f"completed conversations: {once.get('missing')} missing from the log, "
                   f"{once.get('twice')} logged more than once, {once.get('without_answer')} logged without "
                   "their answer")
    if lg.get("media_logged"):
        out.append(f"{lg['media_logged']} log lines hold image bytes")
    if lg.get("finished_unreported") or lg.get("outcome_mismatched"):
        out.append(f"{lg.get('finished_unreported')} records finished without their tenant's report, "
                   f"{lg.get('outcome_mismatched')} with another outcome than reported")
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
            late = res["resources"][key].get("slope_second_half")
            out.append(f"{label} grows by {slope:.3f} per minute after the warm-up"
                       + (f" ({late:.3f} over the second half)" if late is not None else ""))
    if res["stderr"]["tracebacks"]:
        out.append(f"{res['stderr']['tracebacks']} tracebacks in the gateway's stderr")
    return out
