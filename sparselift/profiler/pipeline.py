"""A TorchRec TrainPipeline profiled step by step: `ProfiledPipeline` (`session.profile_pipeline`
makes one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the session module makes these; importing it here would close a circle
    from sparselift.profiler.session import ProfileSession


class ProfiledPipeline:
    """A TorchRec TrainPipeline whose `progress` is one profiled step; the rest passes through."""

    def __init__(self, pipeline: Any, session: ProfileSession) -> None:
        """Profile `pipeline`'s steps with `session`."""
        self.pipeline, self.session, self._step = pipeline, session, 0

    def progress(self, dataloader_iter: Any) -> Any:
        """One training step of the pipeline, between the session's step_begin and step_end.

        Raises:
            StopIteration: the pipeline's, when the data has ended (no step ran); the session
                ends there, keeping the steady steps timed so far, since no later call would.
        """
        self.session.step_begin(self._step)
        try:
            return self.pipeline.progress(dataloader_iter)
        except StopIteration:
            self.session.end_training()
            raise
        finally:
            self.session.step_end(self._step)
            self._step += 1

    def __getattr__(self, name: str) -> Any:
        """Everything else is the pipeline's."""
        return getattr(self.pipeline, name)
