"""A harness hook (runs on every rank) that reports how DMP actually sharded each table.

Used by tests/test_plans_torchrec.py: it reads the sharded modules and the state dict's
ShardedTensor metadata, i.e. what TorchRec built, not the plan that was passed in.
"""

from __future__ import annotations

from typing import Any


class LayoutHook:
    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def step_begin(self, step: int) -> None:
        pass

    def step_end(self, step: int) -> None:
        pass

    def finish(self) -> dict[str, Any]:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
        from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

        model = self.ctx.model
        tables: dict[str, Any] = {}
        built: list[str] = []
        for _, m in model.named_modules():
            if isinstance(m, ShardedEmbeddingBagCollection):
                built += list(m._sharding_types)  # one input dist + lookup per type DMP built
                for name, ps in m.module_sharding_plan.items():
                    tables[name] = {
                        "sharding_type": ps.sharding_type,
                        "compute_kernel": ps.compute_kernel,
                        "ranks": list(ps.ranks or []),
                    }
        for key, w in model.state_dict().items():
            if not key.endswith(".weight") or ".embedding_bags." not in key:
                continue
            name = key.split(".embedding_bags.")[1].split(".")[0]
            if isinstance(w, ShardedTensor):
                tables[name]["global_shards"] = sorted(
                    (_rank(md), list(md.shard_offsets), list(md.shard_sizes))
                    for md in w.metadata().shards_metadata
                )
                tables[name]["local_shards"] = sorted(
                    (list(s.metadata.shard_offsets), list(s.metadata.shard_sizes))
                    for s in w.local_shards()
                )
            else:
                tables[name]["replicated_shape"] = list(w.shape)
        return {
            "tables": tables,
            "built_sharding_types": sorted(set(built)),
            "pipeline_class": type(self.ctx.pipeline).__name__,
        }


def layout(ctx: Any) -> LayoutHook:
    return LayoutHook(ctx)


def _rank(md: Any) -> int:
    """The rank a ShardedTensor shard is placed on (every shard of a DMP table has a placement)."""
    placement = md.placement
    if placement is None or placement.rank() is None:
        raise ValueError(f"shard {md} has no placement rank")
    return int(placement.rank())
