"""Cutting a shallower student out of a BERT-style sentence-transformers model, in place, before it is
fine-tuned: :func:`keep_layers` drops whole transformer layers. The result saves as a plain Hugging Face
checkpoint (``num_hidden_layers`` in its config), so the torch, ONNX and static paths load it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def keep_layers(model: SentenceTransformer, layers: Sequence[int]) -> None:
    """Cut the model down to the given transformer layers, in place (their order kept; the saved config then
    says ``num_hidden_layers = len(layers)``)."""
    net = model[0].auto_model
    # a Hugging Face model's architecture is read, not a tracer contract: BERT, RoBERTa, MPNet and their kin
    # share no base class that declares encoder.layer, so the stack is looked for and its absence refused
    stack = getattr(getattr(net, "encoder", None), "layer", None)
    if not isinstance(stack, torch.nn.ModuleList):
        raise TypeError(f"encoder_training.layers: the base model ({type(net).__name__}) has no BERT-style "
                        f"encoder.layer stack to cut")
    if max(layers) >= len(stack):
        raise ValueError(f"encoder_training.layers {list(layers)}: the base model has {len(stack)} layers "
                         f"(indices 0-{len(stack) - 1})")
    net.encoder.layer = torch.nn.ModuleList(stack[i] for i in sorted(layers))  # the base's order
    net.config.num_hidden_layers = len(layers)
