"""The two kinds of failure a user sees: bad input (exit 2) and a fault during a run (exit 1)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: the message is one line that names what and where; `problems` keeps every
    (location, message) behind it when there were several."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.problems = problems or []


class RunFailed(RuntimeError):
    """A fault during a run that the input checks could not foresee: one line, exit code 1."""
