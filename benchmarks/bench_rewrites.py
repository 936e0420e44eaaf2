"""Do plan rewrites (splits) pay, measured? TorchRec's plan, round-robin, SparseLift's plan with
and without rewrites, and a hand-made hot/cold split, trained side by side in one `sparselift
bench` job per workload.

    python benchmarks/bench_rewrites.py [--quick] [--workloads multihot-26,…] [--rounds R]
                                        [--json out.json] [--keep DIR]
    python benchmarks/bench_rewrites.py --show out.json      # the table of an earlier run
    python benchmarks/bench_rewrites.py split --base P --profile DIR --coverage 0.5 --out S

Per workload (multihot-26 and criteo-kaggle at --max-rows 200000,
benchmarks/workloads/skewed-multihot.json, and benchmarks/workloads/one-heavy-table.json
uncapped): profile TorchRec's plan as `tune` does (under each pipeline, at 16 bits and with a
table row-wise, side by side: `tune_plans.calibration_plans`), build the plans, measure them
side by side, then print steps/s and the ratio over TorchRec's plan, over round-robin and over the
no-rewrite plan, each with its per-round range (round r of a plan over round r of the other).
Beside them: the batch transform's cost as a share of the measured step (`Plan.transform_batch`
timed on the workload's own synthetic batches, as rank 0 draws them, in a process with the
ranks' allocator settings) and the collectives per step
each plan's sharding groups issue (`collectives`). Contenders that shard alike (the optimizer
often keeps TorchRec's plan) are marked: their spread is the run's noise.

`hand-split` is `hot_cold_plan` over the no-rewrite plan's sharding, from the profile's
hot_ids.parquet, so a split is measured even where the optimizer chooses none; where `sparselift
optimize` does not accept `--splits`, it stands in for the rewrite plan and the output says so.
The `split` sub-command writes such a plan on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparselift import plans
from sparselift.atomic import write_bytes
from sparselift.errors import UserError
from sparselift.plans import Plan, Split, TablePlan
from sparselift.plans.splits import part_names
from sparselift.profiler.hot_ids import HOT_IDS_CAP, HotIds, read_hot_ids
from sparselift.tune_plans import calibration_plans

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "sparselift.cli"]
SKEWED = HERE / "workloads" / "skewed-multihot.json"
ONE_HEAVY = HERE / "workloads" / "one-heavy-table.json"
WORKLOADS = [
    ("multihot-26", 200_000),
    ("criteo-kaggle", 200_000),
    (str(SKEWED), 200_000),
    (str(ONE_HEAVY), 400_000),  # its largest table: uncapped, as `make demo` runs it
]
COVERAGE = 0.5  # the hand-made rewrite's hot share (why: benchmarks/README.md, lab notes)
TRANSFORM_BATCHES = 20  # batches the transform is timed on


# ----------------------------------------------------------------------------- the rewrite


def hot_cold_plan(
    base: Plan,
    hot: dict[str, HotIds],
    coverage: float,
    cap: int = HOT_IDS_CAP,
    min_rows: int = 0,
) -> Plan:
    """`base` with a hot_cold split of every table of at least `min_rows` rows whose hottest ids
    cover `coverage` of its lookups with at most `cap` ids (and fewer than all its rows).

    The hot part (`T__hot`) is data_parallel with the dense kernel on every rank; the cold part
    (`T__cold`, all of the table's rows) keeps the table's sharding in `base` (type, kernel,
    ranks, shards). Tables of `base` that are already split, or have no hot ids, stay as they are.

    Args:
        base: the plan to rewrite (its model must be the profile's).
        hot: per table its hot ids (`read_hot_ids(profile_dir)`).
        coverage: share of a table's lookups the hot part must serve, in (0, 1].
        cap: the most hot ids of one table.
        min_rows: tables with fewer rows stay whole (a small table gains little from a split and
            still pays for its batch transform).
    Returns:
        The validated plan (format 2; the same as `base` if no table qualifies).
    Raises:
        UserError: the profile's table sizes differ from the plan's (another --max-rows).
    """
    world = base.topology.world_size
    fps = {t.name: t for t in base.model}
    done = {s.table for s in base.splits}
    splits: list[Split] = list(base.splits)
    parts: dict[str, list[TablePlan]] = {}
    for name, h in hot.items():
        fp = fps.get(name)
        if fp is None or name in done or fp.num_embeddings < min_rows:
            continue
        if h.num_embeddings != fp.num_embeddings:
            raise UserError(
                f"table {name!r}: {h.num_embeddings} rows in the profile, "
                f"{fp.num_embeddings} in the plan {base.source}"
            )
        k = h.ids_covering(coverage)
        if not k or k > cap or k >= fp.num_embeddings:
            continue
        hot_name, cold_name = part_names(name, "hot_cold")
        ids = tuple(int(x) for x in h.ids[:k])
        splits.append(Split(name, "hot_cold", (hot_name, cold_name), hot_ids=ids))
        t = base.table(name)
        cold = TablePlan(
            cold_name, t.sharding_type, t.compute_kernel, list(t.ranks), list(t.shards),
            t.cache_load_factor,
        )  # fmt: skip
        parts[name] = [TablePlan(hot_name, "data_parallel", "dense", list(range(world))), cold]
    d = base.to_dict()
    p = Plan.from_dict(d, base.source)
    p.splits = splits
    p.tables = [x for t in p.tables for x in parts.get(t.name, [t])]
    p.predicted = None  # the base plan's prediction does not hold for the split plan
    p.provenance = {
        **(p.provenance or {}),
        "rewrite": {"kind": "hot_cold", "coverage": coverage, "cap": cap, "min_rows": min_rows},
    }
    return Plan.from_dict(p.to_dict(), base.source)


# ------------------------------------------------------------------------ what it costs


@dataclass
class Collectives:
    """The collectives one training step of a plan issues for its embeddings.

    TorchRec groups a collection's tables by sharding type; each group of sharded tables has one
    input all-to-all (the ids) and one output collective forward (all-to-all; reduce-scatter for
    row-wise types) and its mirror backward. Data-parallel tables have none of those: their
    gradients are all-reduced: TorchRec keeps the data-parallel tables of one compute kernel in one
    flat weight under DDP, so one all-reduce per kernel group (SparseLift's hot parts included,
    whose row-wise Adagrad rides on that all-reduce's hook).

    Attributes:
        groups: the sharded (non-data-parallel) sharding types, sorted.
        input_dist: input all-to-alls per step.
        output_dist: output collectives per step, forward and backward.
        all_reduce: gradient all-reduces of data-parallel tables per step.
        all_reduce_bytes: their fp32 bytes per step.
        per_step: all of them.
    """

    groups: list[str]
    input_dist: int
    output_dist: int
    all_reduce: int
    all_reduce_bytes: int
    per_step: int


def collectives(plan: Plan) -> Collectives:
    """The embedding collectives per step of `plan` (see `Collectives`)."""
    fps = {t.name: t for t in plan.sharded_tables()}
    groups = sorted({t.sharding_type for t in plan.tables if t.sharding_type != "data_parallel"})
    dp_bytes = sum(
        4 * fps[t.name].num_embeddings * fps[t.name].embedding_dim
        for t in plan.tables
        if t.sharding_type == "data_parallel"
    )
    n_ar = len({t.compute_kernel for t in plan.tables if t.sharding_type == "data_parallel"})
    g = len(groups)
    return Collectives(groups, g, 2 * g, n_ar, dp_bytes, 3 * g + n_ar)


def transform_s(plan_file: Path, workload: str, max_rows: int, n: int, nproc: int) -> float:
    """Median seconds of the plan's `transform_batch` on `n` of rank 0's synthetic batches, timed
    in a process of its own with the ranks' allocator settings (`launch.rank_malloc_env`: glibc
    reads them at start, and the batch's output buffers are what they change). See
    `transform_s_here`."""
    from sparselift.workloads.launch import rank_malloc_env

    cmd = [sys.executable, __file__, "time-transform", str(plan_file), workload, str(max_rows)]
    with rank_malloc_env():
        r = subprocess.run([*cmd, str(n), str(nproc)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"timing the transform of {plan_file} failed:\n{r.stderr}")
    return float(r.stdout.split()[-1])


def transform_s_here(
    plan: Plan, workload: str, max_rows: int, n: int, nproc: int, seed: int = 0
) -> float:
    """Median seconds of `plan.transform_batch` on `n` of rank 0's synthetic batches, here.

    The batches are made first, as the harness makes them ahead of the timed loop (uncapped spec,
    ids hashed into `max_rows`), and timed with the intra-op threads a rank of an `nproc`-rank
    run gets (the launcher's OMP_NUM_THREADS): more threads than that on cores the other ranks
    use is not what a rank pays.
    """
    import torch

    from sparselift.workloads.batches import SyntheticBatches
    from sparselift.workloads.spec import load_workload

    gen = iter(SyntheticBatches(load_workload(workload), rank=0, seed=seed, max_rows=max_rows))
    batches = [next(gen) for _ in range(n)]
    threads = torch.get_num_threads()
    torch.set_num_threads(
        int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, (os.cpu_count() or 1) // nproc)
    )
    try:
        plan.transform_batch(batches[0])  # the first call builds the routes
        times = []
        for b in batches:
            t0 = time.perf_counter()
            plan.transform_batch(b)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


# ------------------------------------------------------------------------------- running


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `sparselift ARGS`, echoed to stderr; raise with its stderr if it fails."""
    print("$ sparselift " + " ".join(args), file=sys.stderr, flush=True)
    r = subprocess.run([*CLI, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"sparselift {args[0]} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return r


def optimize_accepts_splits() -> bool:
    """Whether this `sparselift optimize` takes `--splits`."""
    r = subprocess.run([*CLI, "optimize", "--help"], capture_output=True, text=True)
    return "--splits" in r.stdout


def make_plans(workload: str, rows: int, nproc: int, out: Path) -> tuple[dict[str, Path], str]:
    """Profile TorchRec's plan and write the contenders' plans under `out`.

    The contenders: TorchRec's plan, round-robin, SparseLift's without rewrites (`optimize
    --splits off`) and with them (`--splits auto`), and `hand-split`: `hot_cold_plan` at
    `COVERAGE` over the no-rewrite plan, so that a split is measured even where the optimizer
    chooses none. Without `--splits` in `optimize`, "rewrite" is that hand-made plan.

    Returns:
        {label: plan file} in bench order (TorchRec's first) and how the rewrite plan was made.
    """
    common = ["--workload", workload, "--max-rows", str(rows)]
    labels = ("torchrec", "round-robin", "no-rewrite", "rewrite", "hand-split")
    files = {k: out / f"{k}.json" for k in labels}
    topo = ["--world-size", str(nproc)]
    sh("plan", "from-torchrec", *common, *topo, "--out", str(files["torchrec"]))
    sh("plan", "round-robin", *common, *topo, "--out", str(files["round-robin"]))
    # calibrated as `tune` starts: TorchRec's plan under each pipeline, at 16 bits, with a
    # table row-wise and as a second model, side by side in one job, fitted together
    variants = calibration_plans(str(files["torchrec"]), out, str(files["torchrec"]))
    dirs = [str(out / f"prof_tr{suffix}") for _, suffix in variants]
    also = [
        x for (plan, _), d in zip(variants[1:], dirs[1:], strict=True) for x in ("--also", plan, d)
    ]
    sh(
        "profile",
        *common,
        "--nproc",
        str(nproc),
        "--plan",
        variants[0][0],
        "--out",
        dirs[0],
        *also,
        "--force",
    )
    sh("analyze", *dirs)
    prof = Path(dirs[0])
    opt = ["optimize", *(x for d in dirs for x in ("--profile", d))]
    hand = f"hot_cold_plan at coverage {COVERAGE} over the no-rewrite plan"
    if optimize_accepts_splits():
        sh(*opt, "--splits", "off", "--out", str(files["no-rewrite"]))
        sh(*opt, "--splits", "auto", "--out", str(files["rewrite"]))
        n = len(plans.load(files["rewrite"]).splits)
        how = f"sparselift optimize --splits auto ({n} tables split)"
    else:
        sh(*opt, "--out", str(files["no-rewrite"]))
        how = f"FALLBACK: optimize has no --splits; rewrite = {hand}"
        del files["hand-split"]
    split = hot_cold_plan(plans.load(files["no-rewrite"]), read_hot_ids(prof), COVERAGE)
    plans.save(split, files["hand-split" if "hand-split" in files else "rewrite"])
    return files, how


def balance_bound(profile: Path) -> dict[str, float]:
    """The most any plan that keeps the model's lookup and dense work could gain over the
    profiled plan, by its profile. `lookups`: the steady step ÷ the steady step with every
    rank's lookups at the ranks' mean (the kernels' own steady seconds, manifest `lookup_s`),
    communication as it ran; `no_comm`: also no communication exposed on the fastest-
    communicating rank (`summary.parquet`, the window's scaled by its inflation, as the
    calibration scales it). Why: a rewrite moves lookups and collectives; it does not remove
    lookups or dense compute, so this bounds what it can show. A profile without `lookup_s` or
    steady steps: per window step from the summary, its sparse compute for the lookups."""
    import pandas as pd

    from sparselift.analysis.compare import steady_steps

    s = pd.read_parquet(profile / "summary.parquet")
    by = s.groupby("step")
    step = by["step_s"].max()
    m = json.loads((profile / "manifest.json").read_text())
    kernels = [[sum(x) for x in r.get("steady") or []] for r in m.get("lookup_s") or []]
    if not kernels or not all(kernels) or not m.get("steady_step_s"):
        even = by["sparse_compute_s"].max() - by["sparse_compute_s"].mean()
        exposed = by["exposed_comm_s"].min()
        return {
            "lookups": float((step / (step - even)).median()),
            "no_comm": float((step / (step - even - exposed)).median()),
        }
    steady = steady_steps(str(profile)).median_s
    per_rank = [statistics.median(k) for k in kernels]
    even = max(per_rank) - statistics.mean(per_rank)
    exposed = float(by["exposed_comm_s"].min().median()) * steady / float(step.median())
    return {"lookups": steady / (steady - even), "no_comm": steady / (steady - even - exposed)}


def sharding_key(plan: Plan) -> str:
    """What training depends on (tables, splits, precision, pipeline), as comparable text."""
    d = plan.to_dict()
    return json.dumps([d.get(k) for k in ("splits", "tables", "comm_precision", "pipeline")])


def round_ratios(a: list[float], b: list[float]) -> dict[str, float]:
    """Median of a's rounds over b's, and the range of the per-round ratios a[r] / b[r]."""
    per = [x / y for x, y in zip(a, b, strict=True)]
    return {
        "ratio": statistics.median(a) / statistics.median(b),
        "min": min(per),
        "max": max(per),
    }


def measure(
    workload: str, rows: int, nproc: int, rounds: int, steps: int | None, out: Path
) -> dict[str, Any]:
    """Everything for one workload: plans, one interleaved bench, ratios, transform, collectives."""
    out.mkdir(parents=True, exist_ok=True)
    files, how = make_plans(workload, rows, nproc, out)
    bench_json = out / "bench.json"
    args = ["bench", "--workload", workload, "--max-rows", str(rows), "--nproc", str(nproc)]
    args += [a for f in files.values() for a in ("--plan", str(f))]
    args += ["--rounds", str(rounds), "--json", str(bench_json)]
    sh(*args, *(["--steps", str(steps)] if steps else []))
    by_file = {c["plan"]: c for c in json.loads(bench_json.read_text())["contenders"]}
    sps = {k: by_file[str(f)]["steps_per_s"] for k, f in files.items()}
    res: dict[str, Any] = {"workload": Path(workload).stem, "max_rows": rows, "rewrite_how": how}
    res["balance_bound"] = balance_bound(out / "prof_tr")
    res["plans"] = {}
    first: dict[str, str] = {}  # sharding → the first contender that runs it
    for k, f in files.items():
        p = plans.load(f)
        same = first.setdefault(sharding_key(p), k)
        med = statistics.median(sps[k])
        t_s = transform_s(f, workload, rows, TRANSFORM_BATCHES, nproc) if p.splits else 0.0
        res["plans"][k] = {
            "file": str(f),
            "splits": len(p.splits),
            "same_as": None if same == k else same,
            "steps_per_s": sps[k],
            "median": med,
            "vs_torchrec": round_ratios(sps[k], sps["torchrec"]),
            "vs_round_robin": round_ratios(sps[k], sps["round-robin"]),
            "vs_no_rewrite": round_ratios(sps[k], sps["no-rewrite"]),
            "transform_s": t_s,
            "transform_share": t_s * med,
            "collectives": asdict(collectives(p)),
        }
    return res


def table(results: list[dict[str, Any]]) -> str:
    """The results for people: one block per workload, one line per plan."""

    def r(d: dict[str, float]) -> str:
        return f"{d['ratio']:.3f} ({d['min']:.3f}-{d['max']:.3f})"

    lines = []
    for res in results:
        lines += [
            f"{res['workload']} (--max-rows {res['max_rows']}); rewrite: {res['rewrite_how']}"
        ]
        if "balance_bound" in res:
            b = res["balance_bound"]
            lines.append(
                f"  bound over TorchRec's plan by its profile: every rank's lookups at the mean "
                f"{b['lookups']:.3f}x, and no communication exposed {b['no_comm']:.3f}x"
            )
        lines.append(
            f"  {'plan':12s} {'splits':>6s} {'steps/s':>8s}  {'/torchrec':19s} "
            f"{'/round-robin':19s} {'/no-rewrite':19s} {'xform ms':>8s} {'share':>6s} "
            f"{'coll/step':>9s} AR MiB"
        )
        for k, p in res["plans"].items():
            c = p["collectives"]
            lines.append(
                f"  {k:12s} {p['splits']:6d} {p['median']:8.2f}  {r(p['vs_torchrec']):19s} "
                f"{r(p['vs_round_robin']):19s} {r(p['vs_no_rewrite']):19s} "
                f"{1e3 * p['transform_s']:8.2f} {100 * p['transform_share']:5.1f}% "
                f"{c['per_step']:9d} {c['all_reduce_bytes'] / 2**20:.2f}"
                + (f"  (= {p['same_as']}'s sharding)" if p.get("same_as") else "")
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or the `split` sub-command); see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["split"]:
        return split_main(argv[1:])
    if argv[:1] == ["time-transform"]:  # transform_s's process: PLAN WORKLOAD ROWS N NPROC
        plan, workload, rows, n, nproc = argv[1:]
        print(transform_s_here(plans.load(plan), workload, int(rows), int(n), int(nproc)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="multihot-26 only, 1 round of 10 steps")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--workloads", default=None, help="comma-separated subset of the workloads (stem names)"
    )
    ap.add_argument("--keep", type=Path, default=Path("runs/bench_rewrites"), help="work folder")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--show", type=Path, help="only print the table of an earlier --json file")
    a = ap.parse_args(argv)
    if a.show:
        print(table(json.loads(a.show.read_text())["results"]))
        return 0
    todo, rounds, steps = (WORKLOADS[:1], 1, 10) if a.quick else (WORKLOADS, a.rounds, None)
    if a.workloads:
        wanted = a.workloads.split(",")
        todo = [(w, rows) for w, rows in todo if Path(w).stem in wanted]
    results = [measure(w, rows, a.nproc, rounds, steps, a.keep / Path(w).stem) for w, rows in todo]
    print(table(results))
    if a.json:
        write_bytes(a.json, json.dumps({"results": results}, indent=1).encode())
    return 0


def split_main(argv: list[str]) -> int:
    """`split`: write `hot_cold_plan(--base, hot ids of --profile, --coverage, --cap)`."""
    ap = argparse.ArgumentParser(prog="bench_rewrites.py split", description=hot_cold_plan.__doc__)
    ap.add_argument("--base", required=True, help="plan to rewrite")
    ap.add_argument("--profile", required=True, help="profile directory with hot_ids.parquet")
    ap.add_argument("--coverage", type=float, required=True, help="hot share of lookups")
    ap.add_argument("--cap", type=int, default=HOT_IDS_CAP, help="most hot ids per table")
    ap.add_argument("--min-rows", type=int, default=0, help="split only tables this large")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if not 0 < a.coverage <= 1:
        print(f"error: --coverage must be in (0, 1], got {a.coverage}", file=sys.stderr)
        return 2
    try:
        hot = read_hot_ids(a.profile)
        p = hot_cold_plan(plans.load(a.base), hot, a.coverage, a.cap, a.min_rows)
        plans.save(p, a.out)
    except (UserError, plans.PlanError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = sum(len(s.hot_ids) for s in p.splits)
    print(f"wrote {a.out}: {len(p.splits)} tables split, {n:,} hot ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
