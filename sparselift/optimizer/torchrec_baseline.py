"""TorchRec's planner as the baseline: the plan its EmbeddingShardingPlanner makes for the same
tables, statistics (pooling factors) and topology (memory, bandwidths), offline, as a SparseLift
plan (`sparselift.plans.from_torchrec`).

Its planner is slow on large models, so `BaselineRun` runs it in a forked child under a hard
wall-clock limit counted from the start, and several runs go side by side with the solve (the
solver reads them only when its first model is built; `optimize` compares at the end).
TorchRec's planner logging (e.g. its "topology was constructed directly" warning) is muted.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import queue
import time
from dataclasses import dataclass
from typing import Any

import torch

from sparselift import plans
from sparselift.optimizer.planio import fingerprints, plan_topology
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.plans.baselines import quiet_torchrec as quiet


def tr_topology(topo: Topology) -> Any:
    """TorchRec's planner Topology for ours (its bandwidths are bytes/ms). Build it inside
    `quiet()`: TorchRec warns about every Topology not made by its TopologyFactory."""
    from torchrec.distributed.planner import Topology as TRTopology

    kw: dict[str, Any] = dict(
        world_size=topo.world_size,
        compute_device=topo.device,
        local_world_size=topo.local_world_size,
        ddr_cap=topo.ddr_bytes,
        intra_host_bw=topo.intra_host_bw / 1e3,
        inter_host_bw=topo.inter_host_bw / 1e3,
    )
    if topo.device == "cuda":
        kw.update(hbm_cap=topo.hbm_bytes, hbm_mem_bw=topo.lookup_rate * 4 / 0.4 / 1e3)
        if topo.hbm_to_ddr_bw:
            kw.update(hbm_to_ddr_mem_bw=topo.hbm_to_ddr_bw / 1e3)
    return TRTopology(**kw)


def embedding_model(stats: list[TableStats]) -> Any:
    """The tables on the meta device (shapes only): an EmbeddingBagCollection, or where some
    are sequence tables a module holding an EmbeddingBagCollection (`ebc`, the pooled ones) and
    an EmbeddingCollection per embedding dim (`ec_<dim>`: TorchRec's holds tables of one dim),
    as TorchRec's planner sees such a model."""
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    def config(cls: Any, s: TableStats) -> Any:
        return cls(
            name=s.name,
            embedding_dim=s.embedding_dim,
            num_embeddings=s.num_embeddings,
            feature_names=list(s.feature_names or (s.name,)),
            data_type=DataType[s.data_type.upper()],
        )

    meta = torch.device("meta")
    pooled = [config(EmbeddingBagConfig, s) for s in stats if not s.sequence]
    if len(pooled) == len(stats):
        return EmbeddingBagCollection(tables=pooled, device=meta)
    model = torch.nn.Module()
    if pooled:
        model.ebc = EmbeddingBagCollection(tables=pooled, device=meta)
    for dim in sorted({s.embedding_dim for s in stats if s.sequence}):
        same = [config(EmbeddingConfig, s) for s in stats if s.sequence and s.embedding_dim == dim]
        model.add_module(f"ec_{dim}", EmbeddingCollection(tables=same, device=meta))
    return model


def planner_constraints(
    stats: list[TableStats],
    types: dict[str, list[str]] | None = None,
    kernels: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """TorchRec ParameterConstraints per table: its pooling factors, and where given the
    sharding types and compute kernels the planner may choose from."""
    from torchrec.distributed.planner.types import ParameterConstraints

    out = {}
    for s in stats:
        nf = max(1, len(s.feature_names))
        kw: dict[str, Any] = dict(pooling_factors=[s.ids_per_sample / nf] * nf)
        if types:
            kw["sharding_types"] = types[s.name]
        if kernels:
            kw["compute_kernels"] = kernels[s.name]
        out[s.name] = ParameterConstraints(**kw)
    return out


def torchrec_baseline_plan(
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    timeout_s: int | None = None,
    informed: bool = True,
    comm_precision: plans.CommPrecision | None = None,
) -> plans.Plan:
    """TorchRec's EmbeddingShardingPlanner on these tables and this topology, as a SparseLift plan.

    Args:
        stats: the tables.
        topo: the target topology.
        batch_size: samples per rank.
        timeout_s: the planner's own search limit (None: TorchRec's default).
        informed: give the planner the tables' pooling factors and our topology's memory and
            bandwidths; else it runs as a trainer calls it by default (device and world size
            only), the plan `sparselift train` uses without `--plan`.
        comm_precision: plan for collectives at that precision (a sharder with those qcomm
            codecs, as a user who enables them would give it) and keep it in the plan; None:
            fp32, TorchRec's default.
    Returns:
        The plan.
    Raises:
        PlanError: the planner found no plan (e.g. the tables do not fit), or its plan breaks a
            SparseLift check.
    """
    from sparselift.plans.to_torchrec import precision_sharders

    ptopo = plan_topology(topo)
    sh = None if comm_precision is None else precision_sharders(comm_precision, torch.device("cpu"))
    with quiet():
        sp = plans.torchrec_plan(
            embedding_model(stats),
            ptopo,
            batch_size,
            sh,
            tr_topology=tr_topology(topo) if informed else None,
            constraints=planner_constraints(stats) if informed else None,
            timeout_seconds=timeout_s,
        )
    p = plans.from_torchrec(
        sp, fingerprints(stats), ptopo, provenance={"planner": "torchrec.EmbeddingShardingPlanner"}
    )
    return p if comm_precision is None else dataclasses.replace(p, comm_precision=comm_precision)


def torchrec_best_plan(
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    timeout_s: int,
    comm_precision: plans.CommPrecision | None = None,
) -> plans.Plan:
    """TorchRec's planner given the statistics, its UniformProposer first, then its default
    proposers (GridSearch, Greedy, Greedy without depth, Uniform) until its own time limit.

    Why: at 64 ranks and more its default proposers rarely finish in minutes, and the planner's
    own limit keeps the best plan proposed so far, which can be a grid search's first few. One
    planner run with the fast proposer first has TorchRec's best plan of both (one enumeration,
    one shared proposal cache): the default proposers' plan where they finish, the uniform
    one where they time out. The limit counts from the end of TorchRec's enumeration.

    Args:
        stats, topo, batch_size, comm_precision: as `torchrec_baseline_plan` (informed).
        timeout_s: the planner's own time limit for proposing (seconds).
    Returns:
        The plan (its provenance names the proposers).
    Raises:
        PlanError: the planner found no plan.
    """
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.proposers import (
        GreedyProposer,
        GridSearchProposer,
        UniformProposer,
    )

    from sparselift.plans.to_torchrec import default_sharders, precision_sharders

    ptopo = plan_topology(topo)
    cpu = torch.device("cpu")
    sharders = (
        default_sharders() if comm_precision is None else precision_sharders(comm_precision, cpu)
    )
    with quiet():
        planner = EmbeddingShardingPlanner(
            topology=tr_topology(topo),
            batch_size=batch_size,
            constraints=planner_constraints(stats),
            proposer=[
                UniformProposer(),
                GridSearchProposer(),
                GreedyProposer(),
                GreedyProposer(use_depth=False),
                UniformProposer(),
            ],
            timeout_seconds=max(1, int(timeout_s)),
        )
        try:
            sp = planner.plan(embedding_model(stats), sharders)
        except Exception as e:  # PlannerError: e.g. the tables do not fit the topology's memory
            if type(e).__name__ == "PlannerError":
                raise plans.PlanError("torchrec planner", str(e).strip().splitlines()[0]) from None
            raise
    p = plans.from_torchrec(
        sp,
        fingerprints(stats),
        ptopo,
        provenance={"planner": "torchrec.EmbeddingShardingPlanner (uniform, then default)"},
    )
    return p if comm_precision is None else dataclasses.replace(p, comm_precision=comm_precision)


@dataclass
class BaselineOutcome:
    """What one planner run gave.

    Attributes:
        plan: TorchRec's plan, or None.
        seconds: how long it took (or ran until stopped).
        status: "ok", "timeout", or the error as text.
    """

    plan: plans.Plan | None
    seconds: float
    status: str


def _child(q: Any, args: tuple[Any, ...]) -> None:
    try:
        t0 = time.perf_counter()
        p = torchrec_baseline_plan(*args)
        q.put(("ok", p.to_dict(), time.perf_counter() - t0, time.monotonic()))
    except Exception as e:  # noqa: BLE001 - reported to the parent as text
        q.put(("error", f"{type(e).__name__}: {e}", 0.0, time.monotonic()))


class BaselineRun:
    """TorchRec's planner started now in a forked child, read once under a hard time limit.

    The limit counts from the start: a plan the child finished after it is a timeout even when
    the parent reads it later, so the outcome does not depend on what the parent did meanwhile.

    Args:
        stats, topo, batch_size, informed, comm_precision: as `torchrec_baseline_plan`.
        timeout_s: wall-clock seconds the planner may take (also its own search limit).
    """

    def __init__(
        self,
        stats: list[TableStats],
        topo: Topology,
        batch_size: int,
        timeout_s: float,
        informed: bool = True,
        comm_precision: plans.CommPrecision | None = None,
    ) -> None:
        ctx = mp.get_context("fork")
        self._queue: Any = ctx.Queue()
        self._timeout_s = timeout_s
        self._t0, self._t0_mono = time.perf_counter(), time.monotonic()
        args = (stats, topo, batch_size, max(1, int(timeout_s)), informed, comm_precision)
        self._proc = ctx.Process(target=_child, args=(self._queue, args), daemon=True)
        self._proc.start()
        self._outcome: BaselineOutcome | None = None

    def result(self) -> BaselineOutcome:
        """Wait for the plan until the limit (at once if it is past) and return the outcome;
        later calls return the same outcome."""
        if self._outcome is None:
            left = self._t0 + self._timeout_s - time.perf_counter()
            try:
                status, payload, secs, done_at = self._queue.get(timeout=max(0.0, left))
            except queue.Empty:
                status, payload, secs, done_at = "timeout", None, 0.0, None
            if done_at is not None and done_at > self._t0_mono + self._timeout_s:
                status = "timeout"
            self._stop()
            if status == "ok":
                plan = plans.Plan.from_dict(payload, "<torchrec plan>")
                self._outcome = BaselineOutcome(plan, secs, "ok")
            elif status == "timeout":
                self._outcome = BaselineOutcome(None, self._timeout_s, "timeout")
            else:
                self._outcome = BaselineOutcome(None, time.perf_counter() - self._t0, payload)
        return self._outcome

    def cancel(self) -> None:
        """Stop the child if it still runs; an outcome not read yet becomes "cancelled"."""
        if self._outcome is None:
            self._outcome = BaselineOutcome(None, time.perf_counter() - self._t0, "cancelled")
        self._stop()

    def _stop(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()


def torchrec_plan_timed(
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    timeout_s: float,
    informed: bool = True,
    comm_precision: plans.CommPrecision | None = None,
) -> tuple[plans.Plan | None, float, str]:
    """One `BaselineRun`, waited for: (plan or None, seconds, status: ok | timeout | error)."""
    out = BaselineRun(stats, topo, batch_size, timeout_s, informed, comm_precision).result()
    return out.plan, out.seconds, out.status
