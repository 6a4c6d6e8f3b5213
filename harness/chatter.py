"""Library chatter kept off the terminal, where it would bury the lines `ablate` prints: what Optuna,
Lightning and W&B log at INFO (new studies, devices, tips, checkpoint restores) and library warnings
(deprecations, advice). `ablate --verbose` (ABLATE_VERBOSE=1, inherited by a sweep's workers) shows all."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

VERBOSE_ENV = "ABLATE_VERBOSE"
# Any module but the project's own: a warning attributed to ablate's code is about ablate, and stays.
NOT_ABLATE = r"(?!ablate(\.|$))"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def quiet_libraries() -> None:
    """Unless verbose, mutes log records at INFO and below and warnings raised outside ablate, for the
    whole process: only the command line, which owns the terminal, calls it."""
    if verbose():
        return
    logging.disable(logging.INFO)
    warnings.filterwarnings("ignore", module=NOT_ABLATE)


@contextmanager
def quiet_experimental() -> Iterator[None]:
    """Optuna features stable in practice but still flagged experimental (heartbeats, failing stale trials,
    retry copies, metric names; PED-ANOVA before Optuna 5): one warning per storage, worker or report would
    bury what a user needs to see, verbose or not."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield
