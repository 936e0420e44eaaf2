"""Resource counts: what one rank does for one shard of a table under an option, before any
coefficient (bytes moved inside and between hosts, lookup work, memory).

The cost model multiplies these by the coefficients; counting apart from pricing lets a changed
coefficient re-price cached counts without counting again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparselift.kernels import (
    FLOAT_BYTES,
    ID_BYTES,
    KERNEL_UNIT,
    LENGTH_BYTES,
    LookupUnit,
    both_ends,
    footprint_far,
    lookup_work,
    ring_allreduce_bytes,
)
from sparselift.optimizer.space import CW, DENSE, DP, RW, TW, TWRW, UVM_CACHING, OptionClass
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.torchrec_storage import shard_storage


@dataclass(frozen=True)
class Counts:
    """What one rank does for one shard of a table, before any coefficient."""

    ids_intra: float = 0.0  # input_dist bytes moved inside the host
    ids_inter: float = 0.0
    lookup_x: float = 0.0  # ids·dim gathered (fwd) and scattered (bwd)
    fwd_work: float = 0.0  # lookup work units (`sparselift.kernels.lookup_work`), forward
    bwd_work: float = 0.0  # … backward + fused optimizer
    miss_x: float = 0.0  # ids·dim served from host memory (UVM cache misses)
    out_fwd_intra: float = 0.0  # fp32 bytes of pooled embeddings sent
    out_fwd_inter: float = 0.0
    out_bwd_intra: float = 0.0
    out_bwd_inter: float = 0.0
    dense_grad_x: float = 0.0  # elements a whole-table optimizer pass touches
    ar_intra: float = 0.0  # data-parallel allreduce bytes
    ar_inter: float = 0.0
    hbm: float = 0.0
    ddr: float = 0.0
    routed_ids: float = 0.0  # ids the batch transform routes to this virtual table (every rank)
    routed_features: float = 0.0  # … and split features it is charged for
    recombined_x: float = 0.0  # its pooled elements the split model's recombination reads


@dataclass(frozen=True)
class ClassCounts:
    """A table option's counts by where a rank sits (see `Terms`, which prices them)."""

    located: str
    shards: int
    own: Counts
    remote_intra: Counts
    remote_inter: Counts


def class_counts(
    topo: Topology,
    batch_size: int,
    t: TableStats,
    c: OptionClass,
    unit: LookupUnit = KERNEL_UNIT,
) -> ClassCounts:
    """What table `t` under option class `c` makes a rank do, by where the rank sits.

    On CUDA a shard's memory is at least TorchRec's storage estimate of it
    (`torchrec_storage.shard_storage`: its planner also charges the shard's input and output
    buffers and UVM caching's auxiliary state, and it charges no optimizer state), per kind of
    memory the larger of the two: no profile measures memory, and a plan that the reference
    planner says will not fit must not ship on SparseLift's assumption alone. On CPU the tables'
    memory is SparseLift's own (weights, row-wise optimizer state, dense gradients).

    Args:
        topo: the target topology.
        batch_size: samples per rank.
        t: the table's statistics.
        c: the option class.
        unit: the CPU lookup work unit (a calibration's refitted weights, else the kernel's).
    Returns:
        Counts for a rank holding a shard ("own"), one on the same host ("remote_intra") and one
        on another host ("remote_inter").
    Raises:
        ValueError: an unknown sharding type, or a UVM-cached class without a load factor.
    """
    cc = _with_transform(_sparselift_counts(topo, batch_size, t, c, unit), batch_size, t)
    if topo.device != "cuda":
        return cc
    tr = shard_storage(topo, batch_size, t, c)
    own = replace(cc.own, hbm=max(cc.own.hbm, float(tr.hbm)), ddr=max(cc.own.ddr, float(tr.ddr)))
    return replace(cc, own=own)


def _with_transform(cc: ClassCounts, batch_size: int, t: TableStats) -> ClassCounts:
    """`cc` with the batch transform of a virtual table (every rank routes its own batch's ids)
    and its part of the recombination (every rank reads its own batch's pooled block).

    A placed class's loads are counted once per shard, so each shard carries its share.
    """
    if t.split_of is None:
        return cc
    per = 1.0 / cc.shards if cc.located == "rank" else 1.0
    ids, feats = batch_size * t.ids_per_sample * per, t.routed_features * per
    pooled = batch_size * t.embedding_dim * max(1, len(t.feature_names)) * per

    def add(n: Counts) -> Counts:
        return replace(
            n,
            routed_ids=n.routed_ids + ids,
            routed_features=n.routed_features + feats,
            recombined_x=n.recombined_x + pooled,
        )

    if cc.located == "all":
        return replace(cc, own=add(cc.own))
    return replace(
        cc, own=add(cc.own), remote_intra=add(cc.remote_intra), remote_inter=add(cc.remote_inter)
    )


