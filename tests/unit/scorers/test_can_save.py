"""``can_save`` is declared once, on a scorer's class, and held to the class's own ``save`` when the class is
defined (tracer/scorer_base/protocol.py): a class cannot claim to save without implementing it, nor implement
it without saying so."""

from __future__ import annotations

import pytest

from tracer.scorer_base.protocol import ScorerBase


def test_can_save_must_agree_with_the_class_save():
    with pytest.raises(TypeError, match="ClaimsToSave declares can_save = True but inherits save"):
        class ClaimsToSave(ScorerBase):
            can_save = True

            def score(self, steps):
                raise NotImplementedError

    with pytest.raises(TypeError, match="SavesSilently declares can_save = False but implements save"):
        class SavesSilently(ScorerBase):
            def score(self, steps):
                raise NotImplementedError

            def save(self, directory):
                raise NotImplementedError

    class Saves(ScorerBase):
        can_save = True

        def score(self, steps):
            raise NotImplementedError

        def save(self, directory):
            return directory

    assert Saves().save("here") == "here"


def test_a_scorer_that_cannot_save_says_so():
    class Plain(ScorerBase):
        name = "plain"

        def score(self, steps):
            raise NotImplementedError

    refused = (r"scorer 'plain' \(Plain\) cannot be saved: only scorers with can_save can "
               r"\(tracer.retriever.saveable_scorers\(\) names them\)")
    with pytest.raises(TypeError, match=refused):
        Plain().save("never_written")
