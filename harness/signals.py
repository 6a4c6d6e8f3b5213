"""SIGTERM (spot preemption, a scheduler about to kill), SIGUSR1 (SLURM's warning before a time limit,
`--signal=USR1@90`) and SIGINT (Ctrl-C) as a request to stop: a worker notes it instead of dying mid-step,
its trial checkpoints after the current step and goes back to the queue (checkpoints.Checkpointer), and
the worker exits with 128 + the signal's number. Lightning's own SIGTERM handler composes with this one (it
keeps the handler it finds)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal a process gets when its parent dies
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STOP_GRACE_S = 25.0  # how long a sweep waits for its stopped workers to checkpoint before it kills them

_received: signal.Signals | None = None


def install(then: Callable[[signal.Signals], None] | None = None) -> None:
    """From now on the stop signals only set the stop request (and call `then`, e.g. to forward it)."""

    def handler(signum: int, _frame) -> None:
        global _received
        _received = signal.Signals(signum)
        if then is not None:
            then(signal.Signals(signum))

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)


def received() -> signal.Signals | None:
    """The stop signal received since install(), if any."""
    return _received


def exit_code(signum: signal.Signals) -> int:
    """The shell's convention: 130 after Ctrl-C, 143 after SIGTERM, 138 after SIGUSR1."""
    return 128 + int(signum)


def die_with_parent() -> Callable[[], None] | None:
    """For Popen's preexec_fn: the child gets SIGTERM (a worker then checkpoints, queues its trial again and
    exits) when the process that started it dies, however it dies (the OOM killer's SIGKILL included), so
    no worker runs on as an orphan. Linux's prctl(PR_SET_PDEATHSIG); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
