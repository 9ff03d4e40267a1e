"""Data-parallel encoder training on PyTorch's own engine (``torchrun --nproc_per_node N``): gloo for CPU
tensors, NCCL for CUDA tensors.

Every rank draws the same seeded batches. Each rank embeds a contiguous shard of every batch's columns
(anchors, positives, partner contexts) and the shards are gathered, with their gradients, into the whole
columns on every rank (:func:`gather_columns`), so the contrastive batch is the global batch and every rank
computes the single process's loss. That loss's gradient reaches each rank's shard through the gather W times
(the gather's backward sums the ranks' copies), so a trainer divides the loss by the world size
(:func:`world_size`) and sums the parameters' gradients over ranks (:func:`sum_gradients`): every rank then
takes the single process's step, up to the order of float sums, and the ranks' weights stay identical. This is
what DistributedDataParallel does for a loss that is a sum over its rows; a contrastive loss is not one, hence
the gather. One rank writes a checkpoint (:func:`is_writer`); the others wait for it (:func:`barrier`) and
check the cache after it (:func:`writer_first`), so every rank returns the same folder.

Outside torchrun (no ``WORLD_SIZE`` above 1) every function is the single process's no-op.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_gather

T = TypeVar("T")
Columns = Sequence[Sequence[str]]


def init_from_env() -> bool:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1). With CUDA each rank takes
    ``LOCAL_RANK``'s device and CUDA tensors go through NCCL, CPU tensors (the static table trains on the CPU)
    through gloo; without CUDA, gloo. Returns whether training is distributed; idempotent."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
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


def writer_first(fn: Callable[[], T]) -> T:
    """``fn()`` on the writer, then on the other ranks once it returned: a cache check that may move a damaged
    folder aside runs once, and every rank then sees the same cache."""
    if world_size() == 1:
        return fn()
    value = fn() if is_writer() else None
    barrier()
    return value if is_writer() else fn()


def world_key() -> dict[str, int]:
    """A checkpoint key's entry for the world size: empty in the single process (its keys stay what they
    were); under torchrun the float sums run in another order and each rank draws its own dropout, so what N
    ranks train is an artifact of its own, reproducible at that N."""
    w = world_size()
    return {"world_size": w} if w > 1 else {}


def rank_seed(seed: int) -> int:
    """The seed of this rank's own randomness (dropout over its shard): ``seed`` on rank 0, as in the single
    process, a distinct one on each other rank, so the shards do not share dropout masks."""
    return seed + rank() * 1_000_003


def _shard(n: int, r: int, w: int) -> tuple[int, int, int]:
    """Rank ``r``'s rows ``[lo, hi)`` of ``n`` split in ``w`` contiguous shards of ``per`` rows (the last ones
    shorter or empty), and ``per``."""
    per = -(-n // w)  # ceil: the shards are padded to one size for the collective
    return min(r * per, n), min((r + 1) * per, n), per


def gather_columns(encode: Callable[[Columns], list[torch.Tensor]], columns: Columns, dim: int,
                   device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """``encode(columns)``, one ``[n_c, dim]`` tensor of ``dtype`` per column, with each rank encoding its
    contiguous shard of every column (one call, over the columns whose shard is not empty) and the shards
    gathered with their gradients (``torch.distributed.nn``) into the whole columns on every rank."""
    w = world_size()
    if w == 1:
        return encode(columns)
    spans = [_shard(len(col), rank(), w) for col in columns]
    todo = [c for c, (lo, hi, _) in enumerate(spans) if hi > lo]
    mine = dict(zip(todo, encode([columns[c][spans[c][0]:spans[c][1]] for c in todo]))) if todo else {}
    out = []
    for c, col in enumerate(columns):
        per = spans[c][2]
        # an empty shard still takes part in the gather's backward, so it is a leaf that wants a gradient
        pad = torch.zeros(per, dim, dtype=dtype, device=device, requires_grad=c not in mine)
        local = torch.cat([mine[c], pad[: per - len(mine[c])]]) if c in mine else pad          # [per, d]
        parts = all_gather(local)                                                              # W x [per, d]
        sizes = [hi - lo for lo, hi, _ in (_shard(len(col), r, w) for r in range(w))]
        out.append(torch.cat([p[:n] for p, n in zip(parts, sizes)]))                           # [n_c, d]
    return out


def gather_rows(encode: Callable[[Sequence[str]], torch.Tensor], texts: Sequence[str], dim: int,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`gather_columns` of one column: ``encode(texts)`` ``[B, dim]``, each rank encoding its shard."""
    return gather_columns(lambda cols: [encode(cols[0])], [texts], dim, device, dtype)[0]


def sum_gradients(params: Sequence[torch.Tensor]) -> None:
    """Sum each parameter's gradient over the ranks, in place, in one collective. A parameter whose gradient
    is None on some ranks only (their shards never reached it) takes zeros there; one that no rank reached
    keeps None, as in the single process."""
    if world_size() == 1:
        return
    params = list(params)
    if not params:
        return
    has = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)  # [P]
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    live = [p for p, h in zip(params, has.tolist()) if h]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not live:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in live])                                     # [sum numel]
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for p, g in zip(live, flat.split([p.numel() for p in live])):
        p.grad.copy_(g.view_as(p.grad))
