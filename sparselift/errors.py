"""The error types the CLI turns into a one-line message and exit code 2.

Stages raise `UserError` for bad input (a file, table or rank that is wrong); anything else is a
bug and keeps its traceback. `sparselift.plans` imports nothing of ours, so its `PlanError` marks
itself the same way: the CLI treats any exception with `is_user_error = True` as bad input.
"""


class UserError(Exception):
    """Bad input: the message names what is wrong and where, in one line."""

    is_user_error = True


class UnwritablePathError(UserError, OSError):
    """An output file that cannot be written where asked: "cannot write <path>: <why>".

    Also an OSError, so that code which treats a failed write as best effort (a cache) and
    catches OSError keeps doing so.
    """
