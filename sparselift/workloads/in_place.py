"""Training inside an external launcher (torchrun, or SLURM's srun): this process is one rank.

The harness (`harness.run_ranks`) launches its own ranks unless `launched_externally`; then the
calling process runs its one rank in place, as a child process started the way the built-in
launcher starts its ranks, and reads back every rank's result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparselift.errors import UserError
from sparselift.workloads.launch import (
    MALLOC_TUNABLES,
    failure_error,
    rank_malloc_env,
    recorded_error,
)

if TYPE_CHECKING:
    from sparselift.workloads.harness import TrainConfig
    from sparselift.workloads.spec import WorkloadSpec


def launched_externally() -> bool:
    """Whether this process is a rank another launcher started: torchrun (TORCHELASTIC_RUN_ID)
    or SLURM's srun with more than one task (SLURM_STEP_ID, SLURM_NTASKS > 1)."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ:
        return True
    return "SLURM_STEP_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1


def _slurm_env() -> None:
    """torch.distributed's env variables from SLURM's (MASTER_ADDR must be set, e.g. to the
    first host of `scontrol show hostnames`); kept where already set.

    Raises:
        UserError: MASTER_ADDR is not set.
    """
    if "RANK" in os.environ:
        return
    if "MASTER_ADDR" not in os.environ:
        raise UserError("under srun, set MASTER_ADDR to node 0's host (and MASTER_PORT)")
    local = os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
    os.environ.update(
        RANK=os.environ["SLURM_PROCID"],
        WORLD_SIZE=os.environ["SLURM_NTASKS"],
        LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"),
        LOCAL_WORLD_SIZE=local,
        GROUP_RANK=os.environ.get("SLURM_NODEID", "0"),
    )
    os.environ.setdefault("MASTER_PORT", "29500")


def run_in_place(cfg: TrainConfig) -> tuple[WorkloadSpec, list[dict[str, Any]]]:
    """This process is one rank of an external launch: run that rank, gather every rank's result
    (the workload, uncapped; each rank's `RankResult` fields, in rank order).

    The rank runs in a child process (`worker.py`, this process's environment, malloc thresholds
    fixed as the built-in launcher's ranks have them), so it ends as a launched rank does.

    Raises:
        UserError: bad input, or the hosts disagree.
        RankFailed: this rank failed (with another host's error where that came first).
    """
    import subprocess
    import sys

    _slurm_env()
    rank = int(os.environ["RANK"])
    cfg.nproc = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    cfg.nnodes = max(1, int(os.environ["WORLD_SIZE"]) // cfg.nproc)
    cfg.node_rank = int(os.environ.get("GROUP_RANK", rank // cfg.nproc))
    cfg.rdzv_endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    spec = cfg.validate()
    store = None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0:
        from datetime import timedelta

        from torch.distributed import TCPStore

        # rank 0 hosts the store (torchelastic's agent would); the ranks join it as clients
        store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=cfg.rdzv_timeout_s),
        )
    with tempfile.TemporaryDirectory(prefix="sparselift-rank-") as tmp:
        cfg_path, error_file = Path(tmp, "config.json"), Path(tmp, "error.json")
        cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
        env = dict(
            os.environ,
            TORCHELASTIC_USE_AGENT_STORE="True",
            TORCHELASTIC_ERROR_FILE=str(error_file),
            SPARSELIFT_RDZV_TIMEOUT_S=str(cfg.rdzv_timeout_s),
            SPARSELIFT_ALL_RESULTS="1",
        )
        with rank_malloc_env():
            env.setdefault("GLIBC_TUNABLES", os.environ.get("GLIBC_TUNABLES", MALLOC_TUNABLES))
            worker = [sys.executable, "-m", "sparselift.workloads.worker", str(cfg_path), tmp]
            code = subprocess.run(worker, env=env).returncode
        del store
        if code != 0:
            raise failure_error([(rank, recorded_error(str(error_file), code))])
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(cfg.world_size)]
    return spec, ranks


def reports_here(node_rank: int = 0) -> bool:
    """Whether this process reports the run (prints its result, writes its profile): global
    rank 0 of an external launch; else the built-in launcher's process on node `node_rank` 0
    (the default: every host gets the whole run's result)."""
    if launched_externally():
        return os.environ.get("RANK", "0") == "0"
    return node_rank == 0
