"""The parts of a request and which the turn's calls have served (tracer/scorers/tracer_plus/clauses.py)."""

from __future__ import annotations

import numpy as np

from tracer.scorers.tracer_plus.clauses import MAX_CLAUSES, open_clauses, split_clauses


def test_a_request_splits_at_sentence_ends_and_connectives():
    demo = "In my workspace, move into the documents folder and show me what files are there."
    assert split_clauses(demo) == ["In my workspace, move into the documents folder",
                                   "show me what files are there."]
    # after a sentence end the connective stays with its clause (one split a boundary)
    assert split_clauses("Book a flight to Boston. Then email Bob; also cancel my hotel") \
        == ["Book a flight to Boston.", "Then email Bob;", "also cancel my hotel"]
    assert split_clauses("get the weather, and then send it") == ["get the weather", "send it"]
    # one clause, or pieces of a single word: the whole text
    assert split_clauses("  list my files ") == ["list my files"]
    assert split_clauses("salt and pepper") == ["salt and pepper"]
    # "brand" and "thence" hold "and" and "then" inside a word: no split there
    assert split_clauses("the brand new laptop thence shipped") == ["the brand new laptop thence shipped"]


def test_a_long_request_keeps_its_first_clauses_and_reads_the_rest_as_one():
    text = ". ".join(f"do thing {i}" for i in range(MAX_CLAUSES + 3))
    parts = split_clauses(text)
    assert len(parts) == MAX_CLAUSES
    assert parts[:2] == ["do thing 0.", "do thing 1."]
    assert parts[-1] == " ".join(f"do thing {i}{'.' if i < MAX_CLAUSES + 2 else ''}"
                                 for i in range(MAX_CLAUSES - 1, MAX_CLAUSES + 3))


def test_each_call_serves_the_open_clause_it_comes_closest_to_leading():
    # tools 0..3; clause 0 is best matched by tool 1 (0.9), clause 1 by tool 3 (0.8)
    cos = np.array([[0.2, 0.9, 0.7, 0.1],
                    [0.1, 0.5, 0.6, 0.8]], dtype=np.float32)
    assert open_clauses(cos, []).tolist() == [True, True]
    # tool 2 trails clause 0's best by 0.2 and clause 1's by 0.2: the first such clause
    assert open_clauses(cos, [2]).tolist() == [False, True]
    assert open_clauses(cos, [3]).tolist() == [True, False]       # gaps -0.8 and 0: clause 1
    # a second call goes to the clause left open, whatever its gap
    assert open_clauses(cos, [3, 3]).tolist() == [False, False]
    assert open_clauses(cos, [1, 3, 0]).tolist() == [False, False]  # more calls than clauses
    assert open_clauses(np.zeros((0, 4), np.float32), [1]).tolist() == []
