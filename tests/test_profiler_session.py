"""The hook API in a user-written training loop on 2 ranks (no SparseLift harness), its faults."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from sparselift.cli import main

# One rank of a user's own trainer: DMP model, TorchRec pipeline, ProfileSession around the loop.
TRAINER = textwrap.dedent("""
    import json, os, sys, warnings
    import torch, torch.distributed as dist
    from sparselift.profiler import ProfileSession, NoShardedEmbeddingError
    from sparselift.workloads.batches import SyntheticBatches
    from sparselift.workloads.sharding import build_optimizer, make_pipeline, shard
    from sparselift.workloads.spec import load_workload

    import time
    out_dir, result_path = sys.argv[1], sys.argv[2]
    loop_steps, steady = int(sys.argv[3]), json.loads(sys.argv[4])
    kwargs = {} if steady is None else {"steady_steps": steady}
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = load_workload("tiny").capped(2000)
    try:
        ProfileSession(out_dir, torch.nn.Linear(2, 2))
        no_sharded = None
    except NoShardedEmbeddingError as e:
        no_sharded = str(e)
    model = shard(spec, dist.GroupMember.WORLD, torch.device("cpu"))
    pipeline = make_pipeline("base", model, build_optimizer(model), torch.device("cpu"))
    batches = iter(SyntheticBatches(spec, rank=rank))
    ebc = [m for m in model.modules() if type(m).__name__ == "ShardedEmbeddingBagCollection"][0]
    steps_done, own, after = 0, [], None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ProfileSession(out_dir, model, warmup=2, steps=2, execution_trace=False,
                            **kwargs) as prof:
            for i in range(loop_steps):
                t0 = time.perf_counter()
                pipeline.progress(batches)
                own.append(time.perf_counter() - t0)
                steps_done += 1
                prof.step()
                if i == 4:
                    after = dict(wrapped="input_dist" in ebc.__dict__,
                                 profiling=torch.autograd.profiler._is_profiler_enabled)
    dist.barrier()
    ours = [str(w.message) for w in caught if "sparselift profiler" in str(w.message)]
    json.dump(dict(steps_done=steps_done, errors=prof.errors, warnings=ours, files=prof.files,
                   profiled=prof.profiled_steps, after=after, no_sharded=no_sharded, own=own),
              open(f"{result_path}.{rank}", "w"))
    dist.destroy_process_group()
    sys.stdout.flush(); os._exit(0)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_user_trainer(
    tmp_path: Path, out_dir: Path, world: int = 2, loop_steps: int = 6, steady: int | None = None
) -> list[dict]:
    """Run TRAINER on `world` ranks for `loop_steps` steps (window: steps 2 and 3); `steady` is
    ProfileSession's steady_steps (None: its default)."""
    args = [str(out_dir), str(tmp_path / "result"), str(loop_steps), json.dumps(steady)]
    return launch_user_script(tmp_path, TRAINER, args, world)


def launch_user_script(tmp_path: Path, text: str, args: list[str], world: int = 2) -> list[dict]:
    """Run the user script `text` with `args` on `world` gloo ranks (torchrun's environment, one
    thread each); each rank writes its JSON result to `<tmp_path>/result.<rank>` (the script is
    given `<tmp_path>/result` among `args`). Returns those results in rank order."""
    script = tmp_path / "trainer.py"
    script.write_text(text)
    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="localhost",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-3000:]
    return [json.loads((tmp_path / f"result.{r}").read_text()) for r in range(world)]


def test_steady_timer_times_n_steps_and_drops_a_step_that_never_ran():
    import time

    import torch

    from sparselift.profiler.steady import SteadyTimer

    timer = SteadyTimer(2, torch.device("cpu"))
    timer.begin()
    timer.drop_open_step()  # begun, never ran: not a step
    timer.end()
    for _ in range(3):  # the third is past n: not timed
        timer.begin()
        time.sleep(0.01)
        timer.end()
    assert timer.complete and len(timer.times_s) == 2
    assert all(0.01 <= t < 1.0 for t in timer.times_s)
    assert timer.gather() == timer.times_s  # not distributed: this rank is the slowest


