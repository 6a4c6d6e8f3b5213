"""The storage interface a worker holds trials through (harness/study/leases.py), under two workers racing
on one SQLite storage: each trial claimed exactly once, a released one claimable again, a stale heartbeat's
trial failed and its retry found."""

from __future__ import annotations

import threading
import time

import optuna
from optuna.trial import TrialState

from ablate.harness import compat
from ablate.harness.study.leases import Leases
from ablate.harness.study.storage import open_storage
from ablate.schema.spec import HeartbeatSpec

TRIALS = 40


def queued_study(url: str, heartbeat: HeartbeatSpec = HeartbeatSpec()) -> tuple[optuna.Study, Leases]:
    """The study of TRIALS waiting trials, and a worker's Leases on its storage."""
    storage = open_storage(url, heartbeat=heartbeat)
    study = optuna.create_study(study_name="race", storage=storage)
    for _ in range(TRIALS):
        study.enqueue_trial({})
    return study, Leases(storage)


def test_two_workers_racing_claim_each_trial_exactly_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    queued_study(url)
    claimed: list[list[int]] = [[], []]
    tried: list[list[int]] = [[], []]
    start, read = threading.Barrier(2), threading.Barrier(2)

    def worker(k: int) -> None:
        storage = open_storage(url, create_dir=False)  # each its own connection, as another process has
        leases, study = Leases(storage), optuna.load_study(study_name="race", storage=storage)
        start.wait()
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        read.wait()  # both hold the whole list before either claims: every claim is contested
        while waiting:
            for frozen in waiting:
                tried[k].append(frozen.number)
                if leases.claim(frozen):
                    claimed[k].append(frozen.number)
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(claimed[0] + claimed[1]) == list(range(TRIALS))  # none twice, none left
    assert sorted(tried[0]) == sorted(tried[1]) == list(range(TRIALS))  # they did race, for every trial


def test_a_released_trial_is_claimable_again_by_the_other_worker(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study, first = queued_study(url)
    second = Leases(open_storage(url, create_dir=False))
    frozen = study.get_trials(deepcopy=False)[0]
    assert first.claim(frozen) and not second.claim(frozen)
    first.release(compat.trial_id(frozen))
    assert study.get_trials(deepcopy=False)[0].state == TrialState.WAITING
    assert second.claim(frozen) and not first.claim(frozen)


def test_a_trial_whose_heartbeat_stops_is_failed_by_the_other_worker_and_its_retry_found(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    beats = HeartbeatSpec(interval=1, grace=2)
    study, dead = queued_study(url, beats)
    frozen = study.get_trials(deepcopy=False)[0]
    assert dead.claim(frozen)
    trial = optuna.Trial(study, compat.trial_id(frozen))
    with dead.beating([compat.trial_id(frozen)]):
        time.sleep(2.5)  # beating: past the grace, yet not stale
        alive = Leases(open_storage(url, create_dir=False, heartbeat=beats))
        alive.fail_stale([optuna.load_study(study_name="race", storage=alive.storage)])
        assert study.get_trials(deepcopy=False)[0].state == TrialState.RUNNING
        assert dead.finished_elsewhere(study, trial) is None
    # The worker "died": once no beat is newer than the grace, the other worker fails its trial. Polled, as a
    # loaded machine may record the last beat late (a fixed 2.5 s failed once under two test runs at a time).
    deadline = time.monotonic() + 20
    while study.get_trials(deepcopy=False)[0].state == TrialState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.5)
        alive.fail_stale([optuna.load_study(study_name="race", storage=alive.storage)])
    trials = study.get_trials(deepcopy=False)
    assert trials[0].state == TrialState.FAIL
    (retry,) = [t for t in trials if t.system_attrs.get("retry_history") == [0]]
    assert retry.state == TrialState.WAITING
    assert dead.finished_elsewhere(study, trial) == (
        "was retried elsewhere while this worker was paused (its heartbeat went stale)"
    )
