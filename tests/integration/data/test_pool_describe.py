"""Registry pooling with seeded distractors, and dataset statistics."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import tool_call

from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import Dataset, load_dataset, write_native
from tracer.data.describe import describe, format_table, main
from tracer.data.paths import repo_root
from tracer.data.pool import REGISTRY_PRESETS, apply_preset, distractor_pool, pool_registry

SHARED = (repo_root() / ".." / "shared" / "datasets").is_dir()
needs_shared = pytest.mark.skipif(not SHARED, reason="shared datasets not present")


def registry(names: str | list[str], source: str) -> Registry:
    return Registry(Tool(name=n, description=f"{source} tool {n}", source=source)
                    for n in (names.split() if isinstance(names, str) else names))


def dataset(name: str, tools: Registry, trajectories=()) -> Dataset:
    return Dataset(name=name, registry=tools, trajectories=tuple(trajectories))


TARGET = dataset("target", registry("a b c", "target"),
                 [Trajectory(id="t0", group="t0", domain="d", messages=(
                     {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "tool_calls": [tool_call("a", "1")]}))])
# "b" collides with the target, "y" appears in both sources: the first source's copy is the candidate
SOURCE_1 = dataset("s1", registry("b x y z", "s1"))
SOURCE_2 = dataset("s2", registry([f"w{i}" for i in range(20)] + ["y", "c"], "s2"))


# --- pool_registry ------------------------------------------------------------------------------

def test_distractor_pool_drops_taken_names():
    pool = distractor_pool(TARGET.registry, [SOURCE_1, SOURCE_2])
    assert [t.name for t in pool] == ["x", "y", "z"] + [f"w{i}" for i in range(20)]
    assert [t.source for t in pool[:3]] == ["s1"] * 3


def test_pool_registry_reaches_size_with_originals_first():
    pooled = pool_registry(TARGET, 13, [SOURCE_1, SOURCE_2], seed=0)
    reg = pooled.registry
    assert len(reg) == 13 and reg.names[:3] == ("a", "b", "c") and list(reg[:3]) == list(TARGET.registry)
    assert len(set(reg.names)) == 13  # Registry itself refuses duplicates; checked here for clarity
    assert {t.source for t in reg[3:]} <= {"s1", "s2"}
    assert pooled.trajectories == TARGET.trajectories and pooled.name == "target"


def test_pool_registry_is_seeded_and_nested():
    first = pool_registry(TARGET, 13, [SOURCE_1, SOURCE_2], seed=0).registry
    assert pool_registry(TARGET, 13, [SOURCE_1, SOURCE_2], seed=0).registry == first
    other = pool_registry(TARGET, 13, [SOURCE_1, SOURCE_2], seed=1).registry
    assert other.names[:3] == first.names[:3] and other.names[3:] != first.names[3:]
    smaller = pool_registry(TARGET, 8, [SOURCE_1, SOURCE_2], seed=0).registry
    assert smaller.names == first.names[:8]


def test_pool_registry_limits():
    assert pool_registry(TARGET, None, [SOURCE_1], seed=0) is TARGET
    assert pool_registry(TARGET, 3, [SOURCE_1], seed=0) is TARGET
    full = pool_registry(TARGET, 3 + 23, [SOURCE_1, SOURCE_2], seed=0).registry
    assert set(full.names) == set("abcxyz") | {f"w{i}" for i in range(20)}
    assert full.get("y").source == "s1" and full.get("b").source == "target"
    with pytest.raises(ValueError, match="needs 24 distractors.*offer 23 tools"):
        pool_registry(TARGET, 27, [SOURCE_1, SOURCE_2], seed=0)
    with pytest.raises(ValueError, match="below its 3 native tools"):
        pool_registry(TARGET, 2, [SOURCE_1], seed=0)


@needs_shared
def test_pool_registry_on_real_registries():
    tau2, apibank = load_dataset("tau2"), load_dataset("apibank")
    pooled = pool_registry(tau2, 43 + 75, [apibank], seed=3)
    assert pooled.registry.names[:43] == tau2.registry.names
    assert set(pooled.registry.names[43:]) == set(apibank.registry.names)
    assert [t.source for t in pooled.registry[43:]] == [apibank.registry.get(n).source
                                                         for n in pooled.registry.names[43:]]
    with pytest.raises(ValueError, match="offer 75"):
        pool_registry(tau2, 43 + 76, [apibank], seed=3)


def test_apply_preset_with_given_sources():
    assert apply_preset("tau2", TARGET, "small", seed=0) is TARGET
    with pytest.raises(KeyError, match="valid: small, medium, large"):
        apply_preset("tau2", TARGET, "huge", seed=0)
    with pytest.raises(KeyError, match="no registry presets"):
        apply_preset("mock", TARGET, "small", seed=0)
    with pytest.raises(ValueError, match="needs 125 distractors"):
        apply_preset("tau2", TARGET, "medium", seed=0, sources=[SOURCE_1, SOURCE_2])


@needs_shared
@pytest.mark.parametrize("name, preset", [("tau2", "large"), ("apibank", "large"), ("apibank", "medium")])
def test_apply_preset_loads_its_sources(name, preset):
    ds = load_dataset(name)
    pooled = apply_preset(name, ds, preset, seed=0)
    assert len(pooled.registry) == REGISTRY_PRESETS[name][preset]
    assert pooled.registry.names[:len(ds.registry)] == ds.registry.names
    # the smallest selections fit too: one tau2 domain, API-Bank level 3 alone
    small = load_dataset("tau2", domains="telecom") if name == "tau2" else load_dataset("apibank", levels=3)
    assert len(apply_preset(name, small, preset, seed=0).registry) == REGISTRY_PRESETS[name][preset]


# --- describe -------------------------------------------------------------------------------------

def tiny() -> Dataset:
    """Two conversations of one group, with turns [a, b, c], [], [a] and [x] (before any user), [y, y]."""
    t1 = Trajectory(id="t1", group="g", domain="d", messages=(
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("a", "1")]},
        {"role": "tool", "tool_call_id": "1", "content": ""},
        # parallel
        {"role": "assistant", "content": None, "tool_calls": [tool_call("b", "2"), tool_call("c", "3")]},
        {"role": "tool", "tool_call_id": "2", "content": ""},
        {"role": "tool", "tool_call_id": "3", "content": ""},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "no call"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("a", "4")]},
    ))
    t2 = Trajectory(id="t2", group="g", domain="d", messages=(
        {"role": "assistant", "content": None, "tool_calls": [tool_call("x", "1")]},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("y", "2")]},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("y", "3")]},
    ))
    return Dataset(name="tiny", registry=registry("a b c x y z", "t"), trajectories=(t1, t2),
                   skipped={"r": 2})


def test_describe_tiny_by_hand():
    # turns: t1 [a,b,c] [] [a]; t2 [x] [y,y] -> 5 turns, 4 with calls, 7 steps.
    # turn-opening steps: a, a, x, y -> 4 of 7. Steps per active turn 7/4, per turn 7/5.
    assert describe(tiny()) == {
        "name": "tiny", "conversations": 2, "groups": 1, "turns": 5, "active_turns": 4, "steps": 7,
        "tools": 6, "tools_called": 5, "steps_per_active_turn": 1.75, "steps_per_turn": 1.4,
        "opening_share": 4 / 7, "max_calls_per_turn": 3, "toolkit_share": 1.0, "skipped": {"r": 2},
        "repeat_share": 1 / 7,  # t2's second y; t1's last a repeats a call of an earlier turn, not of its own
    }
    # every tool in toolkit "t"; after a first call: b (after a), c (b), a (c), y (x), y (y)
    def kits(**source):
        return replace(tiny(), registry=Registry(replace(t, source=source.get(t.name, "t"))
                                                 for t in tiny().registry))
    assert describe(kits(c="k3"))["toolkit_share"] == 3 / 5       # b -> c and c -> a leave the toolkit
    assert describe(kits(a="", b="", c="", x="", y=""))["toolkit_share"] == 0.0  # unnamed: no toolkit


def test_format_table():
    lines = format_table([describe(tiny())]).splitlines()
    assert lines[0] == ("| dataset | conversations | groups | turns | steps | tools | steps/turn (turns with "
                        "calls) | steps/turn (all) | turn-opening steps | max calls in a turn | same toolkit "
                        "as the last call | repeats the turn's last call | skipped |")
    assert lines[1] == "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    assert lines[2] == "| tiny | 2 | 1 | 5 | 7 | 6 | 1.75 | 1.40 | 0.57 | 3 | 1.00 | 0.14 | r: 2 |"


@needs_shared
def test_describe_tau2_retail():
    d = describe(load_dataset("tau2", domains="retail"))
    # README: 112 tasks with actions, 550 actions, at most 13 per task, 15 distinct tools; one user turn each
    assert ((d["conversations"], d["groups"], d["turns"], d["active_turns"], d["steps"])
            == (112, 112, 112, 112, 550))
    assert (d["tools"], d["tools_called"], d["max_calls_per_turn"]) == (16, 15, 13)
    assert d["steps_per_active_turn"] == d["steps_per_turn"] == 550 / 112
    assert d["opening_share"] == 112 / 550
    assert d["skipped"] == {"tasks without agent actions": 2}


@needs_shared
def test_main_prints_a_row_per_domain_and_notes_unknown_loaders(capsys, tmp_path):
    write_native(tmp_path / "tiny", tiny().registry, tiny().trajectories)
    assert main(["tau2", "--tau2-domains", "retail,telecom", f"jsonl:{tmp_path / 'tiny'}", "nosuch"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in out[2:6]] == ["| tau2-retail", "| tau2-telecom",
                                                           "| tau2-retail+telecom",
                                                            "| tiny"]
    assert out[2].startswith("| tau2-retail | 112 | 112 | 112 | 550 | 16 | 4.91 | 4.91 | 0.20 | 13 |")
    assert out[6].startswith("nosuch: not described: no loader registered")


def test_main_reports_bad_data(capsys, tmp_path):
    assert main([f"jsonl:{tmp_path / 'missing'}"]) == 1
    assert "failed" in capsys.readouterr().err
