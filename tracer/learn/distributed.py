"""Data-parallel encoder training on PyTorch's own engine (``torchrun --nproc_per_node N``): gloo on CPUs,
NCCL on GPUs.

Each rank embeds a contiguous shard of every batch's texts and the shards are gathered, with their gradients,
into the whole batch on every rank (:func:`gather_rows`), so the contrastive batch is the global batch and the
loss is the single process's, computed alike on every rank. Its gradient reaches each rank through the gather
W times (once from each rank's copy of the loss), so a trainer divides the loss by the world size
(:func:`world_size`) and sums the parameters' gradients over ranks (:func:`sum_gradients`): every rank then
takes the single process's step, up to the order of float sums, and the ranks' weights stay identical. One rank
writes a checkpoint (:func:`is_writer`), the others wait for it (:func:`barrier`).

Outside torchrun (no ``WORLD_SIZE`` above 1) every function is the single process's no-op.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_gather


def init_from_env() -> bool:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1): NCCL when CUDA is present (each rank on
    ``LOCAL_RANK``'s device), else gloo. Returns whether training is distributed; idempotent."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    return True


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_writer() -> bool:
    """Whether this rank writes checkpoints and run outputs (rank 0; the single process)."""
    return rank() == 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def gather_rows(encode: Callable[[Sequence[str]], torch.Tensor], texts: Sequence[str]) -> torch.Tensor:
    """``encode(texts)`` ``[B, d]`` with each rank encoding its contiguous shard of ``texts``, the shards gathered
    with their gradients (``torch.distributed.nn``) into the whole ``[B, d]`` on every rank."""
    w = world_size()
    if w == 1:
        return encode(texts)
    per = -(-len(texts) // w)  # ceil: the shards are padded to one size for the collective
    lo, hi = min(rank() * per, len(texts)), min((rank() + 1) * per, len(texts))
    mine = encode(texts[lo:hi]) if hi > lo else None                                       # [n, d]
    dim = mine.shape[1] if mine is not None else int(_dim_of(encode))
    pad = torch.zeros(per, dim, dtype=torch.float32)
    local = pad if mine is None else torch.cat([mine, pad[: per - len(mine)]])            # [per, d]
    parts = all_gather(local)                                                              # W x [per, d]
    sizes = [max(0, min((r + 1) * per, len(texts)) - r * per) for r in range(w)]
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])                                # [B, d]


def _dim_of(encode: Callable[[Sequence[str]], torch.Tensor]) -> int:
    return encode([""]).shape[1]


def sum_gradients(params: Sequence[torch.Tensor]) -> None:
    """Sum each parameter's gradient over the ranks (in place)."""
    if world_size() > 1:
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
