"""Profiler stage: hook a window of sharded training steps and record traces, access statistics and
what ran (the profile directory of docs/CONTRACTS.md).

Hook API: `ProfileSession` (a context manager with `.step()`, or step_begin/step_end/finish) and
`profile_pipeline` (wraps a TorchRec TrainPipeline). Harness adapter: `sparselift.profiler.hook:make_hook`.
"""

from sparselift.profiler.access import NoShardedEmbeddingError
from sparselift.profiler.session import ProfiledPipeline, ProfileSession, profile_pipeline

__all__ = ["ProfileSession", "ProfiledPipeline", "profile_pipeline", "NoShardedEmbeddingError"]
