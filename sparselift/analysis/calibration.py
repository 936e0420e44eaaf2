"""Fitted cost coefficients per op kind (calibration.json, the optimizer's input).

duration_s ≈ a_s + b_s · x per op kind (units in docs/CONTRACTS.md), fitted on every rank × step
sample of the profile. Collectives are fitted on their *transfer* time (the shortest duration of the
same collective across ranks: the last rank to arrive waited least), so that waiting for a slow peer
is not mistaken for bandwidth; `overlap` is the share of the stage hidden behind other work.
`dense_step_s` is what is left of the fastest measured step (slowest rank) when the sparse path's
modelled cost is taken out, so predicting the profiled plan gives back that step time; the fastest
step is used because on a shared host other processes only ever add time.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sparselift.errors import UserError

FORMAT = "sparselift-calibration"
VERSION = 1
UNITS = {"lookup_fwd": "ids*dim", "lookup_bwd": "ids*dim", "input_dist": "bytes", "output_dist_fwd": "bytes",
         "output_dist_bwd": "bytes", "dp_allreduce": "bytes"}
DIST = ("input_dist", "output_dist_fwd", "output_dist_bwd")


@dataclass
class OpFit:
    x: str
    a_s: float
    b_s: float
    r2: float
    n: int
    overlap: float = 0.0
    groups: float = 1.0  # calls per rank and step it was fitted on (sharding-type groups)

    def cost(self, x: float, groups: float | None = None) -> float:
        """Modelled duration, exposed part only (after overlap)."""
        a = self.a_s * ((groups / self.groups) if groups is not None and self.groups else 1.0)
        return max(0.0, a + self.b_s * x) * (1.0 - self.overlap)


@dataclass
class Calibration:
    device: str
    backend: str | None
    world_size: int
    batch_size: int | None
    ops: dict[str, OpFit]
    dense_step_s: float
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "provenance": self.provenance, "device": self.device,
                "backend": self.backend, "world_size": self.world_size, "batch_size": self.batch_size,
                "ops": {k: dataclasses.asdict(v) for k, v in self.ops.items()}, "dense_step_s": self.dense_step_s}


def load_calibration(path: str | Path) -> Calibration:
    """Read calibration.json (the optimizer's entry point); UserError naming the file when bad."""
    import json

    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read calibration ({e.__class__.__name__})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise UserError(f"{p}: format is not {FORMAT!r}")
    if d.get("version") != VERSION:
        raise UserError(f"{p}: version {d.get('version')!r} not supported (expected {VERSION})")
    try:
        ops = {k: OpFit(**v) for k, v in d["ops"].items()}
        return Calibration(device=d["device"], backend=d.get("backend"), world_size=int(d["world_size"]),
                           batch_size=d.get("batch_size"), ops=ops, dense_step_s=float(d["dense_step_s"]),
                           provenance=d.get("provenance") or {})
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{p}: malformed calibration ({e})") from None


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(a, b, r2). Least squares when x varies; through the origin when it does not (or b < 0)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0:
        return 0.0, 0.0, 0.0
    if not np.any(x > 0):
        return float(y.mean()), 0.0, 0.0
    a, b = 0.0, float((x * y).sum() / (x * x).sum())
    if len(np.unique(x)) >= 3 and x.std() > 0.05 * abs(x.mean()):
        b1, a1 = np.polyfit(x, y, 1)
        if b1 >= 0 and a1 >= 0:
            a, b = float(a1), float(b1)
    pred = a + b * x
    ss = ((y - y.mean()) ** 2).sum()
    r2 = float(1 - ((y - pred) ** 2).sum() / ss) if ss > 0 else 1.0
    return a, b, r2


def samples(nodes: pd.DataFrame) -> pd.DataFrame:
    """One sample per (rank, step, kind[, sharding for lookups]): y, x, overlap inputs."""
    n = nodes.copy()
    n["sharding"] = n["sharding"].fillna("*")
    rows = []
    for (rank, step), g in n.groupby(["rank", "step"]):
        for kind in ("lookup_fwd", "lookup_bwd"):
            k = g[(g["kind"] == kind) & (g["part"] != "collective")]
            for sh, s in k.groupby("sharding"):
                rows.append(dict(rank=rank, step=step, kind=kind, group=sh, x=s["x"].sum(),
                                 y=s["dur_s"].sum(), comm=0.0, wait=0.0, compute=s["dur_s"].sum()))
        for kind in (*DIST, "dp_allreduce"):
            k = g[g["kind"] == kind]
            if k.empty:
                continue
            coll = k[k["part"] == "collective"]
            comp = k[k["part"] == "compute"]["dur_s"].sum()
            wait = k[k["part"] == "wait"]["dur_s"].sum()
            transfer = coll["transfer_s"].fillna(coll["dur_s"]).sum()
            groups = max(1, k[k["sharding"] != "*"]["sharding"].nunique())
            rows.append(dict(rank=rank, step=step, kind=kind, group=groups, x=coll["bytes"].sum(),
                             y=comp + transfer, comm=transfer, wait=min(wait, transfer), compute=comp))
    return pd.DataFrame(rows, columns=["rank", "step", "kind", "group", "x", "y", "comm", "wait", "compute"])


def fit_ops(smp: pd.DataFrame) -> dict[str, OpFit]:
    ops = {}
    for kind, s in smp.groupby("kind"):
        a, b, r2 = fit_line(s["x"].values, s["y"].values)
        tot = (s["compute"] + s["comm"]).sum()
        overlap = 0.0 if kind.startswith("lookup") or tot <= 0 else \
            float(np.clip(1 - (s["compute"] + s["wait"]).sum() / tot, 0.0, 1.0))
        groups = 1.0 if kind.startswith("lookup") else float(s["group"].mean())
        ops[kind] = OpFit(x=UNITS.get(kind, "x"), a_s=a, b_s=b, r2=r2, n=int(len(s)), overlap=overlap, groups=groups)
    return ops


def sparse_cost(smp: pd.DataFrame, ops: dict[str, OpFit]) -> pd.DataFrame:
    """Modelled sparse-path time per rank and step, from the measured x (dp_allreduce stays dense)."""
    s = smp[smp["kind"] != "dp_allreduce"].copy()
    s["cost"] = [ops[k].cost(x) for k, x in zip(s["kind"], s["x"])]
    return s.groupby(["rank", "step"])["cost"].sum().reset_index()


def calibrate(nodes: pd.DataFrame, steps: pd.DataFrame, manifest: dict[str, Any], profile: str) -> Calibration:
    """Fit every op kind present; dense_step_s closes the measured step time."""
    smp = samples(nodes)
    if smp.empty:
        raise UserError(f"{profile}: no sparse-path samples to calibrate on")
    ops = fit_ops(smp)
    cost = sparse_cost(smp, ops)
    per = steps.merge(cost, on=["rank", "step"], how="left").fillna({"cost": 0.0})
    by_step = per.groupby("step").agg(step_s=("dur_s", "max"), sparse=("cost", "max"))
    # the least-disturbed step: on a shared host, other processes only ever add time
    best = by_step["step_s"].idxmin()
    dense = float(by_step.at[best, "step_s"] - by_step.at[best, "sparse"])
    prov = {"profile": str(profile), "created_unix": time.time(),
            "manifest": {k: manifest.get(k) for k in ("versions", "workload", "world_size", "device", "backend",
                                                        "batch_size", "pipeline", "profiled_steps")},
            "samples": int(len(smp)), "step_time_s_median": float(by_step["step_s"].median()),
            "step_time_s_min": float(by_step["step_s"].min())}
    return Calibration(device=manifest.get("device") or "cpu", backend=manifest.get("backend"),
                       world_size=int(manifest["world_size"]), batch_size=manifest.get("batch_size"), ops=ops,
                       dense_step_s=max(dense, 0.0), provenance=prov)
