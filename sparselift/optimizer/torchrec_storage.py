"""TorchRec's storage estimate, replicated: what its planner says one shard needs, and the budget
per rank it compares the shards against.

SparseLift's memory model must be at least as conservative as the reference planner's: a plan
that TorchRec's planner would refuse as out of memory must not ship on an unmeasured assumption.
These are pure functions of the table's shape and statistics, the option class, the batch and the
topology, so the counts can take them per (table, class) without running TorchRec (and without
importing it: the counts are made for thousands of tables). `torchrec_referee.storage_verdicts`
runs TorchRec's own code on whole plans; the tests hold the two to the same bytes.

What is replicated (torchrec 1.8), for the planner as `torchrec_baseline` runs it (an
EmbeddingBagCollection of tables of their weight types, one ParameterConstraints per table with
its pooling factors, the default estimators and `HeuristicalStorageReservation(0.15)`):
- per shard: `torchrec.distributed.planner.shard_estimators.calculate_shard_storages`: the
  shard's share of the weights (no optimizer state: the planner's tensors carry no optimizer
  class), UVM caching's cache (load factor × weights) and its auxiliary state
  (`_calculate_cache_aux_state_sizes`: rows × (4 + 16 × load factor)), plus the input and output
  buffers of `_calculate_shard_io_sizes` (int64 ids, pooled outputs in the table's element size) as
  `calculate_pipeline_io_cost` charges them. Which train pipeline a plan runs is not known when a
  shard is counted, so the larger of the two SparseLift can run is taken: no pipeline
  (input + output) and the sparse-dist pipeline (2 × input);
- the budget: `torchrec.distributed.planner.storage_reservations.HeuristicalStorageReservation`
  keeps 15 % of HBM, the dense modules' storage (none: the planner is given the tables alone) and
  the KJT storage (`_get_kjt_storage`: 20 copies of a batch of int64 ids of every feature).

No profile measures memory today (a calibration fits times only), so on CUDA the floor always
applies; a measured memory figure would be the one thing allowed to replace it.

CPU topologies keep SparseLift's own model. TorchRec's estimate there charges each shard's
input and output buffers to host memory and reserves the KJT storage from it, but keeps no share
of it free; SparseLift keeps 30 % of a rank's host memory free (cpu-gloo), which holds those
buffers unless a batch's pooled outputs come near that reserve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from sparselift.optimizer.space import CW, DP, RW, TW, TWRW, UVM_CACHING, OptionClass
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology

ID_DTYPE_BYTES = 8  # torchrec.distributed.planner.constants.BIGINT_DTYPE: ids as int64
RESERVED_HBM_SHARE = 0.15  # EmbeddingShardingPlanner's heuristical_storage_reservation_percentage
KJT_COPIES = 20  # HeuristicalStorageReservation: "2 pipelined batches each with 10 internal copies"
DEFAULT_CACHE_LOAD_FACTOR = 0.2  # torchrec.distributed.planner.constants.UVM_CACHING_RATIO


class ShardStorage(NamedTuple):
    """Bytes TorchRec's storage estimate charges one shard: on the device and in host memory."""

    hbm: int
    ddr: int


def _pooling_factors(t: TableStats) -> list[float]:
    """The per-feature pooling factors TorchRec is given (`planner_constraints`)."""
    nf = max(1, len(t.feature_names))
    return [t.ids_per_sample / nf] * nf


def _batch_inputs_outputs(t: TableStats, batch_size: int) -> tuple[float, float]:
    """(ids, output rows) of one rank's batch for table `t`, summed over its features, in the
    order `_calculate_*_shard_io_sizes` sums them (num_poolings 1.0; a sequence table's outputs
    are its ids, unpooled)."""
    pfs = _pooling_factors(t)
    inputs = sum([x * 1.0 * batch_size for x in pfs])
    if t.sequence:
        return inputs, inputs
    outputs = sum([min(1.0, x) * 1.0 * batch_size for x in pfs])
    return inputs, outputs


