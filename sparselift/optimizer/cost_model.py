"""The incremental cost model: a plan's step time as a sum of per-decision terms.

A step is bulk-synchronous: every collective waits for the slowest rank, so the step time is

    dense_step + Σ_phase max_rank phase_time[rank]        (phases: input_dist, lookup_fwd,
                                                           output_dist_fwd, output_dist_bwd,
                                                           lookup_bwd, dp_allreduce)

which is ≥ the slowest rank's fwd+bwd compute plus its exposed communication, and what CP-SAT
minimizes (one max variable per phase). Each table's option contributes, to each rank, a vector of
phase times and memory bytes, depending only on whether the rank holds one of its shards ("own"),
sits on the same host as a shard ("remote_intra") or on another host ("remote_inter"). That makes
every rank's load a linear expression of the choice variables.

A collective's bytes are charged where it is unbalanced: a table-wise or column-wise shard's rank
receives every rank's ids and output gradients and sends its outputs (ids spread over many owners
leave the senders even), row-wise shards their even share.

Two caches keep it incremental: resource *counts* per (table stats, option class) — lookup work,
bytes moved intra/inter host, memory — and *terms* (counts × coefficients) per (stats, class,
coefficients, precision). A changed table's stats miss only its own entries; a changed coefficient
only re-multiplies cached counts. Fixed per-call costs (the a_s of a fit) are counted once per
sharding-type group present (one all-to-all / one TBE per group, as TorchRec batches them).

Memory per rank: weights + row-wise Adagrad state (one float per row) + the whole-table gradient of
the dense kernel / data-parallel + UVM cache in HBM (table in host memory) + the sparse-dist
pipeline's extra batch of ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from sparselift.kernels import FLOAT_BYTES, ID_BYTES, LENGTH_BYTES, expected_unique, lookup_work
from sparselift.optimizer.calibration import Coefficients
from sparselift.optimizer.space import CW, DENSE, DP, RW, TW, TWRW, UVM_CACHING, Choice, OptionClass
from sparselift.optimizer.stats import TableStats
from sparselift.optimizer.topology import Topology

PHASES = (
    "input_dist",
    "lookup_fwd",
    "output_dist_fwd",
    "output_dist_bwd",
    "lookup_bwd",
    "dp_allreduce",
)
COMPUTE_PHASES = ("lookup_fwd", "lookup_bwd")
NV = len(PHASES) + 2  # phase times, then hbm and ddr bytes
HBM, DDR = len(PHASES), len(PHASES) + 1
PRECISION_FACTOR = {"fp32": 1.0, "fp16": 0.5, "bf16": 0.5}

Vec = tuple[float, ...]


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


@dataclass(frozen=True)
class ClassCounts:
    located: str
    shards: int
    own: Counts
    remote_intra: Counts
    remote_inter: Counts


@dataclass(frozen=True)
class Terms:
    """Phase seconds and memory bytes one shard puts on a rank, by where the rank is."""

    located: str
    shards: int
    own: Vec
    remote_intra: Vec
    remote_inter: Vec


@dataclass(frozen=True)
class Globals:
    """Plan-wide decisions: collective precision and the train pipeline."""

    forward: str = "fp32"
    backward: str = "fp32"
    pipeline: str = "base"


@dataclass
class PlanCost:
    step_time_s: float
    phases_s: dict[str, float]  # max over ranks, intercepts included; input_dist as exposed
    per_rank: list[dict[str, Any]]
    dense_step_s: float
    globals: Globals = field(default_factory=Globals)

    def predicted(self) -> dict[str, Any]:
        """The plan file's `predicted` block."""
        return {
            "step_time_s": self.step_time_s,
            "per_rank": [
                {k: r[k] for k in ("rank", "compute_s", "comm_s", "memory_bytes")}
                for r in self.per_rank
            ],
        }


def group_of(cls: OptionClass) -> tuple[str, str]:
    return (cls.sharding_type, cls.kernel)


