"""The search space: which ways of running each table exist on the target topology.

An `OptionClass` is a table's sharding type, compute kernel, cache size and shard count, without
the ranks; a `Choice` adds where its shards go. Classes are enumerated only where TorchRec can run
them on that device (no UVM caching on CPU; table-row-wise only with several hosts and never for
an EmbeddingCollection's table; column shards that FBGEMM can run: a multiple of 4 columns, at
least 16) and dominated classes are pruned with a stated reason, which keeps the CP-SAT model
small:
- the dense kernel only for data-parallel: TorchRec's sharder offers model-parallel tables only
  fused kernels and `sparselift.plans` refuses anything else, so a dense table-wise plan could not
  load (the cost model still prices the dense kernel's whole-table optimizer pass for DP);
- UVM caching only for tables whose weights take ≥ 2% of a rank's usable HBM — smaller ones fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology

DP, TW, RW, CW, TWRW = "data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise"
DENSE, FUSED, UVM_CACHING = "dense", "fused", "fused_uvm_caching"
CACHE_LOAD_FACTORS = (0.05, 0.2)
CW_SHARDS = (2, 4, 8)
MIN_CW_COLS = 16

# Where a class's shards live: "all" (DP / RW, same load on every rank), "rank" (TW / CW: k shards,
# each on a chosen rank), "host" (TWRW: the ranks of one chosen host).
LOCATED = {DP: "all", RW: "all", TW: "rank", CW: "rank", TWRW: "host"}


@dataclass(frozen=True)
class PlanWide:
    """The plan-wide decisions: collective precision (forward / backward) and train pipeline."""

    forward: str = "fp32"
    backward: str = "fp32"
    pipeline: str = "base"


@dataclass(frozen=True, order=True)
class OptionClass:
    """One way to run a table, without its ranks: sharding type, kernel, shards, cache size."""

    sharding_type: str
    kernel: str
    shards: int = 1  # CW: column shards (on distinct ranks); TW / TWRW: 1; DP / RW: world size
    cache_load_factor: float | None = None

    @property
    def located(self) -> str:
        """Where its shards live: "all", "rank" or "host" (see LOCATED)."""
        return LOCATED[self.sharding_type]

    @property
    def label(self) -> str:
        """A short name: type/kernel[/shards][/clf<factor>]."""
        s = f"{self.sharding_type}/{self.kernel}"
        if self.sharding_type == CW:
            s += f"/{self.shards}"
        if self.cache_load_factor is not None:
            s += f"/clf{self.cache_load_factor:g}"
        return s


@dataclass(frozen=True, order=True)
class Choice:
    """A class plus its placement: the ranks of TW/CW shards, or the host of a TWRW table."""

    cls: OptionClass
    ranks: tuple[int, ...] = ()
    host: int | None = None

    def plan_ranks(self, topo: Topology) -> list[int]:
        """The ranks the plan file lists for it: every rank (DP, RW), the host's (TWRW) or the
        shards' (TW, CW).

        Raises:
            ValueError: a table-row-wise choice without a host.
        """
        if self.cls.sharding_type == DP:
            return list(range(topo.world_size))
        if self.cls.sharding_type == RW:
            return list(range(topo.world_size))
        if self.cls.sharding_type == TWRW:
            if self.host is None:
                raise ValueError(f"a {TWRW} choice needs a host")
            lo = self.host * topo.local_world_size
            return list(range(lo, lo + topo.local_world_size))
        return list(self.ranks)


def enumerate_classes(t: TableStats, topo: Topology, batch_size: int) -> list[OptionClass]:
    """Every class table `t` can run as on `topo` (see the module for what is pruned), sorted.

    Args:
        t: the table.
        topo: the target topology.
        batch_size: samples per rank (unused today: no class depends on it).
    Returns:
        The classes; memory is not checked here (`feasibility`).
    """
    w, gpu = topo.world_size, topo.device == "cuda"
    cap = topo.usable(topo.hbm_bytes) if gpu else 0
    big = gpu and topo.has_uvm and t.num_embeddings * t.embedding_dim * 4 >= 0.02 * cap

    def kernels(sharding_type: str, shards: int = 1) -> list[OptionClass]:
        out = [OptionClass(sharding_type, FUSED, shards)]
        if big:
            out += [OptionClass(sharding_type, UVM_CACHING, shards, f) for f in CACHE_LOAD_FACTORS]
        return out

    classes = kernels(TW)
    if w > 1:
        classes.append(OptionClass(DP, DENSE, w))
        classes += kernels(RW, w)
        for k in CW_SHARDS:
            cols = t.embedding_dim // k
            if k <= w and t.embedding_dim % k == 0 and cols % 4 == 0 and cols >= MIN_CW_COLS:
                classes += kernels(CW, k)
    if topo.num_hosts > 1 and not t.sequence:  # TorchRec shards no EmbeddingCollection TWRW
        classes += kernels(TWRW, topo.local_world_size)
    return sorted(classes)