def shard_shape(t: TableStats, c: OptionClass, topo: Topology) -> tuple[int, int]:
    """The (rows, columns) of the largest shard of table `t` under class `c`, as `planio` lays
    shards out (row blocks of ceil(rows / n), equal column blocks).

    Raises:
        ValueError: an unknown sharding type.
    """
    n, d = t.num_embeddings, t.embedding_dim
    if c.sharding_type in (DP, TW):
        return n, d
    if c.sharding_type == CW:
        return n, d // c.shards
    if c.sharding_type == RW:
        return -(-n // topo.world_size), d
    if c.sharding_type == TWRW:
        return -(-n // topo.local_world_size), d
    raise ValueError(f"unknown sharding type {c.sharding_type}")


def _io_sizes(
    t: TableStats, c: OptionClass, topo: Topology, batch_size: int, cols: int
) -> tuple[int, int]:
    """(input, output) bytes of one shard: `_calculate_shard_io_sizes` for a non-empty shard."""
    W, L = topo.world_size, topo.local_world_size
    inputs, outputs = _batch_inputs_outputs(t, batch_size)
    if c.sharding_type == DP:
        return (
            math.ceil(inputs * ID_DTYPE_BYTES),
            math.ceil(outputs * t.embedding_dim * t.weight_bytes),
        )
    if c.sharding_type == RW:
        inputs = inputs / W
    elif c.sharding_type == TWRW:
        inputs = inputs / L
    if t.sequence:  # a row per id the shard receives
        outputs = inputs
    return (
        math.ceil(inputs * W * ID_DTYPE_BYTES),
        math.ceil(outputs * W * cols * t.weight_bytes),
    )


def shard_storage(topo: Topology, batch_size: int, t: TableStats, c: OptionClass) -> ShardStorage:
    """TorchRec's storage estimate of the largest shard of table `t` under class `c` on a CUDA
    topology: `calculate_shard_storages` as the planner calls it (see the module), its I/O cost
    the larger of no pipeline's and the sparse-dist pipeline's.

    Args:
        topo: the target topology (CUDA).
        batch_size: samples per rank.
        t: the table's statistics.
        c: the option class.
    Returns:
        The shard's HBM and host-memory bytes.
    Raises:
        ValueError: a CPU topology (TorchRec's estimate is not used there), or an unknown
            sharding type.
    """
    if topo.device != "cuda":
        raise ValueError("TorchRec's storage estimate is used for CUDA topologies only")
    n, d = t.num_embeddings, t.embedding_dim
    rows, cols = shard_shape(t, c, topo)
    tensor_bytes = math.ceil(n * d * t.weight_bytes)  # the table's element size, as TorchRec's
    cached = c.kernel == UVM_CACHING
    clf = DEFAULT_CACHE_LOAD_FACTOR if c.cache_load_factor is None else c.cache_load_factor
    hbm_storage = round(tensor_bytes * clf) if cached else tensor_bytes
    ddr_storage = tensor_bytes if cached else 0

    def tensor_size(storage: int) -> int:  # `_calculate_tensor_sizes`
        if c.sharding_type == DP:
            return storage
        return math.ceil(storage * (rows * cols) / (n * d))

    aux = math.ceil(rows * (4 + clf * 16)) if cached else 0  # `_calculate_cache_aux_state_sizes`
    io_in, io_out = _io_sizes(t, c, topo, batch_size, cols) if rows * cols else (0, 0)
    io = max(io_in + io_out, 2 * io_in)  # `calculate_pipeline_io_cost`: NONE, TRAIN_SPARSE_DIST
    return ShardStorage(hbm=aux + tensor_size(hbm_storage) + io, ddr=tensor_size(ddr_storage))


def kjt_reservation(batch_size: int, stats: Iterable[TableStats]) -> int:
    """HBM bytes TorchRec's `HeuristicalStorageReservation` keeps on every rank for the inputs
    (`_get_kjt_storage`: 20 copies of a batch of int64 ids of every feature)."""
    batch_inputs = [x * batch_size for t in stats for x in _pooling_factors(t)]
    return math.ceil(sum(batch_inputs) * float(ID_DTYPE_BYTES)) * KJT_COPIES


def hbm_budget(topo: Topology, batch_size: int, stats: Iterable[TableStats]) -> int:
    """HBM bytes per rank the tables may use: SparseLift's usable HBM, and on CUDA no more than
    what TorchRec's planner leaves its shards (`HeuristicalStorageReservation(0.15)` of the
    topology's HBM: 15 % kept, then the KJT storage; no dense modules).

    Why: a plan must fit the reference planner's budget as well as SparseLift's reserve, since
    no profile measured the memory either one assumes.

    Args:
        topo: the target topology.
        batch_size: samples per rank.
        stats: every table of the model.
    Returns:
        The budget (on CPU `topo.usable(topo.hbm_bytes)`, unchanged; on CUDA 0 when the inputs
        alone take all of TorchRec's, where its planner refuses the model).
    """
    usable = topo.usable(topo.hbm_bytes)
    if topo.device != "cuda":
        return usable
    torchrec = int((1 - RESERVED_HBM_SHARE) * topo.hbm_bytes) - kjt_reservation(batch_size, stats)
    return max(0, min(usable, torchrec))