class CostModel:
    """Terms for one target (topology, per-rank batch); coefficients and precision are arguments."""

    def __init__(self, topo: Topology, batch_size: int, coeffs: Coefficients) -> None:
        self.topo, self.batch_size, self.coeffs = topo, batch_size, coeffs
        self.counts = lru_cache(maxsize=None)(self._counts)
        self._terms = lru_cache(maxsize=None)(self._terms_uncached)

    # ------------------------------------------------------------------------------ resource counts
    def _counts(self, t: TableStats, c: OptionClass) -> ClassCounts:
        topo, B = self.topo, self.batch_size
        W, L = topo.world_size, topo.local_world_size
        N, d, p = t.num_embeddings, t.embedding_dim, t.ids_per_sample
        nf = max(1, len(t.feature_names))
        idb = B * (p * ID_BYTES + nf * LENGTH_BYTES)  # one rank's ids for this table, to one shard
        gpu = topo.device == "cuda"

        def memory(rows: float, cols: float) -> tuple[float, float, float]:
            """(hbm, ddr, dense_grad_x) of `rows`×`cols` weights under this kernel."""
            weights, state = rows * cols * FLOAT_BYTES, rows * FLOAT_BYTES
            grad = rows * cols * FLOAT_BYTES if c.kernel == DENSE else 0.0
            dense_x = rows * cols if c.kernel == DENSE else 0.0
            if c.kernel == UVM_CACHING:
                return c.cache_load_factor * weights, weights + state, 0.0
            total = weights + state + grad
            return (total, 0.0, dense_x) if gpu else (0.0, total, dense_x)

        def miss(lookup_x: float) -> float:
            if c.kernel != UVM_CACHING:
                return 0.0
            return lookup_x * (1.0 - t.hot_share(c.cache_load_factor))

        def unique(draws: float) -> float:
            return expected_unique(N, t.zipf_alpha, draws)

        def work(ids: float, uniq: float, cols: float, bags: float = W * B) -> dict[str, float]:
            dev = topo.device
            return dict(
                fwd_work=lookup_work("lookup_fwd", dev, ids, uniq, cols, bags * cols),
                bwd_work=lookup_work("lookup_bwd", dev, ids, uniq, cols, bags * cols),
            )

        zero = Counts()
        if c.sharding_type == DP:
            hbm, ddr, _ = memory(N, d)
            ring = 2.0 * (W - 1) / W * N * d * FLOAT_BYTES
            grad = N * d * FLOAT_BYTES
            own = Counts(
                lookup_x=B * p * d,
                dense_grad_x=N * d,
                **work(B * p, unique(B * p), d, B),
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
            out = B * cols * FLOAT_BYTES
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
                **work(W * B * p, unique(W * B * p), cols),
            )
            return ClassCounts("rank", c.shards, own, zero, zero)
        if c.sharding_type == RW:
            hbm, ddr, dense_x = memory(N / W, d)
            out = B * d * FLOAT_BYTES
            lx = B * p * d
            own = Counts(
                ids_intra=idb * (L - 1) / W,
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
                **work(B * p, unique(W * B * p) / W, d),
            )
            if not gpu:  # gloo has no reduce-scatter: a ring all-reduce of the whole W·B·d output
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
                ids_intra=idb * (L - 1) / L,
                lookup_x=lx,
                miss_x=miss(lx),
                **work(W * B * p / L, unique(W * B * p) / L, d),
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

    # --------------------------------------------------------------------------- terms (seconds)
    def terms(self, t: TableStats, c: OptionClass, g: Globals = Globals()) -> Terms:
        return self._terms(t, c, self.coeffs, g.forward, g.backward)

    def _terms_uncached(
        self, t: TableStats, c: OptionClass, k: Coefficients, fwd: str, bwd: str
    ) -> Terms:
        cc = self.counts(t, c)
        ff, fb = PRECISION_FACTOR[fwd], PRECISION_FACTOR[bwd]

        def out(intra: float, inter: float, b: float, f: float) -> float:
            t_ = b * intra + k.inter_host_b_s * inter
            if f < 1.0:  # fewer bytes on the wire (host work per byte stays); quantize at the
                # sender and dequantize at the receiver, per element
                t_ -= (1.0 - f) * (min(b, k.wire_b_s) * intra + k.inter_host_b_s * inter)
                t_ += 2.0 * k.quantize_b_s * (intra + inter) / FLOAT_BYTES
            return t_

        def vec(n: Counts) -> Vec:
            return (
                k.input_dist.b_s * n.ids_intra + k.inter_host_b_s * n.ids_inter,
                k.lookup_fwd.b_s * n.fwd_work + k.uvm_miss_b_s * n.miss_x,
                out(n.out_fwd_intra, n.out_fwd_inter, k.output_dist_fwd.b_s, ff),
                out(n.out_bwd_intra, n.out_bwd_inter, k.output_dist_bwd.b_s, fb),
                k.lookup_bwd.b_s * n.bwd_work
                + k.uvm_miss_b_s * n.miss_x
                + k.dense_grad_b_s * n.dense_grad_x,
                (1.0 - k.dp_overlap)
                * (k.dp_allreduce.b_s * n.ar_intra + k.inter_host_b_s * n.ar_inter),
                n.hbm,
                n.ddr,
            )

        return Terms(cc.located, cc.shards, vec(cc.own), vec(cc.remote_intra), vec(cc.remote_inter))

    def intercepts(self, groups: Iterable[tuple[str, str]]) -> Vec:
        """Fixed per-call costs of the groups present: one a2a per sharding type, one TBE per kernel."""
        k = self.coeffs
        groups = set(groups)
        types = {s for s, _ in groups if s != DP}
        return (
            k.input_dist.a_s * len(types),
            k.lookup_fwd.a_s * len(groups),
            k.output_dist_fwd.a_s * len(types),
            k.output_dist_bwd.a_s * len(types),
            k.lookup_bwd.a_s * len(groups),
            (1.0 - k.dp_overlap)
            * k.dp_allreduce.a_s
            * (1 if any(s == DP for s, _ in groups) else 0),
            0.0,
            0.0,
        )

    def pipeline_buffer_bytes(self, stats: Iterable[TableStats]) -> float:
        """The sparse-dist pipeline holds one more batch of ids per rank (all tables, as received)."""
        return (
            sum(
                self.batch_size
                * self.topo.world_size
                * (s.ids_per_sample * ID_BYTES + LENGTH_BYTES)
                for s in stats
            )
            / max(1, self.topo.world_size)
            * 2
        )

    # ------------------------------------------------------------------------------ evaluation
    def rank_loads(
        self, stats: Mapping[str, TableStats], choices: Mapping[str, Choice], g: Globals = Globals()
    ) -> list[list[float]]:
        """Per rank: phase seconds (no intercepts) and memory bytes, summed over tables."""
        topo = self.topo
        W, L = topo.world_size, topo.local_world_size
        loads = [[0.0] * NV for _ in range(W)]
        for name, ch in choices.items():
            tm = self.terms(stats[name], ch.cls, g)
            if tm.located == "all":
                for q in range(W):
                    _add(loads[q], tm.own)
            elif tm.located == "host":
                for q in range(W):
                    _add(loads[q], tm.own if topo.host_of(q) == ch.host else tm.remote_inter)
            else:
                for r in ch.ranks:
                    for q in range(W):
                        if q == r:
                            _add(loads[q], tm.own)
                        elif q // L == r // L:
                            _add(loads[q], tm.remote_intra)
                        else:
                            _add(loads[q], tm.remote_inter)
        return loads

    def evaluate(
        self, stats: Mapping[str, TableStats], choices: Mapping[str, Choice], g: Globals = Globals()
    ) -> PlanCost:
        loads = self.rank_loads(stats, choices, g)
        icpt = self.intercepts(group_of(ch.cls) for ch in choices.values())
        k = self.coeffs
        phases = {ph: max(l[i] for l in loads) + icpt[i] for i, ph in enumerate(PHASES)}
        buffer = (
            self.pipeline_buffer_bytes(stats[n] for n in choices)
            if g.pipeline == "sparse-dist"
            else 0.0
        )
        if g.pipeline == "sparse-dist":
            phases["input_dist"] = (1.0 - k.pipeline_overlap) * phases[
                "input_dist"
            ] + k.pipeline_overhead_s
        step = k.dense_step_s + sum(phases.values())
        mem_index = HBM if self.topo.device == "cuda" else DDR
        per_rank = []
        for q, l in enumerate(loads):
            compute = sum(l[PHASES.index(p)] + icpt[PHASES.index(p)] for p in COMPUTE_PHASES)
            comm = sum(l[i] + icpt[i] for i, p in enumerate(PHASES) if p not in COMPUTE_PHASES)
            per_rank.append(
                {
                    "rank": q,
                    "compute_s": compute + k.dense_step_s,
                    "comm_s": comm,
                    "memory_bytes": int(l[mem_index] + buffer),
                    "hbm_bytes": int(l[HBM]),
                    "ddr_bytes": int(l[DDR] + (0 if mem_index == HBM else buffer)),
                }
            )
        return PlanCost(
            step_time_s=step,
            phases_s=phases,
            per_rank=per_rank,
            dense_step_s=k.dense_step_s,
            globals=g,
        )