@pytest.mark.slow
def test_user_loop_on_two_ranks(tmp_path):
    out = tmp_path / "prof"
    results = run_user_trainer(tmp_path, out)
    for r, res in enumerate(results):
        assert res["steps_done"] == 6 and res["errors"] == [] and res["warnings"] == []
        assert res["profiled"] == [2, 3]
        assert res["files"] == [f"rank{r}.trace.json.gz"]
        assert res["after"] == {
            "wrapped": False,
            "profiling": False,
        }  # out of the way after the window
        assert (
            "ShardedEmbeddingBagCollection" in res["no_sharded"] and "Linear" in res["no_sharded"]
        )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "sparselift-profile" and manifest["version"] == 1
    assert manifest["world_size"] == 2 and manifest["profiled_steps"] == [2, 3]
    assert manifest["device"] == "cpu" and manifest["gpu"] is None
    assert manifest["pipeline"] is None and len(manifest["step_times_s"]) == 2
    assert all(len(t) == 4 for t in manifest["step_times_s"])
    assert [t["name"] for t in manifest["tables"]] == [f"t{i}" for i in range(8)]
    df = pd.read_parquet(out / "access_stats.parquet")
    assert len(df) == 8 * 2 * 2 and set(df["step"]) == {2, 3}
    # the default 10 steady steps: training ended after 2 of them, and those 2 were kept
    assert_steady_steps_are_the_steps(manifest["steady_step_s"], results, first=4, n=2)


def assert_steady_steps_are_the_steps(steady: list, results: list[dict], first: int, n: int):
    """`steady` holds steps first..first+n-1, each the slowest rank's wall time: at least the
    slowest rank's own timing of its training step, and not much more (the loop around it)."""
    assert len(steady) == n
    for k, t in enumerate(steady):
        own = max(res["own"][first + k] for res in results)
        assert own <= t <= own + 0.05, (k, t, own)


@pytest.mark.slow
def test_steady_steps_are_timed_after_the_window_and_training_goes_on(tmp_path):
    out = tmp_path / "prof"
    results = run_user_trainer(tmp_path, out, loop_steps=9, steady=3)
    for res in results:
        assert res["steps_done"] == 9 and res["errors"] == [] and res["warnings"] == []
        assert res["profiled"] == [2, 3]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["profiled_steps"] == [2, 3]
    assert all(len(t) == 4 for t in manifest["step_times_s"])  # the window's own timings end
    assert_steady_steps_are_the_steps(manifest["steady_step_s"], results, first=4, n=3)


@pytest.mark.slow
def test_training_that_ends_inside_the_window_still_writes_the_manifest(tmp_path):
    out = tmp_path / "prof"
    results = run_user_trainer(tmp_path, out, loop_steps=3, steady=5)
    for res in results:
        assert res["steps_done"] == 3 and res["errors"] == [] and res["profiled"] == [2]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["profiled_steps"] == [2] and manifest["steady_step_s"] == []
    assert sorted(p.name for p in out.iterdir()) == [
        "access_stats.parquet",
        "hot_ids.parquet",
        "manifest.json",
        "rank0.trace.json.gz",
        "rank1.trace.json.gz",
    ]
    # the step begun by the last prof.step() never ran: the traces hold the profiled step alone,
    # so the profile is analyzed as it is
    for r in (0, 1):
        with gzip.open(out / f"rank{r}.trace.json.gz", "rt") as f:
            events = json.load(f)["traceEvents"]
        steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert steps == {"ProfilerStep#2"}
    assert main(["analyze", str(out)]) == 0


@pytest.mark.slow
def test_unwritable_dir_warns_once_and_training_goes_on(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    results = run_user_trainer(tmp_path, blocker / "prof")
    for res in results:
        assert res["steps_done"] == 6
        assert len(res["warnings"]) == 1 and str(blocker) in res["warnings"][0]
        assert res["errors"] and res["files"] == []
