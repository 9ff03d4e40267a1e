"""The tau2 loader on the real data in ../shared/datasets/tau2 (counts from its README)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from builders import call_names

from tracer.core.errors import DataError
from tracer.core.steps import iter_calls
from tracer.data import load_dataset
from tracer.data.paths import repo_root, resolve_path
from tracer.data.tau2 import SKIP_NO_AGENT_ACTIONS, SKIP_USER_ACTIONS

TAU2 = repo_root() / ".." / "shared" / "datasets" / "tau2"

pytestmark = pytest.mark.skipif(not TAU2.is_dir(), reason="shared datasets not present")


@pytest.mark.parametrize("domain, conversations, steps, tools, distinct, skipped", [
    # README: retail 114 tasks, 550 actions, 2 tasks without actions; airline 50, 142, 7.
    ("retail", 112, 550, 16, 15, {SKIP_NO_AGENT_ACTIONS: 2}),
    ("airline", 43, 142, 14, 10, {SKIP_NO_AGENT_ACTIONS: 7}),
    # telecom small: 27 actions = 7 by the agent + 20 by the user; 14 of 20 tasks have only user actions.
    ("telecom", 6, 7, 13, 5, {SKIP_USER_ACTIONS: 20, SKIP_NO_AGENT_ACTIONS: 14}),
])
def test_tau2_domain_counts(domain, conversations, steps, tools, distinct, skipped):
    ds = load_dataset("tau2", domains=(domain,))
    assert ds.name == f"tau2-{domain}"
    assert len(ds.trajectories) == conversations
    assert len(ds.steps()) == steps
    assert len(ds.registry) == tools and {t.source for t in ds.registry} == {domain}
    assert len(set(call_names(ds))) == distinct
    assert dict(ds.skipped) == skipped
    assert ds.domains() == [domain]
    for t in ds.trajectories:
        assert t.group == t.id == f"{domain}-{t.metadata['task_id']}"
        roles = [m["role"] for m in t.messages]
        assert (roles[:2] == ["system", "user"]
                and roles[2:] == ["assistant", "tool"] * ((len(roles) - 2) // 2))
        for call_msg, tool_msg in zip(t.messages[2::2], t.messages[3::2]):
            assert len(call_msg["tool_calls"]) == 1
            assert tool_msg["tool_call_id"] == call_msg["tool_calls"][0]["id"] and tool_msg["content"] == ""


def test_tau2_messages_follow_the_task():
    ds = load_dataset("tau2", domains="retail")
    first = ds.trajectories[0]
    task = json.loads((TAU2 / "retail" / "tasks.json").read_text())[0]
    assert first.id == "retail-0"
    assert first.messages[0]["content"] == (TAU2 / "retail" / "policy.md").read_text()
    user = first.messages[1]["content"]
    assert user.startswith("Reason for call: You received your order #W2378156")
    assert "\n\nKnown info: You are Yusuf Rossi in zip code 19122." in user
    assert "\n\nUnknown info: You do not remember your email address." in user
    assert user.endswith("Task instructions: You are detail-oriented and want to make sure everything is "
                         "addressed in one go.")
    calls = [(n, a) for _, _, n, a in iter_calls(first.messages)]
    assert calls == [(a["name"], a["arguments"]) for a in task["evaluation_criteria"]["actions"]]


def test_tau2_telecom_policy_and_user_actions():
    ds = load_dataset("tau2", domains=["telecom"])
    system = ds.trajectories[0].messages[0]["content"]
    main = (TAU2 / "telecom" / "main_policy.md").read_text()
    tech = (TAU2 / "telecom" / "tech_support_manual.md").read_text()
    assert (system == f"<main_policy>\n{main}\n</main_policy>\n<tech_support_policy>\n{tech}\n"
                      "</tech_support_policy>")
    by_id = {t.metadata["task_id"]: t for t in ds.trajectories}
    overdue = by_id["[service_issue]overdue_bill_suspension[PERSONA:Easy]"]
    # gold: send_payment_request (agent), make_payment (user), resume_line (agent), reboot_device (user)
    assert [s.gold for s in load_dataset("tau2", domains="telecom").steps()
            if s.trajectory_id == overdue.id] == ["send_payment_request", "resume_line"]
    assert overdue.metadata["skipped_user_actions"] == 2
    assert Counter(call_names(ds)) == {"enable_roaming": 2, "transfer_to_human_agents": 2, "refuel_data": 1,
                                       "send_payment_request": 1, "resume_line": 1}


def test_tau2_pooled_renames_colliding_names_only():
    ds = load_dataset("tau2")
    assert ds.name == "tau2"
    assert len(ds.trajectories) == 112 + 43 + 6 and len(ds.steps()) == 550 + 142 + 7
    assert dict(ds.skipped) == {SKIP_NO_AGENT_ACTIONS: 2 + 7 + 14, SKIP_USER_ACTIONS: 20}
    assert len(ds.registry) == 16 + 14 + 13
    assert sorted(n for n in ds.registry.names if "__" in n) == [
        "airline__calculate", "airline__get_user_details", "airline__transfer_to_human_agents",
        "retail__calculate", "retail__get_user_details", "retail__transfer_to_human_agents",
        "telecom__transfer_to_human_agents"]
    assert not {"calculate", "get_user_details", "transfer_to_human_agents"} & set(ds.registry.names)
    assert ds.registry.get("airline__calculate").source == "airline"
    # every call names a registry tool, prefixed with its own domain when prefixed at all
    trajs = {t.id: t for t in ds.trajectories}
    for s in ds.steps():
        assert s.gold in ds.registry
        if "__" in s.gold:
            assert s.gold.startswith(trajs[s.trajectory_id].domain + "__")
    # the pooled calls are the single-domain calls with the colliding names renamed
    for domain in ("retail", "airline", "telecom"):
        single = load_dataset("tau2", domains=domain)
        renamed = [f"{domain}__{n}" if n in ("calculate", "get_user_details", "transfer_to_human_agents")
                   else n for n in call_names(single)]
        assert [s.gold for s in ds.steps() if s.trajectory_id.startswith(domain + "-")] == renamed
    assert Counter(call_names(ds))["retail__get_user_details"] == Counter(
        call_names(load_dataset("tau2", domains="retail")))["get_user_details"]


def test_tau2_two_domains_keep_unshared_names():
    ds = load_dataset("tau2", domains="retail,telecom")
    assert ds.name == "tau2-retail+telecom"
    assert sorted(n for n in ds.registry.names if "__" in n) == [
        "retail__transfer_to_human_agents", "telecom__transfer_to_human_agents"]
    assert "calculate" in ds.registry and "get_user_details" in ds.registry


def _copy_retail(tmp_path: Path) -> Path:
    root = tmp_path / "tau2"
    shutil.copytree(TAU2 / "retail", root / "retail")
    return root


def test_tau2_unknown_tool_names_file_task_and_field(tmp_path):
    root = _copy_retail(tmp_path)
    tasks_path = root / "retail" / "tasks.json"
    tasks = json.loads(tasks_path.read_text())
    tasks[3]["evaluation_criteria"]["actions"][1]["name"] = "no_such_tool"
    tasks_path.write_text(json.dumps(tasks))
    with pytest.raises(DataError) as err:
        load_dataset("tau2", path=root, domains="retail")
    msg = str(err.value)
    assert str(tasks_path) in msg and "record '3'" in msg and "'no_such_tool'" in msg
    assert err.value.field == "evaluation_criteria.actions[1].name" and err.value.record == "3"


def test_tau2_bad_inputs(tmp_path):
    with pytest.raises(DataError, match="directory not found"):
        load_dataset("tau2", path=tmp_path / "missing")
    root = _copy_retail(tmp_path)
    with pytest.raises(DataError, match="airline.*directory not found"):
        load_dataset("tau2", path=root, domains="retail,airline")
    with pytest.raises(ValueError, match="unknown tau2 domain"):
        load_dataset("tau2", path=root, domains="mock")
    (root / "retail" / "policy.md").unlink()
    with pytest.raises(DataError, match="policy.md.*file not found"):
        load_dataset("tau2", path=root, domains="retail")
    (root / "retail" / "tasks.json").write_text(json.dumps([{"id": "7", "user_scenario": {}}]))
    (root / "retail" / "policy.md").write_text("policy")
    with pytest.raises(DataError) as err:
        load_dataset("tau2", path=root, domains="retail")
    assert err.value.record == "7" and err.value.field == "user_scenario.instructions"


def test_relative_paths_resolve_against_cwd_then_repo_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default ../shared/... does not exist here, so the repo root is used
    assert len(load_dataset("tau2", domains="airline").trajectories) == 43
    _copy_retail(tmp_path)
    assert resolve_path("tau2") == tmp_path / "tau2"
    assert len(load_dataset("tau2", path="tau2", domains="retail").trajectories) == 112
