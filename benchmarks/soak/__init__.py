"""Soak of ``tracer serve --log`` on loopback: mixed traffic for minutes, then ``tracer update`` twice.

    python -m benchmarks.soak_gateway                                # 10 minutes, 16 clients -> outputs/soak/
    python -m benchmarks.soak_gateway --minutes 1 --clients 4 --out /tmp/soak   # a short check of the script

Not a test: a benchmark of the production loop (issue 32). Three kinds of processes, as in
benchmarks/bench_gateway.py: a stub upstream (uvicorn + Starlette, the entry with ``--role stub``), the
gateway (``python -m tracer.cli serve --log DIR``, or ``-m tracer`` once the package has a ``__main__``; only
the flags its ``--help`` lists are passed; run in a temporary working directory so any embedding cache it
writes is its own) and this load generator (asyncio; aiohttp, raw sockets, and the official ``openai`` client
for part of the conversations).

**The index**: ``tracer_plus`` (the default scorer and the one docs/gateway.md serves) fitted on
``data/example`` (6 tools, 5 trajectories): it builds in ~15 s, so the run measures the gateway and not a fit,
and its tools and their words are what the clients' conversations ask for, so the stub's calls are to tools
the index knows and the update has something to learn. It is built once and cached under
``.cache/soak/<scorer>-<hash of the dataset and tracer's source but serve/ and cli/>/`` (``--role build``, in
a subprocess: the load generator never imports torch), and copied to a temporary directory for each run, since
the update writes to it.

**The traffic**: ``--clients`` agents for ``--minutes``, each drawing its next episode at random
(weights in ``KINDS``) after a pause drawn from [0.5, 1.5] x ``--think-ms``. Every agent carries its own
registry: the index's 6 tools plus 30 of its own the index never saw (``--extra-tools``), so a valid
request carries more tools than the sticky cap (4 k) and a fallback to the whole list is visible at the
upstream. Episodes, each classified in advance:

- valid conversations (several turns; each answer's tool call and a tool result appended; the outcome
  reported by ``X-Tracer-Outcome`` on the last request, by ``POST /v1/tracer/outcome`` with the
  ``X-Tracer-Outcome-Token`` (any ``x-tracer-*`` answer header) the gateway sent back, or not at all;
  the stub calls the tool the agent wants, named in a header, when it was presented, else the first
  presented one, and the agent reports failure when it was not):
  ``normal``, ``known_only`` (only the 6 indexed tools), ``sdk`` (the official ``openai`` client),
  ``stream`` (SSE), ``developer`` (a ``developer`` message), ``unknown_history`` (the history called a
  tool the index does not know), ``orphan_tool`` (a tool message whose call was trimmed),
  ``bad_arguments`` (malformed ``arguments`` earlier in the history), ``content_parts`` (content as a
  list of parts), ``many_unknown`` (300 more tools, the same for every agent), ``novel_unknown`` (100
  tools with new names each time), ``odd_upstream`` (the stub answers ``message`` as a string, a number,
  null, no choices...: the gateway must pass it through);
- hostile requests (must be refused with a 4xx, never a 5xx): ``bad_json``, ``wrong_types``,
  ``traversal`` (``/v1/../admin`` and its encodings, raw socket; the stub records any path that reached
  it outside ``/v1/``), ``oversized`` (over ``--max-body-bytes``, declared and chunked), ``big_value``
  (a 1 MB role or tool name), ``outcome_bad`` (malformed outcome bodies), ``nan_reward`` (a real
  conversation's outcome with ``reward`` NaN or 1e999), ``reload`` (``POST /v1/tracer/reload`` without
  credentials);
- disconnects (no status expected; the gateway must stay up and quiet): ``cut_body`` (a raw socket
  closes mid-body), ``cut_stream`` (the client closes a stream after its first chunk; its
  ``X-Tracer-Outcome: success`` must not log a success), ``cut_wait`` (the client gives up while the
  upstream is still thinking).

**Tenants** (``--tenants``, 4 by default; issue 56): client i sends tenant i mod N's API key, and each
tenant numbers its ``X-Tracer-Conversation`` ids 1, 2, ... itself, so the tenants use the same ids at about
the same time. Tenant t has a family of 12 tools of its own (``<company>_<verb>_<noun>``, nouns no other
family has); every agent carries every family (one product's registry), each conversation opens with a turn
of its tenant's business that wants a tool of its family, and every message it writes is marked
``[<company>]`` (the stub's calls and arguments too; the stub never calls another tenant's tool). A leak is
then visible as: a first request of a conversation that reaches the stub with more than k tools (only a
sticky list from elsewhere adds to the fresh top k); an ``allowed`` request (``tool_choice`` of the
``allowed_tools`` type: the 6 indexed tools and the tenant's family) that presents a tool outside that set
or lists one it did not present; ``cross_token`` (hostile: another tenant's outcome token for another id,
this tenant's credential with another's id and tenant, this tenant's token for another's id) answered 200
or 404 instead of 403; a logged record whose messages carry two tenants' markers; a record finished by a
report that only another tenant made for that id. **Duplicates**: the stub counts POSTs per request id
(``x-soak-id``, unique per request; the clients never retry). **Compression and streams**: the stub
compresses a third of the answers with gzip and a third with deflate (plain and SSE), half the aiohttp
streams drop their connection right at ``data: [DONE]``, and ``sdk_stream`` reads streams with the official
``openai`` client (``stream=True``). ``normal`` sends a lone surrogate escape in a quarter of its
conversations, ``content_parts`` an image part (a ``data:`` URL: the log must hold no image bytes).
**Completed** conversations (an outcome the client reported and the gateway took) must be logged exactly
once, with the final answer. **MCP** (``--mcp-clients``, 4 by default): :mod:`.mcp_load` runs SDK clients
of both protocol modes against ``tracer mcp --transport http`` meanwhile, with their own leak checks.

**Errors** are valid requests answered non-2xx or with an exception, or with a body that is not a chat
completion. **Fallbacks**: a valid request with more than k tools that reached the stub with more than
the sticky cap (``4 k``, or ``--max-presented``), counted at the upstream by the request id header the
client sends; also a missing or zero ``X-Tracer-Selection-Ms`` on such a request, and the gateway's own
``tracer_errors_total{kind="selection"}``. A health prober (``GET /health`` every second) measures
stalls of the event loop.

**Samples** every ``--sample-every`` s: the gateway's RSS, open fds, threads and CPU time (``/proc``), the
log directory's and the gateway's ``.cache`` bytes, the load average, and the gateway's ``/metrics``.
Start = the first sample after the warm-up (the first minute, or a third of a shorter run); slope = a
least-squares line over the samples after the warm-up, in MB per minute.

**At the end** the gateway gets SIGTERM (it drains and writes its pending conversations), its log is read
(lines, outcomes, duplicates, non-finite rewards, what ``tools.json`` registered), then ``tracer update
--index IDX --log DIR`` runs twice (the second must apply nothing new) and ``--role check`` loads the
updated index and ranks probe contexts with it and with the original. Written to ``--out``:
``soak.json`` (everything), ``soak.md`` (the summary), ``gateway.stderr.log`` (and ``mcp.stderr.log``).
Exit status 1 when a valid request errored or fell back, the gateway died, a leak across tenants (gateway
or MCP) or a duplicate upstream POST was counted, or a completed conversation was logged other than once;
everything else the run saw (hostile 5xx, stalls, growth, log or update trouble) is listed under
Findings. ``--kinds a,b`` draws only those episodes (a check of the script, not a soak).

**The parts**: ``benchmarks/soak_gateway.py`` (the entry: starts the processes, runs the roles),
:mod:`.traffic` (the episode kinds, conversations and tools), :mod:`.stub` (the stub upstream),
:mod:`.index` (the index's key, build and check), :mod:`.mcp_load` (the MCP clients), the load generator
built up in four steps (:mod:`.recorder` the bookkeeping, :mod:`.requester` one request, :mod:`.agents`
the episodes, :mod:`.load` the run with its sampler and prober), :mod:`.readings` (/proc, directory sizes,
/metrics), :mod:`.stats`, :mod:`.results` (the log, the updates, the stderr, the result dict) and
:mod:`.report` (``soak.md``).
"""
