"""tau2-bench tasks as gold trajectories (retail, airline, telecom; see the datasets README).

One conversation per task:

1. a system message with the domain policy (telecom: ``<main_policy>`` and ``<tech_support_policy>``
   around ``main_policy.md`` and ``tech_support_manual.md``, as tau2 builds it);
2. a user message rendered from ``user_scenario.instructions`` (reason for call, known info,
   unknown info, task instructions; absent fields and the persona left out);
3. each gold action (``evaluation_criteria.actions``) that the agent makes, in order, as one
   assistant message with one tool call, followed by a tool message with **empty content**: the
   databases are not in the data, so tool outputs cannot be reproduced.

What is left out is counted in ``Dataset.skipped``: actions with ``requestor: "user"`` (telecom's
simulated user acts on their own phone; those are not agent steps) and tasks without any agent
action (scored upstream on the database state only).

Registry: the union of the chosen domains' ``tools.json`` with ``Tool.source`` = domain. When more
than one domain is pooled, a name that exists in several of them is namespaced in *every* domain
that has it as ``{domain}__{name}`` (OpenAI names allow ``[a-zA-Z0-9_-]``), and the calls are renamed
to match. Across the three domains this renames ``calculate`` (retail, airline),
``get_user_details`` (retail, airline) and ``transfer_to_human_agents`` (all three). Names unique to
one domain, and every name when a single domain is loaded, stay as they are. Note that
``calculate`` and ``transfer_to_human_agents`` have identical descriptions and schemas in each
domain, so a pooled registry holds copies that differ by their prefix only.

Trajectory ``id`` and ``group`` are ``{domain}-{task id}`` (one trial per task); ``domain`` is the
domain.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracer.core.errors import DataError
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data.base import Dataset, register_loader
from tracer.data.native import read_json_array, read_tools
from tracer.data.paths import resolve_path

DOMAINS = ("retail", "airline", "telecom")
_TASKS_FILE = {"retail": "tasks.json", "airline": "tasks.json", "telecom": "tasks_small.json"}
_INSTRUCTION_FIELDS = (("reason_for_call", "Reason for call"), ("known_info", "Known info"),
                       ("unknown_info", "Unknown info"), ("task_instructions", "Task instructions"))
SKIP_USER_ACTIONS = "user-requestor actions"
SKIP_NO_AGENT_ACTIONS = "tasks without agent actions"


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise DataError(path, "file not found")
    return path.read_text()


def _policy(folder: Path, domain: str) -> str:
    if domain == "telecom":
        main = _read_text(folder / "main_policy.md")
        tech = _read_text(folder / "tech_support_manual.md")
        return f"<main_policy>\n{main}\n</main_policy>\n<tech_support_policy>\n{tech}\n</tech_support_policy>"
    return _read_text(folder / "policy.md")


def render_instructions(instructions: Any) -> str:
    """The user's opening message: the scenario's instruction fields as labelled paragraphs."""
    if isinstance(instructions, str):
        return instructions.strip()
    parts = []
    for key, label in _INSTRUCTION_FIELDS:
        value = instructions.get(key)
        if isinstance(value, str) and value.strip():
            parts.append(f"{label}: {value.strip()}")
    return "\n\n".join(parts)


def _parse_domains(domains: str | Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(d.strip() for d in domains.split(",")) if isinstance(domains, str) else tuple(domains)
    unknown = [d for d in chosen if d not in DOMAINS]
    if unknown or not chosen:
        raise ValueError(f"unknown tau2 domain(s) {unknown or chosen!r}; valid: {', '.join(DOMAINS)}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"tau2 domains listed twice: {chosen!r}")
    return chosen


def _load_tasks(path: Path) -> list[dict]:
    return read_json_array(path, "tasks")


def _task_trajectory(path: Path, index: int, task: Any, domain: str, registry: Registry,
                     rename: dict[str, str], policy: str, skipped: Counter) -> Trajectory | None:
    """One task's gold trajectory, or None (counted in ``skipped``) when the agent makes no call."""
    if not isinstance(task, dict) or not isinstance(task.get("id"), (str, int)):
        raise DataError(path, "task without a string id", record=f"#{index}", field="id")
    task_id = str(task["id"])
    scenario = task.get("user_scenario")
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else None
    if not isinstance(instructions, (dict, str)):
        raise DataError(path, "missing user instructions", record=task_id, field="user_scenario.instructions")
    criteria = task.get("evaluation_criteria") or {}
    actions = criteria.get("actions") if isinstance(criteria, dict) else None
    if actions is None:
        actions = []
    if not isinstance(actions, list):
        raise DataError(path, "actions must be a list", record=task_id, field="evaluation_criteria.actions")

    messages: list[dict] = [{"role": "system", "content": policy},
                            {"role": "user", "content": render_instructions(instructions)}]
    user_actions = 0
    for j, action in enumerate(actions):
        fld = f"evaluation_criteria.actions[{j}]"
        if not isinstance(action, dict) or not isinstance(action.get("name"), str):
            raise DataError(path, "action without a name", record=task_id, field=fld + ".name")
        if action.get("requestor") == "user":
            user_actions += 1
            continue
        name = action["name"]
        if name not in registry:
            raise DataError(path, f"action names {name!r}, which is not in {domain}/tools.json",
                            record=task_id, field=fld + ".name")
        args = action.get("arguments") or {}
        if not isinstance(args, dict):
            raise DataError(path, "arguments must be an object", record=task_id, field=fld + ".arguments")
        call_id = f"call_{(len(messages) - 2) // 2}"
        name = rename.get(name, name)
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": ""})

    skipped[SKIP_USER_ACTIONS] += user_actions
    if len(messages) == 2:
        skipped[SKIP_NO_AGENT_ACTIONS] += 1
        return None
    tid = f"{domain}-{task_id}"
    return Trajectory(id=tid, group=tid, domain=domain, messages=tuple(messages),
                      metadata={"task_id": task_id, "skipped_user_actions": user_actions})


