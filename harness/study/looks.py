"""Adaptive seeds: after each look, the next look's seeds for the variants whose claims are still open.

A look happens when a worker finds nothing waiting or running. It judges the claims from the storage alone
(trials' metrics are user attributes) with the report's own code, analysis.claims, so the queue stops
exactly where the report says a claim was decided. The next look's points are queued once however many
workers reach it: the `<study>:look:<n>` study is the lock, as in queue.create_or_wait (should its creator
die before marking it, a waiting worker queues what is missing)."""

from __future__ import annotations

from optuna.trial import TrialState

from ablate.analysis import claims
from ablate.analysis.table import trials_frame
from ablate.harness.study.queue import create_or_wait, load_phase_study, queue_grid_points
from ablate.schema.spec import StudySpec
from ablate.schema.trials import EVAL, optuna_study_name

PENDING = (TrialState.WAITING, TrialState.RUNNING)


def look_lock_name(spec: StudySpec, look: int) -> str:
    return f"{optuna_study_name(spec)}:look:{look}"


def judge(spec: StudySpec, storage) -> list[claims.ClaimResult]:
    """Every claim's verdict and look from the eval trials in the storage, as the report judges them: the
    one judging of a study's claims before its report (the looks, `ablate status`, Study.claims)."""
    trials = load_phase_study(spec, storage, EVAL).get_trials(deepcopy=False)
    return claims.evaluate_all(spec, trials_frame(spec, trials))


def next_look(spec: StudySpec, storage) -> tuple[int, dict[str, list[int]]] | None:
    """(the look, variant -> its seeds for that look) when some claim is still open after the last
    look; None while trials are pending or when no claim wants more seeds."""
    if spec.adaptive is None or pending(spec, storage):
        return None
    wanted = claims.seeds_wanted(spec, judge(spec, storage))
    if not wanted:
        return None
    look = spec.seed_looks.index(max(wanted.values()))
    return look, {variant: spec.seed_pool[:count] for variant, count in wanted.items()}


def pending(spec: StudySpec, storage) -> bool:
    """Whether any eval trial waits or runs."""
    return bool(load_phase_study(spec, storage, EVAL).get_trials(deepcopy=False, states=PENDING))


def queue_next_look(spec: StudySpec, storage, wait_s: float = 60.0) -> bool:
    """Queues the next look's seeds (once, whichever worker gets here first); True when there are trials
    to run again, False when the study is finished."""
    planned = next_look(spec, storage)
    if planned is None:
        return pending(spec, storage)
    look, seeds = planned
    lock, _ = create_or_wait(storage, look_lock_name(spec, look), wait_s)
    if "queued" not in lock.user_attrs:
        queue_grid_points(spec, load_phase_study(spec, storage, EVAL), seeds)
        lock.set_user_attr("queued", {variant: len(s) for variant, s in seeds.items()})
    return True
