"""Cutting a smaller student out of a BERT-style sentence-transformers model, in place, before it is fine-tuned.

Two cuts, which compose: :func:`keep_layers` drops whole transformer layers (depth), :func:`narrow_ffn` drops the
least-used neurons of every layer's feed-forward block (width). The feed-forward block is two thirds of a layer's
multiply-adds in MiniLM (384 -> 1536 -> 384 against the attention's four 384 x 384 projections), so narrowing it
cuts a single-text encode nearly as much as a layer does while every layer keeps its attention. Both save as plain
Hugging Face checkpoints (``num_hidden_layers``, ``intermediate_size`` in the config), so the torch, ONNX and
static paths load them unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def _layer_stack(model: SentenceTransformer, field: str) -> torch.nn.ModuleList:
    net = model[0].auto_model
    stack = getattr(getattr(net, "encoder", None), "layer", None)
    if not isinstance(stack, torch.nn.ModuleList):
        raise TypeError(f"encoder_training.{field}: the base model ({type(net).__name__}) has no BERT-style "
                        f"encoder.layer stack to cut")
    return stack


def keep_layers(model: SentenceTransformer, layers: Sequence[int]) -> None:
    """Cut the model down to the given transformer layers, in place (their order kept; the saved config then says
    ``num_hidden_layers = len(layers)``)."""
    stack = _layer_stack(model, "layers")
    if max(layers) >= len(stack):
        raise ValueError(f"encoder_training.layers {list(layers)}: the base model has {len(stack)} layers "
                         f"(indices 0-{len(stack) - 1})")
    net = model[0].auto_model
    net.encoder.layer = torch.nn.ModuleList(stack[i] for i in sorted(layers))  # the base's order
    net.config.num_hidden_layers = len(layers)


def ffn_importance(model: SentenceTransformer, texts: Sequence[str], batch_size: int = 64) -> list[torch.Tensor]:
    """Per layer, each feed-forward neuron's importance on ``texts``: its mean absolute activation (after GELU)
    over the real tokens, times the norm of its output weights, i.e. the typical size of what it adds to the
    residual stream (the activation-times-weight criterion of structured pruning). ``[I]`` per layer."""
    stack = _layer_stack(model, "ffn")
    sums = [torch.zeros(layer.intermediate.dense.out_features) for layer in stack]
    mask: list[torch.Tensor] = []  # the current batch's attention mask, [B, T], for the hooks

    def hook(i: int):
        def add(_module, _inputs, out):                                    # out: [B, T, I]
            sums[i].add_((out.abs() * mask[0][..., None]).sum((0, 1)).float().cpu())
        return add

    handles = [layer.intermediate.register_forward_hook(hook(i)) for i, layer in enumerate(stack)]
    tokens = 0.0
    try:
        with torch.no_grad():
            for j in range(0, len(texts), batch_size):
                feats = model.preprocess(list(texts[j: j + batch_size]))
                feats = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in feats.items()}
                mask[:] = [feats["attention_mask"].to(torch.float32)]
                tokens += float(mask[0].sum())
                model(feats)
    finally:
        for h in handles:
            h.remove()
    return [s / max(tokens, 1.0) * layer.output.dense.weight.detach().norm(dim=0).float().cpu()
            for s, layer in zip(sums, stack)]


def narrow_ffn(model: SentenceTransformer, size: int, texts: Sequence[str], sample: int = 1024, seed: int = 0) -> None:
    """Keep the ``size`` most important neurons of every layer's feed-forward block (:func:`ffn_importance` on up to
    ``sample`` of ``texts``, a seeded sample), in place: the two linear maps are sliced to those neurons, in their
    order, so a model narrowed to its full width is the same model. The saved config then says
    ``intermediate_size = size``."""
    stack = _layer_stack(model, "ffn")
    width = stack[0].intermediate.dense.out_features
    if not 0 < size <= width:
        raise ValueError(f"encoder_training.ffn must be between 1 and the model's feed-forward width {width}, got {size}")
    if not texts:
        raise ValueError("encoder_training.ffn: no texts to measure the feed-forward neurons on")
    texts = list(texts) if len(texts) <= sample else random.Random(seed).sample(list(texts), sample)
    slice_ffn(model, [imp.topk(size).indices.sort().values for imp in ffn_importance(model, texts)])


def slice_ffn(model: SentenceTransformer, keep: Sequence[torch.Tensor]) -> None:
    """Keep, in every layer's feed-forward block, the neurons ``keep[layer]`` (indices, one width for all layers:
    the config has one ``intermediate_size``), in place; the two linear maps are sliced to them."""
    stack = _layer_stack(model, "ffn")
    if len(keep) != len(stack) or len({len(k) for k in keep}) != 1:
        raise ValueError(f"slice_ffn: one equally long index set per layer ({len(stack)}), got lengths "
                         f"{[len(k) for k in keep]}")
    for layer, idx in zip(stack, keep):
        up, down = layer.intermediate.dense, layer.output.dense                     # [I, d] and [d, I] weights
        idx = torch.as_tensor(idx, device=up.weight.device)                          # [size]
        layer.intermediate.dense = _linear(up.weight[idx], up.bias[idx])
        layer.output.dense = _linear(down.weight[:, idx], down.bias)
    model[0].auto_model.config.intermediate_size = len(keep[0])


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> torch.nn.Linear:
    out = torch.nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight)
        out.bias.copy_(bias)
    return out
