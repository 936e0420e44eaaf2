"""Collect one picklable object per rank on rank 0, or pass it through when not distributed."""

from __future__ import annotations

from typing import Any


def gather_to_rank0(obj: Any, group: Any = None) -> list[Any] | None:
    """Gather `obj` of every rank of `group` on its rank 0.

    Every rank must call this once, at the same point of its run.

    Returns:
        On rank 0 the objects in rank order; None on the other ranks; `[obj]` when not
        distributed (or a group of one).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return [obj]
    rank = dist.get_rank(group)
    out: list[Any] | None = [None] * dist.get_world_size(group) if rank == 0 else None
    dist.gather_object(
        obj, out, dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group
    )
    return out
