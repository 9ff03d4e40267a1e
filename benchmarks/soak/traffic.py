"""What the agents send: the episode kinds (class, weight, the statuses a hostile request may get), the
conversations they hold (templates and their slots) and the tools they carry (the index's own and 600 it
never saw)."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from benchmarks.soak.constants import DATA

VALID, HOSTILE, DISCONNECT = "valid", "hostile", "disconnect"
# kind: (class, weight per episode, statuses a hostile request may be answered with)
KINDS: dict[str, tuple[str, float, frozenset[int]]] = {
    "normal": (VALID, 26, frozenset()),
    "known_only": (VALID, 5, frozenset()),
    "sdk": (VALID, 8, frozenset()),
    "stream": (VALID, 12, frozenset()),
    "developer": (VALID, 6, frozenset()),
    "unknown_history": (VALID, 5, frozenset()),
    "orphan_tool": (VALID, 4, frozenset()),
    "bad_arguments": (VALID, 4, frozenset()),
    "content_parts": (VALID, 3, frozenset()),
    "many_unknown": (VALID, 2.5, frozenset()),
    "novel_unknown": (VALID, 0.4, frozenset()),
    "odd_upstream": (VALID, 3, frozenset()),
    "sdk_stream": (VALID, 6, frozenset()),
    "allowed": (VALID, 5, frozenset()),
    "bad_json": (HOSTILE, 3, frozenset({400})),
    "wrong_types": (HOSTILE, 3, frozenset({400})),
    "traversal": (HOSTILE, 2, frozenset({400, 404})),
    "oversized": (HOSTILE, 0.3, frozenset({413})),
    "big_value": (HOSTILE, 0.3, frozenset({200, 400, 413, 422})),
    "outcome_bad": (HOSTILE, 1.5, frozenset({400, 401, 403, 404, 413, 422})),
    "nan_reward": (HOSTILE, 1, frozenset({400, 401, 403, 422})),
    "reload": (HOSTILE, 0.2, frozenset({401, 403, 404, 405})),
    "cross_token": (HOSTILE, 1.5, frozenset({403})),
    "cut_body": (DISCONNECT, 2, frozenset()),
    "cut_stream": (DISCONNECT, 2, frozenset()),
    "cut_wait": (DISCONNECT, 1, frozenset()),
}
# requests counted apart from their episode's kind
EXTRA_KINDS = {"outcome": VALID}
# a conversation: user turns, each with the tools the agent wants called in order
TEMPLATES: list[list[tuple[str, list[str]]]] = [
    [("Find me a flight from {a} to {b} {when} and book it", ["search_flights", "book_flight"])],
    [("Search flights to {b} on {day} then book the cheapest", ["search_flights", "book_flight"]),
     ("Actually cancel that booking", ["cancel_booking"])],
    [("What is the weather in {city}? Email it to {name}", ["get_weather", "send_email"])],
    [("Look up flights to {b}", ["search_flights"]), ("Tell me the weather in {b}", ["get_weather"])],
    [("Show the files here", ["list_files"])],
    [("Cancel my booking {ref}", ["cancel_booking"])],
    [("Email {name} the list of files in this folder", ["list_files", "send_email"])],
    [("Book flight {fn} for me", ["book_flight"])],
    [("Is it going to rain in {city} {when}?", ["get_weather"])],
]
SLOTS = {
    "a": ["SFO", "LAX", "SEA", "BOS", "ORD"], "b": ["JFK", "Denver", "Boston", "Miami", "Austin", "Paris"],
    "when": ["tomorrow", "next week", "tonight", "on Monday"], "day": ["Friday", "Saturday", "the 3rd"],
    "city": ["Paris", "Rome", "Oslo", "Lima", "Tokyo", "Denver"], "name": ["Bob", "Alice", "Chen", "Priya"],
    "ref": ["BK-1042", "BK-77", "ZX-9"], "fn": ["UA 120", "DL 88", "AF 7"],
}
VERBS = ["create", "update", "delete", "get", "list", "search", "archive", "export", "import", "approve",
         "reject", "assign", "close", "reopen", "merge", "schedule", "translate", "summarize", "share", "tag"]
NOUNS = ["invoice", "ticket", "calendar_event", "contact", "repository", "pull_request", "spreadsheet",
         "document", "payment", "refund", "order", "shipment", "customer", "lead", "meeting", "note", "task",
         "project", "user_account", "password_reset", "vm_instance", "dns_record", "alert", "incident",
         "dashboard", "report", "playlist", "recipe", "expense", "timesheet"]
SYSTEMS = ["billing", "helpdesk", "CRM", "cloud", "HR", "git", "media", "finance"]


def tool_def(name: str, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {"id": {"type": "string", "description": "the object's identifier"},
                                         "note": {"type": "string", "description": "free text"}},
        "required": ["id"]}}}


def tool_pool() -> list[dict[str, Any]]:
    """600 tools the index never saw (verb x noun), in a fixed shuffled order."""
    pool = [tool_def(f"{v}_{n}", f"{v.capitalize()} a {n.replace('_', ' ')} in the "
                                 f"{SYSTEMS[(i * 7 + j) % len(SYSTEMS)]} system")
            for i, v in enumerate(VERBS) for j, n in enumerate(NOUNS)]
    random.Random(0).shuffle(pool)
    return pool


def known_tools() -> list[dict[str, Any]]:
    return json.loads((DATA / "tools.json").read_text())


def fill(text: str, rng: random.Random) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: rng.choice(SLOTS[m.group(1)]), text)


# tenants: each one its own API key and company, whose name marks its messages and prefixes its tool family
COMPANIES = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"]
FAMILY_VERBS = ["create", "update", "get", "close"]


def tenant_key(tenant: int) -> str:
    return f"soak-{COMPANIES[tenant]}-key"


def family(tenant: int) -> list[dict[str, Any]]:
    """The tenant's own tools (12): ``<company>_<verb>_<noun>``, three nouns no other tenant's family has.
    Every tenant's agents carry every family, so a presentation list that one tenant's conversation made
    sticky could be shown to another (see :mod:`benchmarks.soak`); only tenant ``t``'s conversations ask
    for family ``t``."""
    co = COMPANIES[tenant]
    return [tool_def(f"{co}_{v}_{n}", f"{v.capitalize()} a {n.replace('_', ' ')} in the {co.capitalize()} "
                                      f"{SYSTEMS[(tenant + j) % len(SYSTEMS)]} account")
            for j, n in enumerate(NOUNS[3 * tenant:3 * tenant + 3]) for v in FAMILY_VERBS]


def family_turn(tenant: int, rng: random.Random) -> tuple[str, list[str]]:
    """A user turn of the tenant's own business, wanting one tool of its family."""
    co = COMPANIES[tenant]
    noun = rng.choice(NOUNS[3 * tenant:3 * tenant + 3])
    verb = rng.choice(FAMILY_VERBS)
    text = f"{verb.capitalize()} the {noun.replace('_', ' ')} #{rng.randrange(1000)} for {co.capitalize()}"
    return text, [f"{co}_{verb}_{noun}"]


def tenant_of_text(text: str, tenants: int) -> set[int]:
    """The tenants whose marker (``[<company>]``) or tools a text names."""
    return {t for t in range(tenants) if f"[{COMPANIES[t]}]" in text or f"{COMPANIES[t]}_" in text}
