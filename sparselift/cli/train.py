"""`sparselift train` and `sparselift workloads`."""

from __future__ import annotations

import argparse

from sparselift.workloads.harness import PIPELINES, TrainConfig


def add_training_args(p: argparse.ArgumentParser) -> None:
    """The flags every command that trains shares (train, profile, bench)."""
    p.add_argument(
        "--workload",
        required=True,
        help="built-in name (tiny, criteo-kaggle, multihot-26) or a spec path",
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks to launch on this host (default 2)")
    p.add_argument("--steps", type=int, default=30, help="measured steps (default %(default)s)")
    p.add_argument("--warmup", type=int, default=5, help="steps before measuring (default 5)")
    p.add_argument(
        "--max-rows", type=int, default=None, help="hash ids into at most this many rows per table"
    )
    p.add_argument(
        "--batch-size", type=int, default=None, help="samples per rank (default: the workload's)"
    )
    p.add_argument(
        "--pipeline",
        choices=PIPELINES,
        default=None,
        help="train pipeline (default: the plan's, else base)",
    )
    p.add_argument(
        "--data", default=None, help="directory of TorchRec-preprocessed Criteo .npy day files"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")


def config_from_args(args: argparse.Namespace, plan: str | None = None, **extra) -> TrainConfig:
    return TrainConfig(
        workload=args.workload,
        nproc=args.nproc,
        steps=args.steps,
        warmup=args.warmup,
        max_rows=args.max_rows,
        batch_size=args.batch_size,
        pipeline=args.pipeline,
        data=args.data,
        seed=args.seed,
        device=args.device,
        plan=plan,
        **extra,
    )


def register(sub) -> None:
    p = sub.add_parser("train", help="train a workload on N ranks with DistributedModelParallel")
    add_training_args(p)
    p.add_argument(
        "--plan", default=None, help="a SparseLift plan file (default: TorchRec's planner)"
    )
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON")
    p.set_defaults(run=run_train)

    p = sub.add_parser("workloads", help="list the built-in workloads")
    p.set_defaults(run=run_workloads)


def run_train(args: argparse.Namespace) -> int:
    from sparselift.atomic import write_json
    from sparselift.workloads.harness import run_training

    result = run_training(config_from_args(args, plan=args.plan, progress=True))
    print(result.summary())
    if args.json:
        write_json(args.json, result.to_json())
    return 0


def run_workloads(args: argparse.Namespace) -> int:
    from sparselift.workloads.spec import builtin_names, load_workload

    for name in builtin_names():
        w = load_workload(name)
        rows = sum(t.num_embeddings for t in w.tables)
        print(
            f"{name:15s} {len(w.tables):3d} tables {rows:>12,d} rows  {w.model.arch:10s} batch {w.batch_size}"
        )
    return 0
