"""The encoder trainers' loss terms, one per module, each a callable on an :class:`EmbeddedBatch`; a trainer
sums the terms of its recipe (:func:`tracer.learn.encoders.transformer.losses_for`,
:func:`tracer.learn.encoders.static.losses_for`). A new term is one more module here and one more entry
there."""

from tracer.learn.encoders.losses.batch import EmbeddedBatch, EncoderLoss, total
from tracer.learn.encoders.losses.context_ranking import ContextRanking
from tracer.learn.encoders.losses.in_batch_ranking import InBatchRanking
from tracer.learn.encoders.losses.multiple_negatives_ranking import MultipleNegativesRanking

__all__ = ["ContextRanking", "EmbeddedBatch", "EncoderLoss", "InBatchRanking", "MultipleNegativesRanking",
           "total"]
