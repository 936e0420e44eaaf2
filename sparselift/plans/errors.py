"""`PlanError`: a plan that cannot be used, with every reason at once.

`sparselift.plans` imports nothing else of ours, so it marks its errors as bad input itself
(`is_user_error`), the way the CLI expects: one line, exit code 2.
"""

from __future__ import annotations


class PlanError(ValueError):
    """Bad plan file, or a plan that does not fit the model / world: lists each problem.

    Attributes:
        where: the plan's source (a file name, or "<plan>").
        problems: one message per problem, each naming the table or field it is about.
    """

    is_user_error = True

    def __init__(self, where: str, problems: list[str] | str) -> None:
        self.where = where
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(f"{where}: " + "; ".join(self.problems))


class PlanWriteError(PlanError, OSError):
    """A plan file that cannot be written where asked: "cannot write <path>: <why>".

    Also an OSError, as the failed write it reports used to be.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.where = path
        self.problems = [reason]
        ValueError.__init__(self, f"cannot write {path}: {reason}")
