"""Two stored runs of a study side by side, for `ablate compare` and the Python API alike: each opened as
every command opens a stored study (sweep.stored_study, read-only), the same run twice refused, the trial
tables compared by analysis/compare.py. Errors: ConfigError, one line, before anything is written."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.schema.errors import ConfigError
from ablate.sweep import stored_study

if TYPE_CHECKING:
    from ablate.analysis.compare import Comparison

Pair = tuple[Any, Any]


def per_run(flag: str, given: Any, default: Any = None) -> Pair:
    """--storage or --out as given: once for both runs, or twice, the first run's then the second's (a
    list or tuple); not given, `default` for both."""
    values = list(given) if isinstance(given, list | tuple) else [] if given is None else [given]
    if len(values) > 2:
        raise ConfigError(f"{flag}: give it once for both runs or twice, one for each (got {len(values)})")
    values = values or [default]
    return values[0], values[-1]


def compare_stored(command: str, studies: Pair, storages: Pair, outs: Pair) -> Comparison:
    """The runs `studies` (names or study files), each in its storage (None: SQLite under its out folder),
    compared; ConfigError when one is not stored or its storage cannot be read, and when both are one run."""
    from ablate.analysis.compare import Run, compare
    from ablate.analysis.table import trials_frame
    from ablate.harness.study.storage import masked_url
    from ablate.reports.collect import eval_trials

    with ExitStack() as closing:  # each storage opened is closed, the first too when the second fails
        opened = []
        for study, storage, out in zip(studies, storages, outs):
            spec, store = stored_study(command, study, storage, Path(out))
            opened.append((spec, closing.enter_context(store)))
        (first, first_store), (second, second_store) = opened
        if first.name == second.name and same_database(first_store.url, second_store.url):
            raise ConfigError(
                f"{command}: {studies[0]} and {studies[1]} are one run (study {first.name!r} in "
                f"{masked_url(first_store.url)}); give the other run's --out or --storage"
            )
        return compare(*(Run(spec, masked_url(store.url), trials_frame(spec, eval_trials(spec, store)))
                         for spec, store in opened))  # fmt: skip


def same_database(first: str, second: str) -> bool:
    """Whether two storage URLs name one database: one SQLite file however its path is spelt (both exist,
    being open), else the same URL."""
    from ablate.harness.study.storage import sqlite_path

    files = sqlite_path(first), sqlite_path(second)
    if None not in files:
        return os.path.samefile(*files)
    return first == second
