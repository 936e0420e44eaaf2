"""The hook API: profile a window of steps of any TorchRec (DMP) training loop, on every rank.

    with ProfileSession("prof/", model=dmp_model, warmup=5, steps=3) as prof:
        for batch in batches:
            train_step(batch)
            prof.step()

or `profile_pipeline(pipeline, "prof/", ...)` around a TorchRec TrainPipeline, or the explicit
`step_begin(i)` / `step_end(i)` / `finish()` protocol that the SparseLift harness calls.

Steps before the window run untouched. At the first profiled step the session starts
torch.profiler and wraps the sharded modules' `input_dist`; after the last it unwraps, writes this
rank's trace (other ranks stream theirs to rank 0: no shared filesystem is needed; a trace that did
not arrive is named in `missing_ranks`), and gathers every rank's access statistics and timings of
a split plan's costs on rank 0, which writes `hot_ids.parquet`, `access_stats.parquet` and
`manifest.json` (`write_files=False`: `finish()` hands the last two to the caller). Then it times
`steady_steps` more steps with only two clock reads a kernel call attached (the window runs slower
than training), and rank 0 rewrites the manifest with their `steady_step_s`, `lookup_s` and
`split_cost_s` (kept if training ends first, once `finish()` runs or the `with` block ends).
`execution_trace=True` also records torch's ExecutionTraceObserver (`rank<R>.et.json`; off by
default: it costs disk and slows the steps after the window). Nothing the profiler does may stop
training: every failure is caught, warned about once, and listed in `errors`.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sparselift.errors import UserError
from sparselift.profiler.access import (
    AccessRecorder,
    feature_processed_paths,
    find_sharded_modules,
    model_device,
    table_metas,
    warn_duplicate_tables,
)
from sparselift.profiler.access_stats import access_rows, rank_table_steps, table_histograms
from sparselift.profiler.collect import collect_traces
from sparselift.profiler.gather import barrier, gather_to_rank0
from sparselift.profiler.hot_ids import record_hot_ids
from sparselift.profiler.manifest import ProfileFacts, comm_precision_of, sharding_of, split_record
from sparselift.profiler.merge import RankReport, profile_facts, write_manifest, write_profile
from sparselift.profiler.pipeline import ProfiledPipeline
from sparselift.profiler.recombine_cost import recombine_record, time_recombine
from sparselift.profiler.steady import SteadyTimer
from sparselift.profiler.step_timers import StepTimers
from sparselift.profiler.trace import TraceRecorder
from sparselift.profiler.transform_cost import time_transform, transform_record

# Re-exported: `sparselift.profiler.session` has always offered these along with the session.
__all__ = [
    "ProfileSession",
    "ProfiledPipeline",
    "RankReport",
    "profile_pipeline",
    "write_manifest",
    "write_profile",
]


class ProfileSession:
    """Profile steps [warmup, warmup + steps) of the training loop on this rank.

    Args:
        out_dir: the profile directory (created).
        model: the DMP-sharded model.
        warmup: steps before the window.
        steps: profiled steps.
        execution_trace: also record torch's ExecutionTraceObserver.
        pipeline: the TorchRec TrainPipeline, if any (its class is recorded).
        write_files: rank 0 writes access_stats.parquet and manifest.json itself; False: the
            caller does, from `finish()` (rank 0 writes hot_ids.parquet either way).
        spec_tables: the workload spec's tables by name (their pooling and skew are recorded).
        command: the command line to record (default: sys.argv).
        workload: the workload's name to record.
        device: this rank's device (default: the model's).
        steady_steps: steps timed after the window with nothing attached (0: none).
        plan: the `sparselift.plans.Plan` the model was sharded by, if any. One with splits is
            recorded (`manifest.split_record`: the model's own tables and the splits, so that
            the profile is known as one of that model and the plan in force can be rebuilt),
            and on CPU its batch transform (the one the data path calls) and the split model's
            recombination are timed in the steady steps (`split_timer.py`).
    Raises:
        UserError: a bad window or steady_steps < 0, or NoShardedEmbeddingError: the model is
            not DMP-sharded.
    """

    def __init__(
        self,
        out_dir: str | Path,
        model: nn.Module,
        *,
        warmup: int = 5,
        steps: int = 3,
        execution_trace: bool = False,
        pipeline: Any = None,
        write_files: bool = True,
        spec_tables: dict[str, Any] | None = None,
        command: list[str] | None = None,
        workload: str | None = None,
        device: torch.device | None = None,
        steady_steps: int = 10,
        plan: Any = None,
    ) -> None:
        if warmup < 0 or steps < 1 or steady_steps < 0:
            raise UserError(
                f"profile window needs warmup >= 0, steps >= 1 and steady_steps >= 0, "
                f"got warmup={warmup} steps={steps} steady_steps={steady_steps}"
            )
        import torch.distributed as dist

        self.modules = find_sharded_modules(model)
        self.tables = table_metas(self.modules, feature_processed_paths(model))
        warn_duplicate_tables(self.tables)
        self.sharding = sharding_of(model)
        self.comm_precision = comm_precision_of([m for _, m in self.modules])
        self.out_dir = Path(out_dir)
        self.first, self.last = warmup, warmup + steps - 1
        self.execution_trace = execution_trace
        self.pipeline = type(pipeline).__name__ if pipeline is not None else None
        self.write_files = write_files
        self.spec_tables, self.command, self.workload = spec_tables, command, workload
        record = split_record(plan)  # a split plan's sharded modules hold virtual tables
        self.model_tables, self.splits = record.get("model_tables"), record.get("splits")
        transform = plan.batch_transform() if record else None
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.backend = str(dist.get_backend()) if distributed else None
        self.device = device or model_device(model)
        self.step_times_s: list[float] = []
        self.profiled_steps: list[int] = []
        self.errors: list[str] = []
        self.files: list[str] = []
        self.done = False
        self.result: dict[str, Any] | None = None  # rank 0, after the window: rows, facts
        self._recorder = AccessRecorder(self.modules)
        self._trace: TraceRecorder | None = None
        self._t0: float | None = None
        self._next = 0
        self._facts: ProfileFacts | None = None  # rank 0, after the window
        self._steady = SteadyTimer(steady_steps, self.device)
        # the kernels' own seconds per step, and a split model's (CPU only)
        self._timers = StepTimers(self.modules, model, transform, self.device, self._guard)
        self._steady_open = False  # timing steady steps: the window closed at its last step
        self._trace_dir = self.out_dir  # rank 0's; the others' traces are sent to it
        if self.rank == 0:
            self._guard(
                lambda: self.out_dir.mkdir(parents=True, exist_ok=True), f"creating {self.out_dir}"
            )

    # ---------------------------------------------------------- the protocol the harness calls

    def step_begin(self, step: int) -> None:
        """Before step `step`: opens the window at its first step (profiler on, capture on)."""
        if self.done:
            if self._steady_open:
                self._steady.begin()
                self._timers.begin(steady=True)
            return
        if step == self.first:
            self._guard(self._open, "starting the profiler")
        if self.first <= step <= self.last:
            self._timers.begin(steady=False)
            self._recorder.step = step
            if self._trace is not None and self._trace.running:
                self._guard(lambda: self._trace.step_begin(step), "marking a step")
        self._t0 = time.perf_counter()  # the step's own time, not starting the profiler

    def step_end(self, step: int) -> None:
        """After step `step`: times it; after the window's last step, closes the window; after the
        last steady step, gathers the steady steps."""
        if self.done:
            if self._steady_open:
                self._steady.end()
                self._timers.end(steady=True)
                if self._steady.complete:
                    self._end_steady()
            return
        in_window = self.first <= step <= self.last
        if in_window and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self._t0 is not None:
            self.step_times_s.append(time.perf_counter() - self._t0)
            self._t0 = None
        if in_window:
            self._timers.end(steady=False)
            self._recorder.step = None
            self.profiled_steps.append(step)
            if self._trace is not None:
                self._guard(self._trace.step_end, "marking a step")
        if step >= self.last:
            self._close()
            self._steady_open = self._steady.n > 0
            if self._steady_open:
                self._timers.start_steady()
            else:
                self._timers.detach()

    def finish(self) -> dict[str, Any]:
        """Close the window if training ended inside it, or gather the steady steps timed so far;
        a JSON-able summary of this rank. Every rank must call it (it may meet the others).

        Returns:
            rank, profiled_steps, files, errors; on rank 0 also `rows` (access statistics) and
            `facts` (the manifest's ProfileFacts as a dict, `steady_step_s` included).
        """
        if not self.done:
            self._close()
        elif self._steady_open:
            self._end_steady()
        out: dict[str, Any] = dict(
            rank=self.rank, profiled_steps=self.profiled_steps, files=self.files, errors=self.errors
        )
        if self.result is not None:
            out.update(self.result)
        return out

    # ------------------------------------------------------------------ the user-facing loop API

    def __enter__(self) -> ProfileSession:
        """Begin step 0."""
        self.step_begin(self._next)
        return self

    def step(self) -> None:
        """Call once after each training step."""
        self.step_end(self._next)
        self._next += 1
        self.step_begin(self._next)

    def __exit__(self, *exc: Any) -> None:
        """`end_training`."""
        self.end_training()

    def end_training(self) -> None:
        """Training is over and the step begun last never ran: close the window if it is still
        open (training ended inside it), or gather the steady steps timed so far."""
        self._t0 = None  # the step begun by the last step() never ran
        self._steady.drop_open_step()
        if not self.done:
            self._recorder.step = None
            if self._trace is not None:
                self._trace.drop_open_step()
            self._close()
        elif self._steady_open:
            self._end_steady()

    # ------------------------------------------------------------------ inside

    def _guard(self, fn: Any, what: str) -> Any:
        try:
            return fn()
        except Exception as e:  # the profiler must never stop training
            msg = f"{what}: {type(e).__name__}: {e}"
            if not self.errors:
                warnings.warn(
                    f"sparselift profiler (rank {self.rank}): {msg}; training goes on",
                    RuntimeWarning,
                    stacklevel=3,
                )
            self.errors.append(msg)
            return None

    def _open(self) -> None:
        self._recorder.attach()
        self._timers.open_window()
        if self.rank != 0:
            self._trace_dir = Path(tempfile.mkdtemp(prefix=f"sparselift-rank{self.rank}-"))
        self._trace = TraceRecorder(self._trace_dir, self.rank, self.device, self.execution_trace)
        self._trace.start()

    def _close(self) -> None:
        """End of the window: unhook, write the trace, and meet the other ranks exactly once."""
        self.done = True
        self._guard(self._recorder.detach, "removing hooks")
        if self._trace is not None:
            trace = self._trace
            self._guard(trace.stop, "stopping the profiler")
            written = self._guard(trace.write, f"writing traces to {self._trace_dir}")
            if written is None:
                self._guard(trace.discard, "removing temp files")
            self.files = written or []
            self._trace = None
        captures, self._recorder.captures = self._recorder.captures, []
        steps = (
            self._guard(
                lambda: rank_table_steps(self.tables, captures, self.rank), "access statistics"
            )
            or []
        )
        from sparselift.workloads.rank import peak_memory_bytes

        peak = int(self._guard(lambda: peak_memory_bytes(self.device), "peak memory") or 0)
        timing = self._guard(  # after the peak memory: it must not count what the timing holds
            lambda: time_transform(self.tables, captures, steps, self.rank),
            "timing the batch transform",
        )
        recombination = self._guard(
            lambda: time_recombine(self.tables, captures, self.device, self.rank),
            "timing the recombination",
        )
        report = RankReport(
            rank=self.rank,
            device=self.device.type,
            step_times_s=self.step_times_s,
            peak_memory_bytes=peak,
            files=self.files,
            errors=list(self.errors),
            table_steps=steps,
            host=socket.gethostname(),
            transform=timing,
            recombine=recombination,
        )
        reports = self._guard(lambda: gather_to_rank0(report), "gathering ranks on rank 0")
        self._gather_traces(reports)
        if self.rank == 0 and reports:
            self._guard(lambda: self._rank0(reports), "merging access statistics")
        # Leave the window together: otherwise the other ranks' next step waits out rank 0's merge.
        self._guard(barrier, "leaving the window")

    def _gather_traces(self, reports: list[RankReport] | None) -> None:
        """Stream the other ranks' trace files into rank 0's directory. Afterwards a rank's
        `files` are those that arrived; a rank whose trace did not is warned and, on rank 0,
        named in `errors`."""
        self.files, missing = collect_traces(
            self.rank, self.files, self._trace_dir, self.out_dir, reports, self._guard
        )
        self.errors += missing

    def _end_steady(self) -> None:
        """Meet the other ranks once with the steady steps; rank 0 rewrites the manifest."""
        self._steady_open = False
        self._timers.detach()
        steady = self._guard(self._steady.gather, "gathering steady steps on rank 0")
        lookup_s, split_cost_s = self._timers.gather()
        if self.rank != 0 or steady is None or self._facts is None or self.result is None:
            return
        facts = self._facts
        facts.steady_step_s = steady
        facts.lookup_s, facts.split_cost_s = lookup_s, split_cost_s
        self.result["facts"].update(
            steady_step_s=list(steady), lookup_s=lookup_s, split_cost_s=split_cost_s
        )
        if self.write_files:
            self._guard(
                lambda: write_manifest(self.out_dir, facts),
                f"writing the manifest to {self.out_dir}",
            )

    def _rank0(self, reports: list[RankReport]) -> None:
        steps = [s for r in reports for s in r.table_steps]
        hists = table_histograms(steps)
        rows, alphas = access_rows(self.tables, steps, hists)
        hot = self._guard(
            lambda: record_hot_ids(self.out_dir, self.tables, hists),
            f"writing hot ids to {self.out_dir}",
        )
        transform = self._guard(
            lambda: transform_record([r.transform for r in reports]), "fitting the batch transform"
        )
        recombination = self._guard(
            lambda: recombine_record([r.recombine for r in reports]), "fitting the recombination"
        )
        facts = profile_facts(self, reports, alphas, hot, transform, recombination)
        self._facts = facts
        self.result = dict(rows=rows, facts=asdict(facts))
        if self.write_files:
            self._guard(
                lambda: write_profile(self.out_dir, rows, facts),
                f"writing the profile to {self.out_dir}",
            )


def profile_pipeline(
    pipeline: Any, out_dir: str | Path, *, warmup: int = 5, steps: int = 3, **kwargs: Any
) -> ProfiledPipeline:
    """Wrap `pipeline` (its model must be DMP-sharded) so that its next steps are profiled."""
    model = getattr(pipeline, "_model", None)
    if model is None:
        raise UserError(f"{type(pipeline).__name__} has no `_model`: pass a TorchRec TrainPipeline")
    return ProfiledPipeline(
        pipeline,
        ProfileSession(out_dir, model, warmup=warmup, steps=steps, pipeline=pipeline, **kwargs),
    )
