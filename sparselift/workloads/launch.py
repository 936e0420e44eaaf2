"""Start the ranks the way torchrun does (elastic agent, rendezvous, fail fast), on 1+ hosts.

The elastic agent watches every rank: when one fails it stops the others within seconds, so a crash
never turns into a hang, and its error (written by the rank through torchelastic's error file) is
reported. One host: c10d rendezvous on `localhost:0` picks a free port, so a busy default port is
not an error. Several hosts (`Nodes.nnodes > 1`): torch's static TCP rendezvous at
`--rdzv-endpoint`, hosted by node 0's agent; static because it keeps `--node-rank` (c10d orders
the nodes by host name and pid instead), so node 0 runs global rank 0 and receives the profile.
A rank that fails with a UserError (nodes that disagree, bad input) makes the launch a UserError.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift.errors import UserError

MAX_NODES = 1024
_runs = 0  # launches so far in this process: every host counts the same (bench, tune run many)
DEFAULT_RDZV_TIMEOUT_S = 120


# glibc malloc in every rank: serve blocks below 32 MiB (glibc's largest threshold) from the heap
# and never give the heap back. glibc's default threshold moves with what the process freed
# before, so the same steps would fault in fresh pages or not depending on the run's past (a
# never-profiled run vs the steps after a profiled window; benchmarks/README.md). Ignored where
# malloc is not glibc's; a GLIBC_TUNABLES the user set is kept as it is.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1099511627776"


class RankFailed(RuntimeError):
    """A rank exited non-zero; the message carries that rank's own error."""


@dataclass
class Nodes:
    """The hosts of a run, as torchrun's multi-node flags give them.

    Attributes:
        nnodes: hosts, each running `nproc` ranks.
        node_rank: this host's index (0 hosts the rendezvous and global rank 0).
        rdzv_endpoint: "HOST:PORT" of node 0's rendezvous; None on one host.
        rdzv_id: the job's id, the same on every host (None: "sparselift").
        rdzv_timeout_s: seconds to wait for every host at the rendezvous.
    """

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_timeout_s: int = DEFAULT_RDZV_TIMEOUT_S

    def validate(self) -> None:
        """UserError naming the flag that is out of range or missing."""
        if not 1 <= self.nnodes <= MAX_NODES:
            raise UserError(f"--nnodes must be in 1..{MAX_NODES}, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if not 1 <= self.rdzv_timeout_s <= 86_400:
            raise UserError(f"--rdzv-timeout must be in 1..86,400 s, got {self.rdzv_timeout_s}")
        if self.nnodes > 1:
            host, _, port = (self.rdzv_endpoint or "").rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise UserError(
                    f"--rdzv-endpoint must be HOST:PORT with --nnodes {self.nnodes}, "
                    f"got {self.rdzv_endpoint!r}"
                )


def launch(
    nproc: int,
    module: str,
    args: Sequence[str],
    *,
    nodes: Nodes | None = None,
    monitor_interval: float = 0.1,
) -> None:
    """Run `python -m module *args` on `nproc` local ranks (of every host in `nodes`) and wait.

    Args:
        nproc: local ranks.
        module: the module every rank runs.
        args: its arguments.
        nodes: the hosts (None: this one only).
        monitor_interval: how often (s) the elastic agent checks the ranks.
    Raises:
        UserError: `nproc` < 1, bad `nodes`, the rendezvous failed (an unreachable endpoint, a
            host that never came: after `nodes.rdzv_timeout_s`), or a rank failed with a
            UserError (its message).
        RankFailed: a rank exited non-zero; the others were stopped.
    """
    global _runs
    nodes = nodes or Nodes()
    if nproc < 1:
        raise UserError(f"--nproc must be at least 1, got {nproc}")
    nodes.validate()
    if nodes.node_rank > 0:
        wait_for_endpoint(nodes)
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the ranks' error files, read here where torchelastic could not read them
    log_dir = tempfile.mkdtemp(prefix="sparselift-launch-")
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    common: dict[str, Any] = dict(
        nproc_per_node=nproc,
        max_restarts=0,
        monitor_interval=monitor_interval,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    if nodes.nnodes == 1 and nodes.rdzv_endpoint is None:
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            run_id=nodes.rdzv_id or f"sparselift-{uuid.uuid4().hex[:8]}",
            rdzv_backend="c10d",
            rdzv_endpoint="localhost:0",
            **common,
        )
    else:
        config = LaunchConfig(
            min_nodes=nodes.nnodes,
            max_nodes=nodes.nnodes,
            # the n-th run of this command: keys a late host might find in the last run's store
            # are not this run's
            run_id=f"{nodes.rdzv_id or 'sparselift'}-{_runs}",
            rdzv_backend="static",
            rdzv_endpoint=nodes.rdzv_endpoint or "",
            rdzv_configs={"rank": nodes.node_rank, "timeout": nodes.rdzv_timeout_s},
            **common,
        )
    # One thread per rank unless the user says otherwise: ranks share the host's cores.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    os.environ["SPARSELIFT_RDZV_TIMEOUT_S"] = str(nodes.rdzv_timeout_s)
    _runs += 1
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", module, *args)
    except ChildFailedError as e:
        raise failure_error(_failures(e)) from None
    except json.JSONDecodeError:  # torchelastic read a failed rank's error file mid-write;
        # the ranks are stopped by now (torchelastic's agent shuts them down as it raises)
        raise failure_error(error_files(log_dir)) from None
    except Exception as e:  # the rendezvous itself: TCPStore timeouts, refused connections
        if nodes.nnodes == 1 and nodes.rdzv_endpoint is None:
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(
            f"rendezvous at --rdzv-endpoint {config.rdzv_endpoint} (node {nodes.node_rank} of "
            f"{nodes.nnodes}) failed within --rdzv-timeout {nodes.rdzv_timeout_s} s: "
            f"{first[:300]}"
        ) from None
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def wait_for_endpoint(nodes: Nodes) -> None:
    """Wait until node 0's rendezvous endpoint accepts a connection (it may start later).

    Raises:
        UserError: it did not within `nodes.rdzv_timeout_s`.
    """
    host, _, port = (nodes.rdzv_endpoint or "").rpartition(":")
    deadline = time.monotonic() + nodes.rdzv_timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, left)):
                return
        except OSError as e:
            if time.monotonic() + 0.5 >= deadline:
                raise UserError(
                    f"--rdzv-endpoint {nodes.rdzv_endpoint} unreachable from node "
                    f"{nodes.node_rank} within --rdzv-timeout {nodes.rdzv_timeout_s} s: {e}"
                ) from None
            time.sleep(0.5)


