"""Does the calibration predict plans it never saw, and rank them as they measure?

Per workload (tiny, multihot-26 and criteo-kaggle, rows capped), on 2 CPU ranks:
1. calibrate on TorchRec's plan: profile it under the base and the sparse-dist pipeline, at
   16-bit collectives and with its largest table row-wise, side by side in one job (`profile
   --also`), and `analyze` the four together (as `tune` starts from: the pipeline's overlap,
   the quantize cost and the reduce-scatter measured) — the calibration set;
2. plan with `optimize --profile` on that calibration (SparseLift's plan), and take TorchRec's
   plan, round-robin table-wise, and three one-decision neighbours of SparseLift's plan (the
   other pipeline, the other comm precision, its heaviest table moved: `plan_set.neighbours`) —
   six plans, made once, before any plan is measured;
3. `--repeats` passes. `--measure side-by-side` (the default): pass r is one job that profiles
   the calibration set again and measures the six plans side by side with it
   (`profiler.from_ranks.profile_side_by_side`: `--turns` rounds in which each of the ten
   plans takes a turn; the calibration profiles' steady steps are their turns; the six plans
   built in an order rotated a place per pass). `--measure
   separate`: pass r calibrates in a job of its own (pass 0: step 1's) and then profiles each
   plan in its own job, timing steady steps after its window, in an order rotated by one slot
   per pass. Each plan
   gets `--after` timed steps a pass, or as many as take `--after-s` seconds at the step pass
   0's calibration measured, whichever is more (short steps are timed over as long a span as
   long ones, so a few slow steps weigh alike);
4. predict each plan in pass r with the optimizer's cost model (`predict_plan`, what the solver
   minimizes) from pass r's calibration, and compare with pass r's measured step (median of the
   timed steps, slowest rank).

Why calibrated in the job it predicts: two jobs of the same plan on this host measure up to
1.3–1.5× apart (which cores their threads got, their memory layout), and a shared host's speed
drifts over minutes. A calibration from another job carries that job's speed into every
prediction; calibrated side by side with the measured plans, every plan shares the
calibration's speed, and their errors and their order are the plans', not the jobs'.
No plan is predicted from its own measurement: the calibration profiles are plans of their own
(TorchRec's plan too is profiled again as a plan), and the measured plans are not profiled.

Reported per plan: the prediction (median over the passes of the per-pass predictions), the
measured step (median over the passes), their range, the paired error (median over r of
(pred_r − meas_r) / meas_r) and, for comparison with a single calibration, the unpaired error
(pass 0's prediction against the median measured step).

Targets: paired |error| ≤ 10 % for ≥ 90 % of the plans, and the predicted order of the plans
(prediction medians) matches the measured order: Kendall τ ≥ 0.8 per workload. The measured
order is the levelled one (`levelled`: each turn's steps over that round's geometric mean, then
the median over every pass's turns), which takes out the host's drift between rounds; τ
against the raw medians is printed beside it. Also printed: the pairs the measurement itself
orders (the 95 % interval of their per-turn ratios excludes 1) and how many of them the
prediction orders alike; pairs inside each other's noise cannot confirm or refute a ranking.

    .venv/bin/python benchmarks/bench_prediction.py                       # 3 workloads
    .venv/bin/python benchmarks/bench_prediction.py --workloads tiny --repeats 1   # quick
    .venv/bin/python benchmarks/bench_prediction.py --show DIR/prediction.json     # again
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli_steps import sh
from plan_set import neighbours

from sparselift import plans
from sparselift.analysis.compare import ratio_interval, steady_steps
from sparselift.calibration import read_checked
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.table_stats import TableStats, stats_from_profile
from sparselift.optimizer.topology import Topology, profiled_topology
from sparselift.profiler.from_ranks import profile_side_by_side
from sparselift.profiler.hot_ids import HotIds, read_hot_ids
from sparselift.tune_plans import calibration_plans
from sparselift.workloads.harness import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
MAX_ROWS = {"tiny": None, "multihot-26": 200_000, "criteo-kaggle": 200_000}


@dataclass
class Calibrated:
    """One calibration set's outcome: the base profile's directory, calibration.json's object,
    the tables as profiled, the per-rank batch, the profiled topology and the hot ids."""

    base: Path
    cal: dict[str, Any]
    stats: list[TableStats]
    batch: int
    topo: Topology
    hot: dict[str, HotIds]

    def predict(self, plan: plans.Plan) -> float:
        """`plan`'s step time (s) under the cost model with this calibration."""
        return predict_plan(plan, self.stats, self.cal, self.topo, self.batch, self.hot).step_time_s


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's τ-b of two equally long sequences (as scipy's `kendalltau`): concordant less
    discordant pairs over the geometric mean of the pairs untied in each. A pair tied in the
    prediction (the same plan twice, e.g. SparseLift's plan when it is TorchRec's) orders
    nothing, so it counts in neither the sum nor the prediction's side of the scale."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    s = sum(_sign((a[i] - a[j]) * (b[i] - b[j])) for i, j in pairs)
    untied_a = sum(a[i] != a[j] for i, j in pairs)
    untied_b = sum(b[i] != b[j] for i, j in pairs)
    return s / math.sqrt(untied_a * untied_b) if untied_a and untied_b else 1.0


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def resolved_pairs(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(pairs predicted in the measured order, pairs the measurement orders): a pair is ordered
    by the measurement when the 95 % interval of the median of its per-turn ratios (each turn's
    median step of one plan over the other's, in the same round) excludes 1."""
    agree = resolved = 0
    for a, b in itertools.combinations(rows, 2):
        ratios = [x / y for x, y in zip(a["turns_s"], b["turns_s"], strict=True)]
        _, low, high = ratio_interval(ratios)
        if low > 1.0 or high < 1.0:
            resolved += 1
            agree += (a["predicted_s"] < b["predicted_s"]) == (high < 1.0)
    return agree, resolved


def levelled(turns: dict[str, list[float]]) -> dict[str, float]:
    """Each plan's median step over the turns, each turn first divided by the geometric mean of
    every plan's step in that round (then scaled back by the geometric mean of the medians).

    The plans of one round share the host's state; across rounds its speed drifts by more
    than most plans differ, so a plan's raw median carries which rounds were fast. Levelled,
    each round only says how the plans stood against each other."""
    names = list(turns)
    n = len(turns[names[0]])
    rel: dict[str, list[float]] = {k: [] for k in names}
    for t in range(n):
        mean = statistics.geometric_mean([turns[k][t] for k in names])
        for k in names:
            rel[k].append(turns[k][t] / mean)
    scale = statistics.geometric_mean([statistics.median(turns[k]) for k in names])
    return {k: statistics.median(rel[k]) * scale for k in names}


def split_half_tau(rows: list[dict[str, Any]]) -> float:
    """τ-b between the levelled order of the even rounds and that of the odd rounds: how far
    the measurement reproduces its own order, the most a prediction's τ can be expected to
    reach against it (plans inside each other's noise swap places from half to half)."""
    halves = [levelled({r["plan"]: r["turns_s"][k::2] for r in rows}) for k in (0, 1)]
    return kendall_tau(*(list(h.values()) for h in halves))


def _common(workload: str, max_rows: int | None) -> list[str]:
    return ["--workload", workload, *(["--max-rows", str(max_rows)] if max_rows else [])]


def profile(
    plan: Path,
    out: Path,
    common: list[str],
    args: argparse.Namespace,
    pipeline: str | None = None,
    extra: list[str] | None = None,
) -> None:
    """`sparselift profile` of `plan` into `out` (steady steps timed after the window); `extra`:
    more flags (`--also`: side by side)."""
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
        *(extra or []),
        "--force",
        log=sys.stderr,
    )


def calibration_set(torchrec: Path, d: Path) -> tuple[list[Path], list[Path]]:
    """The calibration set's plans (`torchrec` under base, sparse-dist, at 16-bit collectives,
    with its largest table row-wise and as a second model, as `tune` profiles its baseline;
    written into `d`) and their profile directories in `d`."""
    d.mkdir(parents=True, exist_ok=True)
    variants = calibration_plans(str(torchrec), d, baseline=str(torchrec))
    return [Path(p) for p, _ in variants], [d / f"calib{suffix}" for _, suffix in variants]


def analyzed(dirs: list[Path]) -> Calibrated:
    """`analyze` the calibration set's profiles together; the outcome, read back."""
    sh("analyze", *map(str, dirs), log=sys.stderr)
    base = dirs[0]
    cal = read_checked(base / "calibration.json")
    stats, batch = stats_from_profile(base)
    topo = profiled_topology(cal, str(base))
    return Calibrated(base, cal, stats, batch, topo, read_hot_ids(base))


def calibrate(torchrec: Path, d: Path, common: list[str], args: argparse.Namespace) -> Calibrated:
    """The calibration set profiled side by side in one job of its own (`profile --also`), and
    `analyze` on them together."""
    plan_files, dirs = calibration_set(torchrec, d)
    also = [x for p, o in zip(plan_files[1:], dirs[1:], strict=True) for x in ("--also", p, o)]
    rounds = ["--steady-steps", str(args.after), "--rounds", str(args.turns)]
    profile(plan_files[0], dirs[0], common, args, extra=[*map(str, also), *rounds])
    return analyzed(dirs)


def calibrate_and_measure(
    named: dict[str, Path], d: Path, workload: str, args: argparse.Namespace, shift: int = 0
) -> tuple[Calibrated, dict[str, list[float]]]:
    """One job: the calibration set profiled, and the plans of `named` measured side by side
    with it (`--turns` rounds); the calibration, and each plan's median timed step. `shift`
    rotates the order the plans are built in (pass r: r places): two models of the same plan
    in one job measure apart by where each one's memory landed, and a plan always built in
    the same place would carry its place's offset into every pass."""
    plan_files, dirs = calibration_set(named["torchrec"], d)
    names = list(named)
    names = names[shift % len(names) :] + names[: shift % len(names)]
    measured, errors = profile_side_by_side(
        TrainConfig(
            workload=workload,
            nproc=args.nproc,
            steps=math.ceil(args.after / args.turns),
            max_rows=MAX_ROWS.get(workload),
            contenders=[*map(str, plan_files), *(str(named[name]) for name in names)],
            rounds=args.turns,
        ),
        [*dirs, *[None] * len(names)],
        warmup=5,
        steps=args.steps,
    )
    if errors:
        raise SystemExit(f"bench_prediction: {errors[0]}")
    turns = {
        name: [statistics.median(turn) for turn in measured.step_times_s[len(dirs) + i]]
        for i, name in enumerate(names)
    }
    return analyzed(dirs), turns


def make_plans(
    work: Path, common: list[str], args: argparse.Namespace
) -> tuple[dict[str, Path], Calibrated]:
    """Calibrate (pass 0's calibration set), then write the six plans; (name → file, pass 0's
    calibration)."""
    torchrec, rr, ours = work / "torchrec.json", work / "round_robin.json", work / "sparselift.json"
    world = ["--world-size", str(args.nproc)]
    sh("plan", "from-torchrec", *common, *world, "--out", str(torchrec), log=sys.stderr)
    sh("plan", "round-robin", *common, *world, "--out", str(rr), log=sys.stderr)
    c0 = calibrate(torchrec, work / "pass0", common, args)
    opt = ["--time-limit", str(args.time_limit), "--out", str(ours)]
    sh("optimize", "--profile", str(c0.base), *opt, log=sys.stderr)
    out = {"sparselift": ours, "torchrec": torchrec, "round_robin": rr}
    model = CostModel(c0.topo, c0.batch, coefficients(c0.topo, c0.cal))
    for i, (label, p) in enumerate(neighbours(plans.load(ours), c0.stats, model, c0.hot)[:3]):
        path = work / f"neighbour{i}.json"
        plans.save(p, path)
        out[f"n{i}: {label}"] = path
    return out, c0


def run_workload(workload: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """The six plans of one workload, measured and predicted pass by pass (each pass calibrated
    just before its plans); per plan the medians, the passes and both errors."""
    common = _common(workload, MAX_ROWS.get(workload))
    named, c0 = make_plans(work, common, args)
    step0 = steady_steps(c0.base).median_s
    args = argparse.Namespace(**vars(args))
    args.after = max(args.after, math.ceil(args.after_s / step0))
    print(
        f"{workload}: {args.after} steady steps a run ({step0 * 1e3:.1f} ms a step)",
        file=sys.stderr,
    )
    loaded = {name: plans.load(path) for name, path in named.items()}
    meas: dict[str, list[float]] = {name: [] for name in named}
    pred: dict[str, list[float]] = {name: [] for name in named}
    turns: dict[str, list[float]] = {name: [] for name in named}
    names = list(named)
    for r in range(args.repeats):
        if args.measure == "side-by-side":
            c, per_turn = calibrate_and_measure(named, work / f"job{r}", workload, args, r)
            for name in names:
                # the pass's median step: the median of its turns' medians
                meas[name].append(statistics.median(per_turn[name]))
                turns[name] += per_turn[name]
        else:
            c = c0 if r == 0 else calibrate(work / "torchrec.json", work / f"pass{r}", common, args)
            first = r % len(names)  # rotated a slot per pass: no plan always runs first after it
            for i in [*range(first, len(names)), *range(first)]:
                out = work / f"plan{i}" / f"pass{r}"
                profile(named[names[i]], out, common, args)
                meas[names[i]].append(steady_steps(out).median_s)
                turns[names[i]].append(meas[names[i]][-1])  # a pass: one turn of every plan
        for name in names:
            pred[name].append(c.predict(loaded[name]))
    level = levelled(turns)
    rows = []
    for name in named:
        m = statistics.median(meas[name])
        rows.append(
            dict(
                workload=workload,
                plan=name,
                predicted_s=statistics.median(pred[name]),
                measured_s=m,
                levelled_s=level[name],
                passes_s=meas[name],
                turns_s=turns[name],
                predicted_passes_s=pred[name],
                error=statistics.median(
                    [(p - x) / x for p, x in zip(pred[name], meas[name], strict=True)]
                ),
                unpaired_predicted_s=pred[name][0],
                unpaired_error=(pred[name][0] - m) / m,
            )
        )
    return rows


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Print each plan's figures, each workload's τ, and the targets; return the summary."""
    print(
        f"{'workload':<14} {'plan':<44} {'pred. ms':>9} {'meas. ms':>9} {'levelled':>9} "
        f"{'passes ms':>17} {'paired':>7} {'unpaired':>8}"
    )
    taus, taus_unpaired, taus_raw, taus_halves = {}, {}, {}, {}
    for wl, group in itertools.groupby(rows, key=lambda r: r["workload"]):
        g = list(group)
        for r in g:
            passes = "–".join(f"{x * 1e3:.1f}" for x in (min(r["passes_s"]), max(r["passes_s"])))
            print(
                f"{wl:<14} {r['plan'][:44]:<44} {r['predicted_s'] * 1e3:9.2f} "
                f"{r['measured_s'] * 1e3:9.2f} {r['levelled_s'] * 1e3:9.2f} {passes:>17} "
                f"{r['error']:+7.1%} {r['unpaired_error']:+8.1%}"
            )
        measured = [r["levelled_s"] for r in g]
        taus[wl] = kendall_tau([r["predicted_s"] for r in g], measured)
        taus_unpaired[wl] = kendall_tau([r["unpaired_predicted_s"] for r in g], measured)
        taus_raw[wl] = kendall_tau([r["predicted_s"] for r in g], [r["measured_s"] for r in g])
        taus_halves[wl] = split_half_tau(g)
        agree, resolved = resolved_pairs(g)
        print(
            f"{wl:<14} Kendall τ (predicted vs levelled measured order) {taus[wl]:.2f} "
            f"(unpaired {taus_unpaired[wl]:.2f}; against the raw medians {taus_raw[wl]:.2f}); "
            f"pairs the measurement orders: {resolved} of {len(g) * (len(g) - 1) // 2}, "
            f"predicted alike {agree}; the measurement against itself (even vs odd rounds) "
            f"{taus_halves[wl]:.2f}"
        )
    within = sum(abs(r["error"]) <= 0.10 for r in rows)
    within_unpaired = sum(abs(r["unpaired_error"]) <= 0.10 for r in rows)
    share = within / len(rows)
    print(
        f"within 10 % (paired): {within}/{len(rows)} plans ({share:.0%}; target ≥ 90 %), "
        f"unpaired {within_unpaired}/{len(rows)}; Kendall τ per workload "
        f"{', '.join(f'{w} {t:.2f}' for w, t in taus.items())} (target ≥ 0.8)"
    )
    return {
        "rows": rows,
        "kendall_tau": taus,
        "kendall_tau_unpaired": taus_unpaired,
        "kendall_tau_raw": taus_raw,
        "kendall_tau_split_half": taus_halves,
        "within_10pct": share,
        "within_10pct_unpaired": within_unpaired / len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    """Run every workload, print the table and the targets, save prediction.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(MAX_ROWS))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="profiled steps per run")
    ap.add_argument("--after", type=int, default=20, help="steady steps timed after each window")
    ap.add_argument(
        "--after-s",
        type=float,
        default=4.0,
        help="…or more: as many as take this long at the step of pass 0's calibration",
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="passes (calibration, then each plan once)"
    )
    ap.add_argument(
        "--measure",
        choices=("side-by-side", "separate"),
        default="side-by-side",
        help="the six plans side by side in one job, or each in its own profiled job",
    )
    ap.add_argument("--turns", type=int, default=4, help="side by side: rounds of turns a pass")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the work here")
    ap.add_argument("--show", default=None, metavar="JSON", help="report a saved prediction.json")
    args = ap.parse_args(argv)
    if args.show:
        report(json.loads(Path(args.show).read_text())["rows"])
        return 0
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
