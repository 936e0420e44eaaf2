"""Measured: `sparselift bench` steps/s of SparseLift's plan vs TorchRec's vs round-robin.

Per workload (tiny, multihot-26, criteo-kaggle; capped by --max-rows) at 2 ranks: plan with
`sparselift optimize` (from a profile + calibration when --from-profile, else from the workload
spec), write the DLRM-reference round-robin plan, then one `sparselift bench` job of the
contenders, side by side. Target: ≥ 1.26× over TorchRec's plan. The ratios are of medians over
rounds; the last column is the median and range of each round's own ratio (a round pairs the
plans seconds apart, under the same host state), which shows how far one run can land from another.

Two TorchRec plans are measured: the planner as a trainer gets it by default (`--vs torchrec`: real
topology, no constraints — it assumes one id per sample), and the planner given the same pooling
factors and topology SparseLift plans with (`optimize --baseline-out`, its warm start).

    .venv/bin/python benchmarks/bench_optimizer_speedup.py                       # full (the lead)
    .venv/bin/python benchmarks/bench_optimizer_speedup.py --quick               # tiny, few steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from cli_steps import plan_from_profile, sh

from sparselift import plans
from sparselift.optimizer.planio import fingerprints
from sparselift.optimizer.table_stats import stats_from_spec
from sparselift.workloads.spec import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["tiny", "multihot-26", "criteo-kaggle"])
    ap.add_argument("--max-rows", type=int, default=200_000)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument(
        "--from-profile", action="store_true", help="profile → analyze → optimize --profile"
    )
    ap.add_argument("--quick", action="store_true", help="tiny only, 5 steps, 1 round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.workloads, args.steps, args.rounds = ["tiny"], 5, 1
    summary = []
    with tempfile.TemporaryDirectory(prefix="sparselift-speedup-") as tmp:
        for wl in args.workloads:
            d = Path(tmp, wl)
            d.mkdir()
            ours, rr, out = d / "sparselift.json", d / "round-robin.json", d / "bench.json"
            informed = d / "torchrec-informed.json"
            cap = ["--max-rows", str(args.max_rows)]
            if args.from_profile:
                plan_from_profile(
                    wl, args.nproc, args.max_rows, args.time_limit, d / "profile", ours, informed
                )
            else:
                sh(
                    "optimize",
                    "--workload",
                    wl,
                    *cap,
                    "--world-size",
                    str(args.nproc),
                    "--time-limit",
                    str(args.time_limit),
                    "--out",
                    str(ours),
                    "--baseline-out",
                    str(informed),
                )
            spec = load_workload(wl).capped(args.max_rows)
            # on the topology SparseLift planned for (a GPU host's, where the ranks run on GPUs)
            plans.save(
                plans.round_robin_table_wise(
                    fingerprints(stats_from_spec(spec)), plans.load(ours).topology
                ),
                rr,
            )
            sh(
                "bench",
                "--workload",
                wl,
                *cap,
                "--nproc",
                str(args.nproc),
                "--steps",
                str(args.steps),
                "--rounds",
                str(args.rounds),
                "--plan",
                str(ours),
                "--plan",
                str(informed),
                "--plan",
                str(rr),
                "--vs",
                "torchrec",
                "--json",
                str(out),
            )
            res = json.loads(out.read_text())
            by = {c["label"]: c for c in res["contenders"]}
            ours_c = next(v for k, v in by.items() if "sparselift" in k)
            sl, tr = ours_c["median"], by["torchrec"]["median"]
            tri = by[informed.name]["median"]
            rrv = next(v for k, v in by.items() if "round-robin" in k)["median"]
            # a round pairs the plans seconds apart in one job, under the same host state
            paired = [
                a / b
                for a, b in zip(ours_c["steps_per_s"], by["torchrec"]["steps_per_s"], strict=True)
            ]
            summary.append(
                dict(
                    workload=wl,
                    sparselift=sl,
                    torchrec=tr,
                    torchrec_informed=tri,
                    round_robin=rrv,
                    vs_torchrec=sl / tr,
                    vs_torchrec_informed=sl / tri,
                    vs_round_robin=sl / rrv,
                    vs_torchrec_by_round=paired,
                )
            )
    print(
        f"\n{'workload':14s} {'SparseLift':>11s} {'TorchRec':>9s} {'TR+stats':>9s} "
        f"{'round-robin':>11s} {'×TorchRec':>10s} {'×TR+stats':>10s} {'×round-robin':>12s} "
        f"{'×TorchRec by round: median (range)':>35s}"
        f"   (steps/s, {args.nproc} ranks)"
    )
    for s in summary:
        r = s["vs_torchrec_by_round"]
        print(
            f"{s['workload']:14s} {s['sparselift']:11.2f} {s['torchrec']:9.2f} "
            f"{s['torchrec_informed']:9.2f} "
            f"{s['round_robin']:11.2f} {s['vs_torchrec']:10.3f} {s['vs_torchrec_informed']:10.3f} "
            f"{s['vs_round_robin']:12.3f} {statistics.median(r):16.3f} "
            f"({min(r):.3f} – {max(r):.3f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
