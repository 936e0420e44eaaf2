"""Profiler stage: hook a window of sharded training steps and record traces, access statistics and
what ran (the profile directory of docs/CONTRACTS.md).

Hook API: `ProfileSession` (a context manager with `.step()`, or step_begin/step_end/finish) and
`profile_pipeline` (wraps a TorchRec TrainPipeline); `side_by_side` times several plans' steps
in turns in one job of a user's trainer, for `sparselift compare`. Harness adapter:
`sparselift.profiler.hook:make_hook`.

Modules: `session` (the hook API), `pipeline` (`ProfiledPipeline`), `collect` (traces to rank 0,
missing ranks), `merge` (rank 0's facts and files), `access` (capturing what each sharded module
receives), `access_stats` (statistics of those captures), `transform_cost` (the split plans'
batch transform timed on a captured batch), `zipf` (the skew fit), `trace`
(torch.profiler), `manifest` (what ran), `outdir` (the directory and its files), `gather` (ranks to
rank 0), `hook` (the harness adapter), `side_by_side` (plans in turns in one job).
"""

from sparselift.profiler.access import NoShardedEmbeddingError
from sparselift.profiler.session import ProfiledPipeline, ProfileSession, profile_pipeline
from sparselift.profiler.side_by_side import side_by_side

__all__ = [
    "ProfileSession",
    "ProfiledPipeline",
    "profile_pipeline",
    "side_by_side",
    "NoShardedEmbeddingError",
]
