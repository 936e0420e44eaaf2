"""What each launched rank runs: `python -m sparselift.workloads.worker CONFIG RESULT_DIR`.

Before training, the ranks meet at the rendezvous store (node 0's, `MASTER_ADDR:MASTER_PORT`) and
compare what they are about to run (`run_identity`: SparseLift version, workload, plan, run
settings): hosts that disagree stop there with one line naming the node and the first difference
(a UserError). A rank that fails leaves its error in that store; the other ranks' watchdog reads it
within a second and stops with it, so a host dying mid-run stops every host with its error. After
training every rank's result is gathered on every rank (all_gather), and each host's local rank 0
writes them all, so every host's launcher sees the whole run.

A rank writes its result atomically, leaves the process group, and then ends with `os._exit`:
after training, background C++ threads of the process group (gloo's, the c10d store's) can still be
joinable when the interpreter tears down static objects, which aborts the process with
"terminate called without an active exception" and turns a finished run into a failure. Exiting
directly after an orderly `destroy_process_group()` skips that teardown, so the exit code reports
what the run did. Failures go to torchelastic's error file, which the launcher reports, and the rank
exits at once without leaving the group: leaving can wait on peers still in a collective, and a peer
that fails first (its collective broken) would then be the only failure the launcher sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from sparselift.atomic import write_json
from sparselift.errors import UserError

ERROR_KEY = "error"  # under sparselift/<run id>/ in node 0's store
WATCH_INTERVAL_S = 0.5


def quiet_library_noise() -> None:
    """TorchRec and torch warn on every rank about deprecations the user cannot act on."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch(rec)?\.")
    for name in ("torchrec", "torch.fx", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)


def node_index() -> int:
    """This rank's host index: torchelastic's GROUP_RANK, SLURM's node id, else RANK // local."""
    for key in ("GROUP_RANK", "SLURM_NODEID"):
        if key in os.environ:
            return int(os.environ[key])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return int(os.environ.get("RANK", 0)) // max(1, local)


def run_identity(cfg: Any) -> dict[str, str]:
    """What every host must agree on, in the order differences are reported.

    Returns:
        sparselift version, workload (name and a hash of the capped spec), plan and the plans
        side by side (file name and a hash of its bytes, or TorchRec's planner), and the run's
        settings.
    """
    import sparselift
    from sparselift.workloads.spec import load_workload

    spec = load_workload(cfg.workload).capped(cfg.max_rows)
    spec_hash = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True, default=str).encode())

    def named(plan: str | None) -> str:
        if not plan:
            return "TorchRec's planner"
        digest = hashlib.sha256(Path(plan).read_bytes()).hexdigest()[:12]
        return f"{Path(plan).name} sha256 {digest}"

    return {
        "SparseLift version": sparselift.__version__,
        "workload": f"{spec.name} sha256 {spec_hash.hexdigest()[:12]}",
        "plan": named(cfg.plan),
        "plans side by side": "; ".join(named(p) for p in cfg.contenders),
        "rounds": str(cfg.rounds),
        "ranks per node": str(cfg.nproc),
        "steps": str(cfg.steps),
        "warmup": str(cfg.warmup),
        "batch size": str(cfg.batch_size),
        "seed": str(cfg.seed),
        "pipeline": str(cfg.pipeline),
        "device": cfg.device,
        "data": "Criteo day files" if cfg.data else "synthetic",
        "hook": str(cfg.hook),
    }


