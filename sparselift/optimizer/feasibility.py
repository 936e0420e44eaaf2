"""Which options fit a rank's memory, and the refusal when the tables cannot fit at all."""

from __future__ import annotations

from collections.abc import Mapping

from sparselift.errors import UserError
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PlanCost
from sparselift.optimizer.space import OptionClass, PlanWide, enumerate_classes
from sparselift.optimizer.split_options import SplitOption
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.torchrec_storage import hbm_budget

LARGEST_NAMED = 3  # tables the refusal names by size
STUCK_NAMED = 5  # tables without a fitting option it names


def feasible_classes(
    model: CostModel, stats: list[TableStats], plan_wide: PlanWide
) -> dict[str, list[OptionClass]]:
    """Each table's option classes whose own per-rank memory fits a rank.

    Args:
        model: the cost model of the target.
        stats: the tables.
        plan_wide: the collective precision the terms are priced at.
    Returns:
        Per table, its feasible classes (sorted as `enumerate_classes` gives them).
    Raises:
        UserError: some table has no class that fits a rank, or all tables' weights and
            optimizer state exceed the memory of all ranks together. The one line names what
            is needed, what is available and the largest tables.
    """
    topo = model.topo
    hbm_cap = hbm_budget(topo, model.batch_size, stats)
    ddr_cap = topo.usable(topo.ddr_bytes)
    gpu = topo.device == "cuda"
    out, stuck, smallest = {}, [], {}
    for s in stats:
        ok, least = [], float("inf")
        for c in enumerate_classes(s, topo, model.batch_size):
            own = model.terms(s, c, plan_wide).own
            if own.hbm_bytes <= (hbm_cap if gpu else float("inf")) and own.ddr_bytes <= ddr_cap:
                ok.append(c)
            least = min(least, own.hbm_bytes if gpu else own.ddr_bytes)
        if not ok:
            stuck.append(s)
            smallest[s.name] = least
        out[s.name] = ok
    total = sum(table_bytes(s) for s in stats)
    cap_total = topo.world_size * (hbm_cap + (ddr_cap if topo.has_uvm or not gpu else 0))
    if stuck or total > cap_total:
        raise UserError(_refusal(topo, stats, stuck, smallest, total, cap_total, hbm_cap))
    return out


def part_classes(
    model: CostModel, options: Mapping[str, list[SplitOption]], plan_wide: PlanWide
) -> dict[str, list[OptionClass]]:
    """Each split part's classes: those its option allows whose own per-rank memory fits a rank.

    A part without any leaves its option out (`Problem`); nothing is refused here, as the model
    tables themselves still fit (`feasible_classes`).
    """
    topo = model.topo
    hbm_cap = hbm_budget(topo, model.batch_size, [])
    ddr_cap = topo.usable(topo.ddr_bytes)
    gpu = topo.device == "cuda"
    out: dict[str, list[OptionClass]] = {}
    for opts in options.values():
        for o in opts:
            for part, types in zip(o.parts, o.sharding_types, strict=True):
                out[part.name] = [
                    c
                    for c in enumerate_classes(part, topo, model.batch_size)
                    if (not types or c.sharding_type in types)
                    and (own := model.terms(part, c, plan_wide).own).ddr_bytes <= ddr_cap
                    and (not gpu or own.hbm_bytes <= hbm_cap)
                ]
    return out


def table_bytes(s: TableStats) -> int:
    """A whole table's weights (in its type) and row-wise optimizer state (one float per row)."""
    return int(s.num_embeddings * s.embedding_dim * s.weight_bytes) + s.num_embeddings * 4


def _refusal(
    topo: Topology,
    stats: list[TableStats],
    stuck: list[TableStats],
    smallest: dict[str, float],
    total: int,
    cap_total: int,
    hbm_cap: int,
) -> str:
    gpu = topo.device == "cuda"
    ddr_cap = topo.usable(topo.ddr_bytes)
    per = hbm_cap if gpu else ddr_cap
    if topo.has_uvm:
        room = (
            f"usable HBM {format_bytes(hbm_cap)} + host memory {format_bytes(ddr_cap)} "
            f"(UVM caching) per rank × {topo.world_size} ranks = {format_bytes(cap_total)}"
        )
    else:
        mem = "HBM" if gpu else "memory"
        room = (
            f"usable {mem} {format_bytes(per)} per rank × {topo.world_size} ranks = "
            f"{format_bytes(cap_total)}"
        )
    msg = f"the tables do not fit: weights + optimizer state need {format_bytes(total)}, {room}"
    if stuck:
        first = stuck[0]
        more = f" and {len(stuck) - STUCK_NAMED} more" if len(stuck) > STUCK_NAMED else ""
        names = ", ".join(s.name for s in stuck[:STUCK_NAMED]) + more
        msg += (
            f"; no option of {names} fits one rank ({first.name}'s smallest needs "
            f"{format_bytes(smallest[first.name])} on a rank of {format_bytes(per)})"
        )
    big = sorted(stats, key=lambda s: -s.num_embeddings * s.embedding_dim)[:LARGEST_NAMED]
    return (
        msg
        + "; largest tables: "
        + ", ".join(f"{s.name} {format_bytes(table_bytes(s))}" for s in big)
    )


def format_bytes(n: float) -> str:
    """Bytes for people: MiB below a GiB, GiB below a TiB, else TiB."""
    if n < 2**30:
        return f"{n / 2**20:.1f} MiB"
    if n < 2**40:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**40:.2f} TiB"


def fits_memory(topo: Topology, cost: PlanCost, hbm: int) -> bool:
    """Whether every rank of a priced plan fits: HBM within `hbm` (CUDA), host memory within the
    topology's usable DDR."""
    ddr = topo.usable(topo.ddr_bytes)
    return all(
        (r.hbm_bytes <= hbm or topo.device != "cuda") and r.ddr_bytes <= ddr for r in cost.per_rank
    )