def _add(acc: list[float], v: Vec) -> None:
    for i, x in enumerate(v):
        acc[i] += x


def predict_plan(
    plan: Any,
    stats: list[TableStats],
    calibration: Any,
    topology: Topology,
    batch_size: int | None = None,
) -> PlanCost:
    """Per-rank costs and step time of any plan (Plan, plan dict or path) under SparseLift's model.

    `calibration`: a calibration.json dict, a Coefficients, or None (the topology preset's defaults).
    `batch_size`: per rank; default the calibration's, else 512.
    """
    from sparselift import plans
    from sparselift.optimizer.calibration import coefficients
    from sparselift.optimizer.planio import choices_from_plan

    if not isinstance(plan, (dict, plans.Plan)):
        plan = plans.load(plan)
    coeffs = (
        calibration
        if isinstance(calibration, Coefficients)
        else coefficients(topology, calibration)
    )
    if batch_size is None:
        batch_size = (
            int((calibration or {}).get("batch_size", 512))
            if isinstance(calibration, dict)
            else 512
        )
    choices, g = choices_from_plan(plan, topology)
    by_name = {s.name: s for s in stats}
    missing = [n for n in choices if n not in by_name]
    if missing:
        from sparselift.errors import UserError

        raise UserError(f"plan tables without statistics: {', '.join(missing)}")
    return CostModel(topology, batch_size, coeffs).evaluate(by_name, choices, g)
