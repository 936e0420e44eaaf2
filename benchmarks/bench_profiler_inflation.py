"""How much slower the profiled window runs, and does the calibration close on the unprofiled step?

Per workload (`tiny`, and `multihot-26` capped at --max-rows), on --nproc gloo ranks, --repeats
interleaved rounds (the order of the two runs alternates from round to round) of:
  unprofiled  the harness with no hook: W + S warm-up steps, then N timed steps;
  profiled    `sparselift profile`: W warm-up steps, S profiled steps, N steady steps after the
              window (the manifest's `steady_step_s`);
  calibrated  `analysis.pipeline.analyze` of that profile, then the optimizer's cost model
              (`optimizer.predict.predict_plan`) prices the plan that ran.
Both runs train the same plan file (TorchRec's plan, `sparselift plan from-torchrec`), so the
prediction prices exactly what ran. A step is the slowest rank's; each run's figure is the median
over its steps. Printed per workload, median and min–max over the rounds: the window's step, the
steady step in the profile, the unprofiled step, the calibrated step, inflation = window / steady,
and |calibrated − unprofiled| / unprofiled (target ≤ 5 %), per round, and the ratio of the
medians over rounds with a bootstrap interval (resampling rounds). A round's unprofiled run is
one short run of its own, so the per-round figure carries that run's noise; the medians' figure
is the one that says whether the calibration is biased.

    .venv/bin/python benchmarks/bench_profiler_inflation.py               # both workloads, 3 rounds
    .venv/bin/python benchmarks/bench_profiler_inflation.py --quick       # tiny, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "sparselift.cli"]
FIGURES = ("window_s", "steady_s", "unprofiled_s", "calibrated_s", "inflation", "error")


@dataclass
class Round:
    """One round of one workload: seconds per step (NaN: not measured), and the ratios."""

    workload: str
    window_s: float
    steady_s: float
    unprofiled_s: float
    calibrated_s: float
    inflation: float  # window / steady
    error: float  # |calibrated - unprofiled| / unprofiled
    note: str = ""


def cli(args: list[str], log: Path) -> None:
    """Run `sparselift ARGS`, its output appended to `log`; a failure stops the benchmark."""
    with log.open("a") as f:
        f.write("$ sparselift " + " ".join(args) + "\n")
        f.flush()
        subprocess.run([*CLI, *args], check=True, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)


def unprofiled_step_s(
    workload: str, plan: Path, max_rows: int | None, a: argparse.Namespace
) -> float:
    """Median step of a run never profiled, over the steps the profiled run times as steady."""
    from sparselift.workloads.harness import TrainConfig, run_training

    cfg = TrainConfig(
        workload=workload,
        nproc=a.nproc,
        warmup=a.warmup + a.steps,
        steps=a.steady_steps,
        max_rows=max_rows,
        plan=str(plan),
        device="cpu",
    )
    return run_training(cfg).step_time_s_median


def profile(
    workload: str, plan: Path, max_rows: int | None, out: Path, a: argparse.Namespace, log: Path
) -> tuple[float, float]:
    """Profile the plan into `out`; (window median, steady median) from its manifest."""
    args = ["profile", "--workload", workload, "--nproc", str(a.nproc), "--plan", str(plan)]
    args += ["--steps", str(a.steps), "--warmup", str(a.warmup), "--after", "0"]
    args += ["--steady-steps", str(a.steady_steps), "--device", "cpu", "--no-execution-trace"]
    args += ["--out", str(out), "--force"]
    if max_rows:
        args += ["--max-rows", str(max_rows)]
    cli(args, log)
    m = json.loads((out / "manifest.json").read_text())
    per_rank = m["step_times_s"]
    window = [
        max(t[i] for t in per_rank) for i in range(a.warmup, a.warmup + len(m["profiled_steps"]))
    ]
    steady = m.get("steady_step_s") or []
    return statistics.median(window), statistics.median(steady) if steady else float("nan")


def calibrated_step_s(profile_dir: Path, plan: Path, nproc: int) -> float:
    """The profiled plan's step under the cost model calibrated on `profile_dir`."""
    from sparselift.analysis.pipeline import analyze
    from sparselift.optimizer.predict import predict_plan
    from sparselift.optimizer.table_stats import stats_from_profile
    from sparselift.optimizer.topology import preset

    cal = analyze(profile_dir).calibration
    stats, batch = stats_from_profile(profile_dir)
    return predict_plan(str(plan), stats, cal, preset("cpu-gloo", nproc, nproc), batch).step_time_s


def one_round(
    workload: str, plan: Path, max_rows: int | None, work: Path, i: int, a: argparse.Namespace
) -> Round:
    """Unprofiled and profiled runs (order alternating with `i`), then the calibrated step."""
    out, log = work / workload / f"round{i}", work / "log.txt"
    if i % 2 == 0:
        unprof = unprofiled_step_s(workload, plan, max_rows, a)
        window, steady = profile(workload, plan, max_rows, out, a, log)
    else:
        window, steady = profile(workload, plan, max_rows, out, a, log)
        unprof = unprofiled_step_s(workload, plan, max_rows, a)
    note = ""
    try:
        cal = calibrated_step_s(out, plan, a.nproc)
    except Exception as e:  # a benchmark reports what failed and goes on measuring
        cal, note = float("nan"), f"calibration failed: {type(e).__name__}: {e}"
    return Round(
        workload, window, steady, unprof, cal, window / steady, abs(cal - unprof) / unprof, note
    )


