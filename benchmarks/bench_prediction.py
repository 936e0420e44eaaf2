"""Does the calibration predict plans it never saw, and rank them as they measure?

Per workload (tiny, multihot-26 and criteo-kaggle, rows capped), on 2 CPU ranks:
1. profile TorchRec's plan under the base and the sparse-dist pipeline and at 16-bit collectives,
   and calibrate on the three (`analyze BASE SPARSE_DIST BASE_16BIT`, as `tune` starts from: the
   pipeline's overlap and the quantize cost measured);
2. plan with `optimize --profile` (SparseLift's plan), and take TorchRec's plan, round-robin
   table-wise, and three one-decision neighbours of SparseLift's plan (the other pipeline, the
   other comm precision, its heaviest table moved: `plan_set.neighbours`) — six plans;
3. profile every plan `--repeats` times in interleaved passes (A B C … A B C), each pass timing
   steady steps after its window;
4. predict every plan with the optimizer's cost model (`predict_plan`, what the solver minimizes)
   from the calibration of step 1, and compare with the measured steady step (median over the
   passes of each pass's median after the window, slowest rank).

Targets: |predicted − measured| ≤ 10 % for ≥ 90 % of the plans, and the predicted order of the
plans matches the measured order (Kendall τ ≥ 0.8, per workload and pooled). Also printed: the
pairs the measurement itself orders (their pass ranges do not overlap) and how many of them the
prediction orders alike; pairs inside each other's noise cannot confirm or refute a ranking.

    .venv/bin/python benchmarks/bench_prediction.py                       # 3 workloads
    .venv/bin/python benchmarks/bench_prediction.py --workloads tiny --repeats 1   # quick
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from cli_steps import sh
from plan_set import neighbours

from sparselift.tune import sixteen_bit_copy

ROOT = Path(__file__).resolve().parents[1]
MAX_ROWS = {"tiny": None, "multihot-26": 200_000, "criteo-kaggle": 200_000}


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's τ-a of two equally long sequences (ties count as neither)."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    s = sum(
        (1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 if (a[i] - a[j]) * (b[i] - b[j]) < 0 else 0)
        for i, j in pairs
    )
    return s / len(pairs) if pairs else 1.0


def resolved_pairs(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(pairs predicted in the measured order, pairs the measurement orders): a pair is ordered
    by the measurement when one plan's slowest pass is faster than the other's fastest."""
    agree = resolved = 0
    for a, b in itertools.combinations(rows, 2):
        lo, hi = (a, b) if max(a["passes_s"]) < min(b["passes_s"]) else (b, a)
        if max(lo["passes_s"]) < min(hi["passes_s"]):
            resolved += 1
            agree += lo["predicted_s"] < hi["predicted_s"]
    return agree, resolved


def _common(workload: str, max_rows: int | None) -> list[str]:
    return ["--workload", workload, *(["--max-rows", str(max_rows)] if max_rows else [])]


def profile(
    plan: Path, out: Path, common: list[str], args: argparse.Namespace, pipeline: str | None = None
) -> None:
    """`sparselift profile` of `plan` into `out` (steady steps timed after the window)."""
    sh(
        "profile",
        *common,
        "--nproc",
        str(args.nproc),
        "--plan",
        str(plan),
        *(["--pipeline", pipeline] if pipeline else []),
        "--steps",
        str(args.steps),
        "--after",
        str(args.after),
        "--no-execution-trace",
        "--out",
        str(out),
        "--force",
        log=sys.stderr,
    )


def make_plans(work: Path, common: list[str], args: argparse.Namespace) -> dict[str, Path]:
    """Calibrate on TorchRec's plan (both pipelines), then write the six plans; name → file."""
    from sparselift import plans
    from sparselift.optimizer.coefficients import coefficients, load_calibration
    from sparselift.optimizer.cost_model import CostModel
    from sparselift.optimizer.table_stats import stats_from_profile
    from sparselift.optimizer.topology import profiled_topology

    torchrec, rr, ours = work / "torchrec.json", work / "round_robin.json", work / "sparselift.json"
    world = ["--world-size", str(args.nproc)]
    sh("plan", "from-torchrec", *common, *world, "--out", str(torchrec), log=sys.stderr)
    sh("plan", "round-robin", *common, *world, "--out", str(rr), log=sys.stderr)
    base, sd, half = work / "calib", work / "calib-sparse-dist", work / "calib-16bit"
    profile(torchrec, base, common, args, "base")
    profile(torchrec, sd, common, args, "sparse-dist")
    profile(Path(sixteen_bit_copy(str(torchrec), work)), half, common, args, "base")
    sh("analyze", str(base), str(sd), str(half), log=sys.stderr)
    opt = ["--time-limit", str(args.time_limit), "--out", str(ours)]
    sh("optimize", "--profile", str(base), *opt, log=sys.stderr)
    out = {"sparselift": ours, "torchrec": torchrec, "round_robin": rr}
    cal = load_calibration(base / "calibration.json")
    stats, batch = stats_from_profile(base)
    topo = profiled_topology(cal, str(base))
    model = CostModel(topo, batch, coefficients(topo, cal))
    for i, (label, p) in enumerate(neighbours(plans.load(ours), stats, model)[:3]):
        path = work / f"neighbour{i}.json"
        plans.save(p, path)
        out[f"n{i}: {label}"] = path
    return out