def failure_error(lines: list[tuple[int, str]]) -> Exception:
    """The error of failed ranks ((rank, first line of its error) each): a UserError when every
    one failed with a UserError (its message), else RankFailed naming each."""
    user = [m for _, m in lines if m.startswith("UserError: ")]
    if user and len(user) == len(lines):
        return UserError(user[0].removeprefix("UserError: "))
    return RankFailed("; ".join(f"rank {r} failed: {m}" for r, m in lines))


def recorded_error(path: str, exitcode: int | None) -> str:
    """The first line of the error a rank recorded in torchelastic's error file `path`, or its
    exit code where it recorded none (None: not known)."""
    import json

    try:
        msg = json.loads(open(path).read())["message"]
        msg = msg.get("message", "") if isinstance(msg, dict) else str(msg)
    except (OSError, ValueError, KeyError, TypeError):
        msg = ""
    msg = str(msg).strip()
    if msg:
        return msg.splitlines()[0]
    return f"exit code {exitcode}" if exitcode is not None else "no readable error recorded"


def error_files(log_dir: str) -> list[tuple[int, str]]:
    """(rank, first line of its error) per rank that left an error file under `log_dir`
    (torchelastic's `<run>/attempt_<n>/<rank>/error.json`); one line for rank -1 if none did."""
    found = sorted(
        (int(p.parent.name), recorded_error(str(p), None))
        for p in Path(log_dir).glob("*/attempt_*/*/error.json")
        if p.parent.name.isdigit()
    )
    return found or [(-1, "a rank failed and left no readable error")]


def _failures(e: Any) -> list[tuple[int, str]]:
    """(rank, first line of its own error, or its exit code) per failed rank of a
    ChildFailedError."""
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
        parts.append((rank, msg.splitlines()[0] if msg else ""))
    return parts


@contextlib.contextmanager
def rank_malloc_env() -> Iterator[None]:
    """While ranks are launched, GLIBC_TUNABLES is MALLOC_TUNABLES unless already set.

    Ranks inherit the environment when they start (glibc reads it only then); the calling
    process's own malloc is not changed, and its environment is restored afterwards.
    """
    if "GLIBC_TUNABLES" in os.environ:
        yield
        return
    os.environ["GLIBC_TUNABLES"] = MALLOC_TUNABLES
    try:
        yield
    finally:
        os.environ.pop("GLIBC_TUNABLES", None)
