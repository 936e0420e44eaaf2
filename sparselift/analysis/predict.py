"""Step time of a plan that was not profiled: calibration × the plan's per-rank work.

This is the analysis-side reference predictor used by `benchmarks/bench_prediction.py` to check the
calibration against measurement; the optimizer's incremental cost model
(`sparselift/optimizer/cost_model.py`) is meant to compute the same per-rank terms.
Work per rank comes from the plan's shards and the profile's access statistics (ids per table and
source rank): ids·dim looked up, bytes of ids sent, bytes of pooled embeddings moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from sparselift.analysis.calibration import Calibration

ID_BYTES = 8  # int64 ids and lengths in KJT all-to-alls
EMB_BYTES = 4  # fp32 pooled embeddings


@dataclass
class Prediction:
    step_time_s: float
    per_rank: pd.DataFrame  # rank, lookup_fwd, lookup_bwd, input_dist, output_dist_fwd, output_dist_bwd, dp_allreduce, sparse_s


def plan_shards(plan: Any) -> pd.DataFrame:
    """A sparselift Plan (object or dict) → table, sharding_type, rank, rows, cols per shard."""
    d = plan.to_dict() if hasattr(plan, "to_dict") else plan
    dims = {t["name"]: t for t in d["model"]["tables"]}
    rows = []
    for t in d["tables"]:
        if t["sharding_type"] == "data_parallel" or not t.get("shards"):
            for r in t.get("ranks") or range(d["topology"]["world_size"]):
                rows.append((t["name"], t["sharding_type"], r, dims[t["name"]]["num_embeddings"],
                             dims[t["name"]]["embedding_dim"]))
        for s in t.get("shards") or []:
            rows.append((t["name"], t["sharding_type"], s["rank"], s["sizes"][0], s["sizes"][1]))
    return pd.DataFrame(rows, columns=["table", "sharding_type", "rank", "rows", "cols"])


def work_per_rank(shards: pd.DataFrame, stats: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """x per (rank, kind, group): the contract's units, estimated from plan + access stats."""
    ids = stats.groupby(["table", "rank"])["ids"].mean()  # ids per step in rank's batch
    batch = float(stats["batch_size"].iloc[0])
    num_rows = stats.groupby("table")["num_embeddings"].first()
    rows = []
    for t, g in shards.groupby("table"):
        st = g["sharding_type"].iloc[0]
        n_shards = len(g)
        ids_src = {r: float(ids.get((t, r), 0.0)) for r in range(world_size)}
        ids_total = sum(ids_src.values())
        for s in g.itertuples():
            if st == "data_parallel":
                rows.append((s.rank, "lookup", st, ids_src[s.rank] * s.cols))
                rows.append((s.rank, "dp_allreduce", st, s.rows * s.cols * EMB_BYTES))
                continue
            share = s.rows / float(num_rows.get(t, s.rows)) if st in ("row_wise", "table_row_wise") else 1.0
            rows.append((s.rank, "lookup", st, ids_total * share * s.cols))
            rows.append((s.rank, "output_dist_fwd", st, world_size * batch * s.cols * EMB_BYTES))
            # backward: all-to-all of the same gradients; row-wise all-gathers the rank's own batch
            bwd = batch if st in ("row_wise", "table_row_wise") else world_size * batch
            rows.append((s.rank, "output_dist_bwd", st, bwd * s.cols * EMB_BYTES))
        if st != "data_parallel":
            copies = n_shards if st in ("column_wise", "table_column_wise") else 1
            len_copies = n_shards
            for r in range(world_size):
                rows.append((r, "input_dist", st, ids_src[r] * ID_BYTES * copies + batch * ID_BYTES * len_copies))
    return pd.DataFrame(rows, columns=["rank", "kind", "group", "x"]).groupby(["rank", "kind", "group"])["x"].sum().reset_index()


def predict(cal: Calibration, plan: Any, stats: pd.DataFrame, world_size: int | None = None) -> Prediction:
    """Predicted step time: dense_step_s + the slowest rank's modelled sparse path."""
    shards = plan if isinstance(plan, pd.DataFrame) else plan_shards(plan)
    world = world_size or cal.world_size
    w = work_per_rank(shards, stats, world)
    out = []
    for r in range(world):
        wr = w[w["rank"] == r]
        row: dict[str, Any] = {"rank": r}
        lk = wr[wr["kind"] == "lookup"]
        for kind in ("lookup_fwd", "lookup_bwd"):
            f = cal.ops.get(kind)
            row[kind] = sum(f.cost(x) for x in lk["x"]) if f else 0.0
        for kind in ("input_dist", "output_dist_fwd", "output_dist_bwd"):
            f = cal.ops.get(kind)
            d = wr[wr["kind"] == kind]
            row[kind] = f.cost(d["x"].sum(), groups=float(len(d))) if f is not None and len(d) else 0.0
        f = cal.ops.get("dp_allreduce")
        dp = wr[wr["kind"] == "dp_allreduce"]["x"].sum()
        row["dp_allreduce"] = f.b_s * dp * (1 - f.overlap) if f is not None and dp else 0.0
        row["sparse_s"] = sum(row[k] for k in ("lookup_fwd", "lookup_bwd", "input_dist", "output_dist_fwd",
                                               "output_dist_bwd", "dp_allreduce"))
        out.append(row)
    per = pd.DataFrame(out)
    return Prediction(step_time_s=cal.dense_step_s + float(per["sparse_s"].max()), per_rank=per)
