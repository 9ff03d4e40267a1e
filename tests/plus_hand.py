"""tracer_plus's hand-checked corpus, shared by its unit tests (tests/unit/scorers/test_tracer_plus*.py;
the ``hand`` fixture is in that folder's conftest.py).

    A: "book a flight"  -> search_flights, book_flight
    B: "book a flight"  -> search_flights, book_flight | "send email" -> send_email
    C: "weather"        -> get_weather                 | "email it"   -> send_email
"""

from __future__ import annotations

from builders import call, result

from tracer.build import build_scorer
from tracer.core.types import Trajectory
from tracer.scorer_base.ranking import finalize
from tracer.scorers.tracer_plus import TracerPlusScorer

EPS = 1e-6
USER_ONLY = {"window": "since_user", "calls": "none", "results": "none"}
FAST = {"inner_folds": 3, "max_epochs": 30, "patience": 10}


def traj(tid: str, *turns) -> Trajectory:
    msgs, i = [], 0
    for user, calls in turns:
        msgs.append({"role": "user", "content": user})
        for name in calls:
            msgs += [call(name, i), result(i)]
            i += 1
    return Trajectory(id=tid, group=tid, domain="tiny", messages=tuple(msgs))


HAND_TRAIN = [
    traj("A", ("book a flight", ["search_flights", "book_flight"])),
    traj("B", ("book a flight", ["search_flights", "book_flight"]), ("send email", ["send_email"])),
    traj("C", ("weather", ["get_weather"]), ("email it", ["send_email"])),
]
HAND_TEST = traj("D", ("weather then mail", ["get_weather"]), ("email please", ["send_email"]))


def plus(res, **cfg) -> TracerPlusScorer:
    return build_scorer("tracer_plus", **{"head": FAST, **cfg})


def cold_pair(res, context: dict, on: dict, off: dict) -> tuple[TracerPlusScorer, TracerPlusScorer]:
    """Two tracer_plus indexes fitted on no trajectory (cold), with zero-shot configs ``on`` and ``off``."""
    pair = tuple(build_scorer("tracer_plus", query_context=context, memory_context=context, head=FAST,
                              zero_shot=z) for z in (on, off))
    for sc in pair:
        sc.fit([], res)
    return pair


def live_and_saved(scorer: TracerPlusScorer, steps, k: int, directory, embedder):
    """The presented sets of ``steps`` scored one at a time (the live path), the index saved to ``directory``
    and loaded again, and the loaded index's presented sets, batched."""
    contexts = scorer.embed(steps)
    live = [scorer.select_one(s, tuple(c[i:i + 1] for c in contexts), k) for i, s in enumerate(steps)]
    scorer.save(directory)
    loaded = type(scorer).load(directory, embedder, device="cpu")
    return live, loaded, finalize(loaded.score(steps), k).presented