def _sparselift_counts(
    topo: Topology, batch_size: int, t: TableStats, c: OptionClass, unit: LookupUnit
) -> ClassCounts:
    """`class_counts` with SparseLift's own memory terms only."""
    B = batch_size
    W, L = topo.world_size, topo.local_world_size
    N, d, p = t.num_embeddings, t.embedding_dim, t.ids_per_sample
    nf = max(1, len(t.feature_names))
    idb = B * (p * ID_BYTES + nf * LENGTH_BYTES)  # one rank's ids for this table, to one shard
    # output rows per sample: one pooled row (a bag), or one row per id (an EmbeddingCollection)
    rows_out = p if t.sequence else 1.0
    gpu = topo.device == "cuda"
    copies = both_ends(topo.device) and L > 1  # gloo: bytes cost both ends (`kernels.both_ends`)
    if c.kernel == UVM_CACHING and c.cache_load_factor is None:
        raise ValueError(f"{c.label}: a UVM-cached class needs a cache load factor")
    cache_share = c.cache_load_factor or 0.0

    def memory(rows: float, cols: float) -> tuple[float, float, float]:
        """(hbm, ddr, dense_grad_x) of `rows`×`cols` weights under this kernel."""
        weights, state = rows * cols * t.weight_bytes, rows * FLOAT_BYTES
        grad = rows * cols * t.weight_bytes if c.kernel == DENSE else 0.0
        dense_x = rows * cols if c.kernel == DENSE else 0.0
        if c.kernel == UVM_CACHING:
            return cache_share * weights, weights + state, 0.0
        total = weights + state + grad
        return (total, 0.0, dense_x) if gpu else (0.0, total, dense_x)

    def miss(lookup_x: float) -> float:
        if c.kernel != UVM_CACHING:
            return 0.0
        return lookup_x * (1.0 - t.hot_share(cache_share))

    unique = t.unique

    def work(
        ids: float, uniq: float, rows: float, cols: float, bags: float = W * B
    ) -> dict[str, float]:
        dev, far = topo.device, footprint_far(uniq, rows, cols)
        return dict(
            fwd_work=lookup_work("lookup_fwd", dev, ids, uniq, cols, bags * cols, unit, far),
            bwd_work=lookup_work("lookup_bwd", dev, ids, uniq, cols, bags * cols, unit, far),
        )

    zero = Counts()
    if c.sharding_type == DP:
        hbm, ddr, _ = memory(N, d)
        ring = ring_allreduce_bytes(W, N * d * t.weight_bytes)
        grad = N * d * t.weight_bytes
        own = Counts(
            lookup_x=B * p * d,
            dense_grad_x=N * d,
            **work(B * p, unique(B * p), N, d, B * rows_out),
            ar_intra=ring if topo.num_hosts == 1 else 0.0,
            ar_inter=ring if topo.num_hosts > 1 else 0.0,
            hbm=hbm + (grad if gpu else 0.0),
            ddr=ddr + (0.0 if gpu else grad),
        )
        return ClassCounts("all", W, own, zero, zero)
    if c.sharding_type in (TW, CW):
        cols = d / c.shards
        hbm, ddr, dense_x = memory(N, cols)
        lx = W * B * p * cols
        out = B * rows_out * cols * FLOAT_BYTES
        # the shard's rank receives every other rank's ids and gradients: with ids spread over
        # many owners, the receiving side is where an all-to-all is unbalanced
        own = Counts(
            lookup_x=lx,
            miss_x=miss(lx),
            ids_intra=(L - 1) * idb,
            ids_inter=(W - L) * idb,
            out_fwd_intra=(L - 1) * out,
            out_fwd_inter=(W - L) * out,
            out_bwd_intra=(L - 1) * out,
            out_bwd_inter=(W - L) * out,
            dense_grad_x=dense_x,
            hbm=hbm,
            ddr=ddr,
            **work(W * B * p, unique(W * B * p), N, cols, W * B * rows_out),
        )
        # on gloo the other ranks of the host pay too: their ids out, the outputs and grads
        peer = Counts(ids_intra=idb, out_fwd_intra=out, out_bwd_intra=out) if copies else zero
        return ClassCounts("rank", c.shards, own, peer, zero)
    if c.sharding_type == RW:
        hbm, ddr, dense_x = memory(N / W, d)
        # to each other rank: its partial bags (W·B·d reduced and scattered), or the rows of
        # the ids it sent here (an EmbeddingCollection's all-to-all)
        out = B * d * FLOAT_BYTES * (p / W if t.sequence else 1.0)
        lx = B * p * d
        own = Counts(
            ids_intra=idb * (L - 1) / W * (2.0 if copies else 1.0),  # sent (and received)
            ids_inter=idb * (W - L) / W,
            lookup_x=lx,
            miss_x=miss(lx),
            out_fwd_intra=(L - 1) * out,
            out_fwd_inter=(W - L) * out,
            out_bwd_intra=(L - 1) * out,
            out_bwd_inter=(W - L) * out,
            dense_grad_x=dense_x,
            hbm=hbm,
            ddr=ddr,
            **work(B * p, unique(W * B * p) / W, N / W, d, B * p if t.sequence else W * B),
        )
        # gloo has no reduce-scatter: a ring all-reduce of the whole W·B·d pooled output
        if not gpu and not t.sequence:
            own = replace(
                own,
                out_fwd_intra=2.0 * (W - 1) / W * W * out if topo.num_hosts == 1 else 0.0,
                out_fwd_inter=2.0 * (W - 1) / W * W * out if topo.num_hosts > 1 else 0.0,
            )
        return ClassCounts("all", W, own, zero, zero)
    if c.sharding_type == TWRW:
        hbm, ddr, dense_x = memory(N / L, d)
        out = B * d * FLOAT_BYTES
        lx = W * B * p * d / L
        fwd_intra, fwd_inter = W * out * (L - 1) / L, (W - L) * out / L
        own = Counts(
            ids_intra=idb * (L - 1) / L * (2.0 if copies else 1.0),
            lookup_x=lx,
            miss_x=miss(lx),
            **work(W * B * p / L, unique(W * B * p) / L, N / L, d),
            out_fwd_intra=fwd_intra,
            out_fwd_inter=fwd_inter,
            out_bwd_intra=fwd_intra,
            out_bwd_inter=0.0,
            dense_grad_x=dense_x,
            hbm=hbm,
            ddr=ddr,
        )
        remote = Counts(ids_inter=idb, out_bwd_inter=out)
        return ClassCounts("host", 1, own, remote, remote)
    raise ValueError(f"unknown sharding type {c.sharding_type}")