def measure(
    named: dict[str, Path], work: Path, common: list[str], args: argparse.Namespace
) -> dict[str, list[float]]:
    """Each plan's steady step per interleaved pass (median after the window, slowest rank)."""
    from sparselift.analysis.compare import steady_steps

    steps: dict[str, list[float]] = {name: [] for name in named}
    for r in range(args.repeats):
        for i, (name, plan) in enumerate(named.items()):
            out = work / f"plan{i}" / f"pass{r}"
            profile(plan, out, common, args)
            steps[name].append(steady_steps(out).median_s)
    return steps


def run_workload(workload: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """The six plans of one workload: predicted and measured steady step, error."""
    from sparselift import plans
    from sparselift.optimizer.coefficients import load_calibration
    from sparselift.optimizer.predict import predict_plan
    from sparselift.optimizer.table_stats import stats_from_profile
    from sparselift.optimizer.topology import profiled_topology

    common = _common(workload, MAX_ROWS.get(workload))
    named = make_plans(work, common, args)
    measured = measure(named, work, common, args)
    base = work / "calib"
    cal = load_calibration(base / "calibration.json")
    stats, batch = stats_from_profile(base)
    topo = profiled_topology(cal, str(base))
    rows = []
    for name, path in named.items():
        pred = predict_plan(plans.load(path), stats, cal, topo, batch).step_time_s
        meas = statistics.median(measured[name])
        rows.append(
            dict(
                workload=workload,
                plan=name,
                predicted_s=pred,
                measured_s=meas,
                passes_s=measured[name],
                error=(pred - meas) / meas,
            )
        )
    return rows


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Print each plan's figures, each workload's τ, and the targets; return the summary."""
    print(f"{'workload':<14} {'plan':<44} {'pred. ms':>9} {'meas. ms':>9} {'passes ms':>17} error")
    taus = {}
    for wl, group in itertools.groupby(rows, key=lambda r: r["workload"]):
        g = list(group)
        for r in g:
            passes = "–".join(f"{x * 1e3:.1f}" for x in (min(r["passes_s"]), max(r["passes_s"])))
            print(
                f"{wl:<14} {r['plan'][:44]:<44} {r['predicted_s'] * 1e3:9.2f} "
                f"{r['measured_s'] * 1e3:9.2f} {passes:>17} {r['error']:+6.1%}"
            )
        taus[wl] = kendall_tau([r["predicted_s"] for r in g], [r["measured_s"] for r in g])
        agree, resolved = resolved_pairs(g)
        print(
            f"{wl:<14} Kendall τ (predicted vs measured order) {taus[wl]:.2f}; pairs the "
            f"measurement orders: {resolved} of {len(g) * (len(g) - 1) // 2}, predicted alike "
            f"{agree}"
        )
    within = sum(abs(r["error"]) <= 0.10 for r in rows)
    share = within / len(rows)
    print(
        f"within 10 %: {within}/{len(rows)} plans ({share:.0%}; target ≥ 90 %); "
        f"Kendall τ per workload {', '.join(f'{w} {t:.2f}' for w, t in taus.items())} "
        "(target ≥ 0.8)"
    )
    return {"rows": rows, "kendall_tau": taus, "within_10pct": share}


def main(argv: list[str] | None = None) -> int:
    """Run every workload, print the table and the targets, save prediction.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(MAX_ROWS))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="profiled steps per run")
    ap.add_argument("--after", type=int, default=10, help="steady steps timed after each window")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved passes over the plans")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the work here")
    args = ap.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="sparselift-bench-pred-"))
    rows = []
    for wl in args.workloads:
        d = work / wl
        d.mkdir(parents=True, exist_ok=True)
        rows += run_workload(wl, args, d)
    summary = report(rows)
    (work / "prediction.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {work / 'prediction.json'}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
