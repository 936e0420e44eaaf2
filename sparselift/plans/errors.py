"""`PlanError`: a plan that cannot be used, with every reason at once.

`sparselift.plans` imports nothing else of ours, so it marks its error as bad input itself
(`is_user_error`), the way the CLI expects: one line, exit code 2.
"""

from __future__ import annotations


class PlanError(ValueError):
    """Bad plan file or a plan that does not fit the model / world: lists each problem."""

    is_user_error = True

    def __init__(self, where: str, problems: list[str] | str) -> None:
        self.where = where
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(f"{where}: " + "; ".join(self.problems))
