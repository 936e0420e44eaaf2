"""One rank's torch.profiler (Kineto) capture over the profiled window, written atomically.

The profiler is started at the first profiled step and stopped after the last one, so steps outside
the window run with no profiler attached. Each step is marked `ProfilerStep#<global step>` (the
name torch.profiler itself uses) so trace steps line up with the training loop's step numbers.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function


def trace_name(rank: int) -> str:
    """The file name of rank `rank`'s Kineto trace in a profile directory."""
    return f"rank{rank}.trace.json.gz"


def et_name(rank: int) -> str:
    """The file name of rank `rank`'s execution trace in a profile directory."""
    return f"rank{rank}.et.json"


class TraceRecorder:
    """Kineto trace (+ optional execution trace) of the steps between `start` and `stop`."""

    def __init__(
        self, out_dir: Path, rank: int, device: torch.device, execution_trace: bool = False
    ) -> None:
        """Set up (not start) the recording of this rank's trace into `out_dir`."""
        self.out_dir, self.rank, self.device = Path(out_dir), rank, device
        self._et_tmp = self.out_dir / f".{et_name(rank)}.{os.getpid()}.tmp"
        self._et: ExecutionTraceObserver | None = None
        if execution_trace:
            self._et = ExecutionTraceObserver().register_callback(str(self._et_tmp))
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities, record_shapes=True, execution_trace_observer=self._et
        )
        self._step: Any = None
        self._step_name = ""
        self._unrun = ""  # the name of a step range to leave out of the written trace
        self.running = False

    def start(self) -> None:
        """Start recording."""
        self._prof.start()
        self.running = True

    def step_begin(self, step: int) -> None:
        """Open the trace's `ProfilerStep#<step>` range."""
        self._step_name = f"ProfilerStep#{step}"
        self._step = record_function(self._step_name)
        self._step.__enter__()

    def drop_open_step(self) -> None:
        """The open step never ran (training ended first): the written trace leaves it out, so
        that its steps are the steps the manifest says were profiled."""
        if self._step is not None:
            self._unrun = self._step_name

    def step_end(self) -> None:
        """Close the open step range, if any."""
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None

    def stop(self) -> None:
        """Stop recording (idempotent); nothing is written yet."""
        if not self.running:
            return
        self.running = False
        self.step_end()
        self._prof.stop()
        if self._et is not None:
            self._et.unregister_callback()

    def write(self) -> list[str]:
        """Export the trace(s) to temp names in out_dir, then rename; returns the file names."""
        names = []
        final = self.out_dir / trace_name(self.rank)
        # export_chrome_trace gzips when the name ends in .gz
        tmp = self.out_dir / f".{final.name[: -len('.json.gz')]}.{os.getpid()}.tmp.json.gz"
        try:
            self._prof.export_chrome_trace(str(tmp))
            if self._unrun:
                _leave_out(tmp, self._unrun)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        names.append(final.name)
        if self._et is not None and self._et_tmp.exists():
            os.replace(self._et_tmp, self.out_dir / et_name(self.rank))
            names.append(et_name(self.rank))
        return names

    def discard(self) -> None:
        """Drop temp files left by a failed write."""
        self._et_tmp.unlink(missing_ok=True)


def _leave_out(path: Path, name: str) -> None:
    """Rewrite the gzipped Chrome trace `path` without its events named `name`."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc.get("traceEvents", []) if e.get("name") != name]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
