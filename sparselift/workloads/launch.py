"""Start N ranks the way torchrun does (elastic agent, c10d rendezvous on a free port), fail fast.

The elastic agent watches every rank: when one fails it stops the others within seconds, so a crash
never turns into a hang, and its error (written by the rank through torchelastic's error file) is
reported. Rendezvous on `localhost:0` picks a free port, so a busy default port is not an error.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from sparselift.errors import UserError


class RankFailed(RuntimeError):
    """A rank exited non-zero; the message carries that rank's own error."""


def launch(nproc: int, module: str, args: Sequence[str], *, monitor_interval: float = 0.1) -> None:
    """Run `python -m module *args` on `nproc` local ranks and wait for them.

    Args:
        nproc: local ranks.
        module: the module every rank runs.
        args: its arguments.
        monitor_interval: how often (s) the elastic agent checks the ranks.
    Raises:
        UserError: `nproc` < 1.
        RankFailed: a rank exited non-zero; the others were stopped.
    """
    if nproc < 1:
        raise UserError(f"--nproc must be at least 1, got {nproc}")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.ERROR)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"sparselift-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=monitor_interval,
        start_method="spawn",
    )
    # One thread per rank unless the user says otherwise: ranks share the host's cores.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", module, *args)
    except ChildFailedError as e:
        raise RankFailed(_describe(e)) from None


def _describe(e: Any) -> str:
    """One line per failed rank of a ChildFailedError: its own error's first line, or exit code."""
    parts = []
    for rank, failure in sorted(e.failures.items()):
        msg = failure.message
        if isinstance(msg, dict):
            msg = msg.get("message", "")
        msg = str(msg or "").strip()
        if not msg or msg.startswith("To enable traceback"):
            msg = f"exit code {failure.exitcode}" + (
                f" (signal {failure.signal_name()})" if failure.exitcode < 0 else ""
            )
        parts.append(f"rank {rank} failed: {msg.splitlines()[0] if msg else ''}")
    return "; ".join(parts)
