"""What a lookup feeds (``zero_shot.dataflow``): the edges read from schemas, the ranking they give a step,
and a cold index presenting the consumer of a lookup, batched, live and saved."""

from __future__ import annotations

import numpy as np
import pytest
from plus_hand import cold_pair, live_and_saved, traj

from tracer.core.steps import extract_all
from tracer.core.types import Registry, Step, Tool
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.tracer_plus.dataflow import Dataflow, identifier_words, looked_up
from tracer.scorers.tracer_plus.zero_shot import ZeroShot, dataflow_rrf

CONTEXT = {"window": "since_user", "calls": "none", "results": "none"}


def schema(*names: str, required: tuple[str, ...] | None = None) -> dict:
    out = {"type": "object", "properties": {n: {"type": "string"} for n in names}}
    return out if required is None else {**out, "required": list(required)}


def test_identifier_words_and_what_a_lookup_yields():
    assert identifier_words(Tool("t", parameters=schema("user_id", "address"))) == {"user"}
    assert identifier_words(Tool("t", parameters=schema("orderIds", "access_token", "zip"))) == \
        {"order", "access", "token"}
    assert identifier_words(Tool("t", parameters=schema("token"))) == {"token"}
    # the required parameters when the schema names them, else every property
    assert identifier_words(Tool("t", parameters=schema("user_id", "item_id", required=("item_id",)))) == \
        {"item"}
    assert identifier_words(Tool("t", parameters=schema("stock", "id"))) == set()  # an id of nothing named
    assert identifier_words(Tool("t", parameters={"properties": "not a mapping"})) == set()
    # a malformed "required" (not a list) is ignored: every property is read
    assert identifier_words(Tool("t", parameters={**schema("order_id"), "required": "user_id"})) == {"order"}
    assert looked_up(Tool("find_user_id_by_email")) == {"user", "email"}
    assert looked_up(Tool("GetUserToken")) == {"user", "token"}
    assert looked_up(Tool("get_order_details")) == {"order"}
    assert looked_up(Tool("cancel_pending_order")) == set()  # no lookup: yields nothing


REGISTRY = Registry([
    Tool("find_user_id_by_email", parameters=schema("email"), source="shop"),                      # 0
    Tool("get_user_details", parameters=schema("user_id"), source="shop"),                         # 1
    Tool("modify_user_address", parameters=schema("user_id", "address"), source="shop"),           # 2
    Tool("get_order_details", parameters=schema("order_id"), source="shop"),                       # 3
    Tool("cancel_order", parameters=schema("order_id", "reason"), source="shop"),                  # 4
    Tool("GetUserToken", parameters=schema("username", "password"), source="bank"),               # 5
    Tool("QueryBalance", parameters=schema("token"), source="bank"),                               # 6
    Tool("get_user", parameters=schema("name"), source="crm"),                                     # 7
    Tool("crm_update_user", parameters=schema("user_id"), source="crm"),                           # 8
    Tool("get_order", parameters=schema("symbol")),                                                # 9
    Tool("place_order", parameters=schema("order_id")),                                            # 10
])


def test_a_lookup_feeds_the_tools_of_its_toolkit_taking_an_identifier_of_what_it_yields():
    flow = Dataflow(REGISTRY)
    got = {REGISTRY[a].name: [REGISTRY[c].name for c in ids] for a, ids in enumerate(flow.consumers)
           if len(ids)}
    assert got == {
        "find_user_id_by_email": ["get_user_details", "modify_user_address"],  # not crm's: another toolkit
        "get_user_details": ["modify_user_address"],                            # never itself
        "get_order_details": ["cancel_order"],
        "GetUserToken": ["QueryBalance"],
        "get_user": ["crm_update_user"],
    }  # get_order has no named toolkit: no edge to place_order
    assert all(ids.dtype == np.int64 for ids in flow.consumers)


def test_dataflow_rrf_ranks_the_consumers_of_the_last_known_call_by_vector_score():
    flow = Dataflow(REGISTRY)
    vec = np.tile(np.linspace(0.0, 0.9, len(REGISTRY)), (5, 1))
    vec[1, 2] = -np.inf                                   # modify_user_address not retrieved in step 1
    histories = [("GetUserToken", "find_user_id_by_email", "unknown"), ("find_user_id_by_email",),
                 ("cancel_order",), (), ("get_stock_info",)]
    steps = [Step("t", "t", 0, 0, (), h, "x", ()) for h in histories]
    got = dataflow_rrf(steps, vec, REGISTRY, flow, k=0)
    assert got.dtype == np.float32
    want = np.zeros((5, len(REGISTRY)), np.float32)
    want[0, [2, 1]] = [1.0, 0.5]                          # the last call known: higher vector score first
    want[1, 1] = 1.0
    assert np.array_equal(got, want)                      # no lookup, no call, no toolkit: nothing


def test_a_cold_index_presents_what_the_lookup_feeds_live_as_batched_and_keeps_it_on_disk(
        keyword_embedder, tmp_path):
    registry = Registry([
        Tool("find_user_id_by_email", "Find the user id by email", schema("email"), source="shop"),
        Tool("get_user_details", "Get the details of a user", schema("user_id"), source="shop"),
        Tool("send_email", "Send an email message", schema("to", "body"), source="mail"),
        Tool("search_flights", "Search flights", schema("origin"), source="travel"),
        Tool("get_weather", "Get the weather", schema("city"), source="weather")])
    res = Resources.build(registry, keyword_embedder, device="cpu", seed=0)
    alone = {"kind": "hybrid", "guard": True, "toolkit": False, "calls": False}  # dataflow the only signal
    on, off = cold_pair(res, CONTEXT, {**alone, "dataflow": True}, {**alone, "dataflow": False})
    steps = extract_all([traj("t", ("email me about the weather and flights",
                                    ("find_user_id_by_email", "get_user_details")))])
    vec = fallback_scores(res, on.embed(steps)[1]).numpy()                             # [B, N]
    want = off.score(steps).fallback.numpy() + dataflow_rrf(steps, vec, registry, Dataflow(registry), 60)
    assert np.array_equal(on.score(steps).fallback.numpy(), want)
    details = registry.id("get_user_details")
    on_presented, off_presented = (finalize(sc.score(steps), 2).presented for sc in (on, off))
    assert on_presented[0] == off_presented[0]                              # no lookup yet
    assert details in on_presented[1] and details not in off_presented[1]   # after it, its consumer
    live, loaded, reloaded = live_and_saved(on, steps, 2, tmp_path / "index", keyword_embedder)
    assert live == on_presented == reloaded and loaded.zero.dataflow


def test_a_config_without_dataflow_keeps_it_off_and_a_bad_value_is_refused():
    assert ZeroShot.from_config({"kind": "hybrid", "toolkit": True, "calls": True}).dataflow is False
    assert ZeroShot("hybrid", dataflow=True).fuses and ZeroShot("vector", dataflow=True).fuses
    with pytest.raises(TypeError, match="dataflow must be a bool"):
        ZeroShot("hybrid", dataflow=1)
