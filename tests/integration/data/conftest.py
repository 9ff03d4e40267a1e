"""Fixtures of the BFCL loader tests (test_bfcl.py, test_bfcl_execution.py): the dataset, loaded and
executed once per test module, and its trajectories by id."""

from __future__ import annotations

import pytest

from tracer.data import load_dataset


@pytest.fixture(scope="module")
def ds():
    return load_dataset("bfcl")


@pytest.fixture(scope="module")
def by_id(ds):
    return {t.id: t for t in ds.trajectories}