@register_loader("tau2")
def load_tau2(path: str | Path = "../shared/datasets/tau2", domains: str | Iterable[str] = DOMAINS,
              name: str | None = None, **_) -> Dataset:
    """Load tau2-bench gold trajectories for the chosen domains (see the module docstring).

    Args:
        path: the ``tau2`` data folder; relative paths resolve against the cwd, then the repo root.
        domains: any of ``retail``, ``airline``, ``telecom`` (a sequence, or one comma-separated string).
        name: dataset name; default ``tau2`` for all three domains, else ``tau2-<domain>+<domain>``.
    """
    chosen = _parse_domains(domains)
    root = resolve_path(path)
    registries = {d: read_tools(resolve_path(root / d) / "tools.json", source=d) for d in chosen}
    owners = Counter(n for reg in registries.values() for n in reg.names)
    renames = {d: {n: f"{d}__{n}" for n in reg.names if owners[n] > 1} for d, reg in registries.items()}

    tools, trajectories, skipped = [], [], Counter()
    for d in chosen:
        tools += [Tool(name=renames[d].get(t.name, t.name), description=t.description,
                       parameters=t.parameters, source=d) for t in registries[d]]
        folder = root / d
        tasks_path = folder / _TASKS_FILE[d]
        policy = _policy(folder, d)
        seen: dict[str, int] = {}
        for i, task in enumerate(_load_tasks(tasks_path)):
            traj = _task_trajectory(tasks_path, i, task, d, registries[d], renames[d], policy, skipped)
            tid = str(task["id"])
            if tid in seen:
                raise DataError(tasks_path, f"duplicate task id (first at #{seen[tid]})", record=tid,
                                field="id")
            seen[tid] = i
            if traj is not None:
                trajectories.append(traj)
    if not trajectories:
        raise DataError(root, f"no task with an agent action in domains {', '.join(chosen)}")
    default_name = "tau2" if set(chosen) == set(DOMAINS) else "tau2-" + "+".join(chosen)
    return Dataset(name=name or default_name, registry=Registry(tools), trajectories=tuple(trajectories),
                   skipped={k: v for k, v in skipped.items() if v})
