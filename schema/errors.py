"""The kinds of failure a user sees: bad input (exit 2), a fault during a run (exit 1), and a sweep stopped at
its time limit with trials left (exit 75), which the same command continues."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: the message is one line that names what and where; `problems` keeps every
    (location, message) behind it when there were several."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.problems = problems or []


class RunFailed(RuntimeError):
    """A fault during a run that the input checks could not foresee: one line, exit code 1."""


class TimeLimit(RuntimeError):
    """A sweep stopped at its time limit with trials left, each checkpointed by its worker: one line, exit
    code 75 (EX_TEMPFAIL: run the same command again, which continues from the storage)."""

    EXIT = 75
