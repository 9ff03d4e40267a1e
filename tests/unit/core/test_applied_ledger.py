"""The applied ledger knows a trajectory by its id and its content (issue 56, defect 10), and still reads the
ledgers of ids alone that earlier indexes saved."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from builders import tiny_trajectories

from tracer.core.applied import ROW, Applied, digest
from tracer.core.store import CorruptIndex


def test_same_id_same_content_is_applied_and_other_content_is_learned_as_reused(tmp_path):
    t = tiny_trajectories()
    ledger = Applied().adding(t[:2])
    other = replace(t[2], id="t0")                                  # t0's id, t2's messages
    annotated = replace(t[1], group="renamed", metadata={"note": 1})  # what learning does not read
    split = ledger.split([t[0], other, annotated, t[3], t[3], replace(t[4], id="t3")])
    assert [x.id for x in split.fresh] == ["t0", "t3", "t3"]
    assert split.fresh[0] is other and split.already == 3          # t0 as it was, t1 annotated, t3 repeated
    assert [x.messages for x in split.reused] == [t[2].messages, t[4].messages]
    ledger = ledger.adding(split.fresh)
    ledger.save(tmp_path)
    again = Applied.load(tmp_path).split([t[0], other, t[1], t[3], replace(t[4], id="t3")])
    assert (again.fresh, again.already) == ([], 5)


def test_a_ledger_of_ids_alone_is_read_and_its_ids_stay_applied_whatever_their_content(tmp_path):
    t = tiny_trajectories()
    np.save(tmp_path / "applied.npy", np.array(sorted(digest(x.id) for x in t[:2]), dtype=np.uint64))
    old = Applied.load(tmp_path)
    split = old.split([replace(t[3], id="t0"), t[1], t[2]])
    assert [x.id for x in split.fresh] == ["t2"] and split.already == 2 and split.reused == []
    old.adding(split.fresh).save(tmp_path)
    rows = np.load(tmp_path / "applied.npy")
    assert rows.dtype == ROW and sorted(rows["content"] == 0) == [False, True, True]  # migrated, kept so
    assert Applied.load(tmp_path).split([replace(t[4], id="t1")]).already == 1


def test_an_unsorted_ledger_is_a_corrupt_index(tmp_path):
    np.save(tmp_path / "applied.npy", np.array([(2, 1), (1, 1)], dtype=ROW))
    with pytest.raises(CorruptIndex, match="applied.npy: its keys are not sorted and unique"):
        Applied.load(tmp_path)
