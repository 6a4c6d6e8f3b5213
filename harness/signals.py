"""SIGTERM (spot preemption, SLURM's warning before it kills) and SIGINT (Ctrl-C) as a request to stop.

A worker notes the signal instead of dying mid-step: its running trial checkpoints after the step it is
in and goes back to the queue (harness.checkpoints.Checkpointer), then the worker exits with 128 + the
signal's number. Lightning's own SIGTERM handler composes with this one (it keeps the handler it finds)."""

from __future__ import annotations

import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: signal.Signals | None = None


def _note(signum: int, _frame) -> None:
    global _received
    _received = signal.Signals(signum)


def install(then: Callable[[signal.Signals], None] | None = None) -> None:
    """From now on SIGTERM and SIGINT only set the stop request (and call `then`, e.g. to forward it)."""

    def handler(signum: int, frame) -> None:
        _note(signum, frame)
        if then is not None:
            then(signal.Signals(signum))

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)


def received() -> signal.Signals | None:
    """The stop signal received since install(), if any."""
    return _received


def exit_code(signum: signal.Signals) -> int:
    """The shell's convention: 130 after Ctrl-C, 143 after SIGTERM."""
    return 128 + int(signum)
