"""Encoder training: a typed recipe (:mod:`.recipe`, one ``configs/encoder_training/*.yaml``), the pairs it
trains on (:mod:`.pairs`), two trainers, each a short loop over loss terms (:mod:`.transformer`,
:mod:`.static`; the terms in :mod:`.losses`), and :class:`FoldEncoders`, which trains one encoder per fold and
serves it."""

from tracer.learn.encoders.fold import FoldEncoders
from tracer.learn.encoders.pairs import Pairs, training_pairs
from tracer.learn.encoders.recipe import EncoderRecipe, TrainConfig
from tracer.learn.encoders.static import trained_static
from tracer.learn.encoders.transformer import finetuned, train_info

__all__ = ["EncoderRecipe", "FoldEncoders", "Pairs", "TrainConfig", "finetuned", "train_info",
           "trained_static",
           "training_pairs"]