class Peers:
    """This rank's link to the other ranks through node 0's rendezvous store."""

    def __init__(self, timeout_s: float) -> None:
        """Connect to MASTER_ADDR:MASTER_PORT (the agent's store: TORCHELASTIC_USE_AGENT_STORE)."""
        from torch.distributed import PrefixStore, TCPStore

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.node = node_index()
        self.timeout = timedelta(seconds=timeout_s)
        self._addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        self._prefix = f"sparselift/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
        self.store = PrefixStore(
            self._prefix, TCPStore(*self._addr, is_master=False, timeout=self.timeout)
        )
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def check(self, identity: dict[str, str]) -> None:
        """Compare `identity` with rank 0's (rank 0: with every rank's).

        Raises:
            UserError: one line naming the node that differs and the first difference.
        """
        me = json.dumps(dict(identity, host=socket.gethostname(), node=str(self.node)))
        self.store.set(f"check/{self.rank}", me)
        others = range(1, self.world) if self.rank == 0 else [0]
        for r in others:
            theirs = json.loads(self.store.get(f"check/{r}"))
            if r == 0:
                first, second = theirs, json.loads(me)
            else:
                first, second = json.loads(me), theirs
            for key in identity:
                if first.get(key) != second.get(key):
                    raise UserError(
                        f"nodes disagree at rendezvous: node {second['node']} "
                        f"({second['host']}, rank {r if r else self.rank}) has {key} "
                        f"{second.get(key)}, node 0 has {first.get(key)}"
                    )

    def report(self, e: BaseException) -> None:
        """Leave this rank's error in the store for the others (the first error stays)."""
        value = json.dumps(
            dict(rank=self.rank, node=self.node, type=type(e).__name__, message=str(e))
        )
        self.store.compare_set(ERROR_KEY, "", value)

    def peer_error(self) -> BaseException | None:
        """The error another rank left in the store, as the exception to record; None if none."""
        if not self.store.check([ERROR_KEY]):
            return None
        d = json.loads(self.store.get(ERROR_KEY))
        if d["rank"] == self.rank:
            return None
        if d["type"] == "UserError":
            return UserError(d["message"])
        return RuntimeError(
            f"node {d['node']} (rank {d['rank']}) failed: {d['type']}: {d['message']}"
        )

    def watch(self) -> None:
        """Start a thread that ends this rank with a peer's error as soon as one is reported,
        or when node 0's store is gone (its host died)."""
        from torch.distributed import PrefixStore, TCPStore

        store = PrefixStore(
            self._prefix, TCPStore(*self._addr, is_master=False, timeout=self.timeout)
        )

        def loop() -> None:
            while not self._stop.wait(WATCH_INTERVAL_S):
                try:
                    if not store.check([ERROR_KEY]):
                        continue
                    d = json.loads(store.get(ERROR_KEY))
                    if d["rank"] == self.rank:
                        continue
                    err: BaseException = (
                        UserError(d["message"])
                        if d["type"] == "UserError"
                        else RuntimeError(
                            f"node {d['node']} (rank {d['rank']}) failed: "
                            f"{d['type']}: {d['message']}"
                        )
                    )
                except Exception as e:
                    if self._stop.is_set():
                        return
                    err = RuntimeError(f"lost node 0's rendezvous store {self._addr}: {e}")
                _die(err)

        self._watch = threading.Thread(target=loop, name="sparselift-watchdog", daemon=True)
        self._watch.start()

    def stop(self) -> None:
        """Stop the watchdog (before leaving the process group)."""
        self._stop.set()


def _die(e: BaseException) -> None:
    """Record `e` for the launcher and end this process now."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    print(f"sparselift rank {os.environ.get('RANK')}: {e}", file=sys.stderr, flush=True)
    ErrorHandler().record_exception(e)
    os._exit(1)


def run_rank(cfg: Any, peers: Peers | None) -> list[dict[str, Any]]:
    """Check the hosts agree, train this rank, and gather every rank's RankResult (as dicts).

    Raises:
        UserError: the hosts disagree (`Peers.check`).
    """
    import torch.distributed as dist

    from sparselift.workloads.rank import train_rank
    from sparselift.workloads.side_by_side import train_side_by_side

    if peers is not None:
        peers.check(run_identity(cfg))
        peers.watch()
    result = train_side_by_side(cfg) if cfg.contenders else train_rank(cfg)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, asdict(result))
    if peers is not None:
        peers.stop()
    return everyone


_PEERS: Peers | None = None


def main(argv: list[str]) -> int:
    """Train this rank of the run in CONFIG (a TrainConfig as JSON).

    argv is [CONFIG, RESULT_DIR]; local rank 0 (every rank with SPARSELIFT_ALL_RESULTS set: one
    result directory per rank) writes every rank's RankResult to RESULT_DIR/rank<R>.json.
    """
    global _PEERS
    cfg_path, out_dir = argv
    quiet_library_noise()
    from sparselift.workloads.harness import TrainConfig

    cfg = TrainConfig(**json.loads(Path(cfg_path).read_text()))
    _PEERS = Peers(float(os.environ.get("SPARSELIFT_RDZV_TIMEOUT_S", 120)))
    results = run_rank(cfg, _PEERS)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0 or os.environ.get("SPARSELIFT_ALL_RESULTS"):
        for r in results:
            write_json(Path(out_dir, f"rank{r['rank']}.json"), r)
    return 0


if __name__ == "__main__":
    code = 0
    try:
        code = main(sys.argv[1:])
    except BaseException as e:  # every failure must reach the launcher
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        recorded: BaseException = e
        try:
            if _PEERS is not None:
                recorded = _PEERS.peer_error() or e
                if recorded is e:
                    _PEERS.report(e)
        except Exception:  # the store may be gone with its host; report our own error
            pass
        if not isinstance(recorded, UserError):
            traceback.print_exc()
        ErrorHandler().record_exception(recorded)
        code = 1
    finally:
        try:
            import torch.distributed as dist

            if code == 0 and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # best effort: the exit code already says what the run did
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