def spread(values: list[float], scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    """'median (min–max)' of the measured values (NaN left out)."""
    v = [x * scale for x in values if x == x]
    if not v:
        return "n/a"
    f = fmt.format
    return f"{f(statistics.median(v))} ({f(min(v))}–{f(max(v))})"


def medians_ratio(rs: list[Round], seed: int = 0, draws: int = 2000) -> str:
    """median calibrated / median unprofiled over rounds, with its 90 % bootstrap interval
    (rounds resampled with replacement, the two columns together): within 0.95–1.05 is the
    target met by the medians."""
    pairs = [(r.calibrated_s, r.unprofiled_s) for r in rs if r.calibrated_s == r.calibrated_s]
    if not pairs:
        return "n/a"

    def ratio(ps: list[tuple[float, float]]) -> float:
        return statistics.median(p[0] for p in ps) / statistics.median(p[1] for p in ps)

    rng = random.Random(seed)
    boot = sorted(ratio(rng.choices(pairs, k=len(pairs))) for _ in range(draws))
    lo, hi = boot[int(0.05 * draws)], boot[int(0.95 * draws) - 1]
    return f"{ratio(pairs):.3f} (90 % interval {lo:.3f}–{hi:.3f})"


def report(rounds: list[Round], a: argparse.Namespace) -> str:
    """The table: per workload, each figure's median and min–max over the rounds."""
    lines = [
        f"{a.nproc} ranks (cpu/gloo), {a.warmup} warm-up + {a.steps} profiled + "
        f"{a.steady_steps} steady steps, {a.repeats} interleaved rounds; "
        f"median (min–max) over rounds",
    ]
    for w in dict.fromkeys(r.workload for r in rounds):
        rs = [r for r in rounds if r.workload == w]
        col = {k: [getattr(r, k) for r in rs] for k in FIGURES}
        lines += [
            f"\n{w}",
            f"  window step (profiled)    {spread(col['window_s'], 1e3)} ms",
            f"  steady step (in profile)  {spread(col['steady_s'], 1e3)} ms",
            f"  unprofiled step           {spread(col['unprofiled_s'], 1e3)} ms",
            f"  calibrated step           {spread(col['calibrated_s'], 1e3)} ms",
            f"  inflation window/steady   {spread(col['inflation'], 1.0, '{:.2f}')}x",
            f"  steady/unprofiled         "
            f"{spread([r.steady_s / r.unprofiled_s for r in rs], 1.0, '{:.3f}')}",
            f"  |calibrated-unprofiled|/unprofiled  {spread(col['error'], 100.0)} % "
            f"(target <= 5 %)",
            f"  calibrated/unprofiled, medians      {medians_ratio(rs)}",
        ]
        lines += [f"  round {i}: {r.note}" for i, r in enumerate(rs) if r.note]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure every round, print the table (and write --json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="tiny,multihot-26", help="comma-separated")
    p.add_argument("--max-rows", type=int, default=200_000, help="multihot-26's row cap")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=8, help="profiled steps")
    p.add_argument("--steady-steps", type=int, default=10, help="steps timed after the window")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    p.add_argument("--quick", action="store_true", help="tiny only, 2 rounds")
    p.add_argument("--keep", default=None, metavar="DIR", help="keep profiles and plans here")
    p.add_argument("--json", default=None, metavar="OUT", help="also write every round as JSON")
    a = p.parse_args(argv)
    if a.quick:
        a.workloads, a.repeats = "tiny", min(a.repeats, 2)
    work = Path(a.keep or tempfile.mkdtemp(prefix="sparselift-bench-inflation-"))
    work.mkdir(parents=True, exist_ok=True)
    workloads = [w for w in a.workloads.split(",") if w]
    caps = {w: (a.max_rows if w == "multihot-26" else None) for w in workloads}
    plans = {}
    for w in workloads:  # TorchRec's plan, as a file both runs train
        plans[w] = work / f"{w}.plan.json"
        args = ["plan", "from-torchrec", "--workload", w, "--world-size", str(a.nproc)]
        args += ["--out", str(plans[w])] + (["--max-rows", str(caps[w])] if caps[w] else [])
        cli(args, work / "log.txt")
    rounds = []
    for i in range(a.repeats):
        for w in workloads:
            r = one_round(w, plans[w], caps[w], work, i, a)
            rounds.append(r)
            print(
                f"round {i} {w}: window {r.window_s * 1e3:.1f} ms, steady {r.steady_s * 1e3:.1f}, "
                f"unprofiled {r.unprofiled_s * 1e3:.1f}, calibrated {r.calibrated_s * 1e3:.1f}",
                flush=True,
            )
    print("\n" + report(rounds, a))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    print(f"\nprofiles and log in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
