"""Is SparseLift's plan measured-best among its neighbours? Each neighbour changes one decision.

Profile → analyze → `optimize --profile` on one workload at N ranks, then build the plan's
neighbours: the other train pipeline, the other comm precision (16-bit ↔ fp32), and for
each sharding type in the plan its heaviest table moved to the option the cost model likes best
after the current one. All are measured in one `sparselift bench` job, side by side. For each
neighbour it prints the predicted slowdown (its modelled step ÷ ours) next to the measured one
(ours steps/s ÷ its steps/s, median of rounds, and the range of each round's own ratio): above
1.0 on both sides means the optimizer was right not to pick it, and the two columns agreeing is
the cost model's check on the decisions the plan actually made (e.g. on CPU/gloo, whether fp16
qcomm or the sparse-dist pipeline pays).

    .venv/bin/python benchmarks/bench_optimizer_neighbours.py                      # multihot-26
    .venv/bin/python benchmarks/bench_optimizer_neighbours.py --quick              # tiny, few steps
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from cli_steps import plan_from_profile
from plan_set import neighbours

from sparselift import plans
from sparselift.bench import Contender, run_bench
from sparselift.calibration import read_checked
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.planio import choices_from_plan
from sparselift.optimizer.table_stats import stats_from_profile
from sparselift.optimizer.topology import profiled_topology
from sparselift.workloads.harness import TrainConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="multihot-26")
    ap.add_argument("--max-rows", type=int, default=200_000)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument(
        "--quick", action="store_true", help="tiny, 5 steps, 1 round: checks the script"
    )
    args = ap.parse_args()
    if args.quick:
        args.workload, args.steps, args.rounds = "tiny", 5, 1
    with tempfile.TemporaryDirectory(prefix="sparselift-neighbours-") as tmp:
        prof, ours = Path(tmp, "profile"), Path(tmp, "sparselift.json")
        plan_from_profile(
            args.workload, args.nproc, args.max_rows, args.time_limit, prof, ours, log=sys.stderr
        )
        plan = plans.load(ours)
        stats, batch = stats_from_profile(prof)
        cal = read_checked(prof / "calibration.json")
        topo = profiled_topology(cal, str(prof))
        model = CostModel(topo, batch, coefficients(topo, cal))
        by = {s.name: s for s in stats}
        contenders, predicted = [Contender("sparselift", str(ours))], {}
        ours_s = model.evaluate(by, *choices_from_plan(plan, topo)).step_time_s
        for i, (label, p) in enumerate(neighbours(plan, stats, model)):
            path = Path(tmp, f"neighbour-{i}.json")
            plans.save(p, path)
            contenders.append(Contender(label, str(path)))
            predicted[label] = model.evaluate(by, *choices_from_plan(p, topo)).step_time_s / ours_s
        cfg = TrainConfig(
            workload=args.workload, nproc=args.nproc, steps=args.steps, max_rows=args.max_rows
        )
        result = run_bench(
            cfg, contenders, args.rounds, echo=lambda s: print(s, file=sys.stderr, flush=True)
        )

    first = result.contenders[0]
    print(
        f"{args.workload} (max rows {args.max_rows:,}), {args.nproc} ranks, "
        f"{args.rounds} rounds × {args.steps} steps side by side; SparseLift's plan: "
        f"{first.median:.2f} steps/s, predicted {ours_s * 1e3:.1f} ms"
    )
    w = max(len(c.label) for c in result.contenders)
    print(
        f"  {'neighbour (one decision changed)':{w}s} {'pred. ×':>8s} {'meas. ×':>8s} "
        f"{'by round':>15s}  agree"
    )
    for c in result.contenders[1:]:
        by_round = [a / b for a, b in zip(first.steps_per_s, c.steps_per_s, strict=True)]
        meas = first.median / c.median
        agree = "yes" if (predicted[c.label] > 1) == (meas > 1) else "no"
        print(
            f"  {c.label:{w}s} {predicted[c.label]:8.3f} {meas:8.3f} "
            f"{min(by_round):7.3f} – {max(by_round):.3f}"
            f"  {agree}"
        )
    print("  (× = the neighbour's step ÷ SparseLift's: above 1.0, SparseLift's plan is the faster)")


if __name__ == "__main__":
    main()
