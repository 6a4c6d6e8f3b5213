"""The trials a worker holds, only ever through `Leases`: a WAITING trial claimed exactly once, its
heartbeat while it runs, its release back to the queue, and whether another worker's look at the heartbeat
finished it while this one was paused. A dead worker stops beating; the next to look (`fail_stale`) fails
its trial once the heartbeat is `grace` seconds old and queues a WAITING copy (open_storage's callback)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import optuna
from optuna.trial import FrozenTrial, TrialState

from ablate.harness import compat
from ablate.harness.chatter import quiet_experimental


class Leases:
    def __init__(self, storage):
        self.storage = storage

    def claim(self, frozen: FrozenTrial) -> bool:
        """WAITING -> RUNNING, which succeeds for exactly one process; the list `frozen` came from may be
        stale (another worker may have claimed the trial and even finished it since). A claimed trial beats
        at once: one queued again keeps its old heartbeat, stale at once."""
        trial_id = compat.trial_id(frozen)
        try:
            claimed = self.storage.set_trial_state_values(trial_id, TrialState.RUNNING)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        if claimed:
            try:
                self.storage.record_heartbeat(trial_id)
            except Exception:
                self.release(trial_id)  # without a heartbeat no worker would ever find it stale and run it again
                raise
        return claimed

    def release(self, trial_id: int) -> None:
        """RUNNING -> WAITING: the same trial is claimed again, keeping its number, folder and checkpoint."""
        self.storage.set_trial_state_values(trial_id, TrialState.WAITING)

    @contextmanager
    def beating(self, trial_ids: list[int]) -> Iterator[None]:
        """Each trial's heartbeat recorded in the background while the block runs."""
        with ExitStack() as stack:
            for trial_id in trial_ids:
                stack.enter_context(heartbeat(self.storage, trial_id))
            yield

    @staticmethod
    def fail_stale(studies: list[optuna.Study]) -> None:
        """Fails the RUNNING trials of dead workers (stale heartbeats), which queues their retries."""
        with quiet_experimental():
            for study in studies:
                optuna.storages.fail_stale_trials(study)

    def finished_elsewhere(self, study: optuna.Study, trial: optuna.Trial) -> str | None:
        """How another worker's look at the heartbeat finished the trial this worker runs, if it did: failed
        and queued as a copy whose retry history names it, or failed for good without this worker's reason
        (no retries left). Not when this worker finished it before an error: that error stays its own."""
        frozen = self.storage.get_trial(compat.trial_id(trial))
        if not frozen.state.is_finished():
            return None
        number = trial.number
        if any(number in t.system_attrs.get("retry_history", ()) for t in study.get_trials(deepcopy=False)):
            return "was retried elsewhere while this worker was paused (its heartbeat went stale)"
        if frozen.state == TrialState.FAIL and "fail_reason" not in frozen.user_attrs:
            return "was failed by the heartbeat while this worker was paused, with no retries left"
        return None


@contextmanager
def heartbeat(storage, trial_id: int) -> Iterator[None]:
    """Records the trial's heartbeat in the background while it runs; a beat the database refused is said in
    one line and tried again next time, rather than the thread stopping."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(trial_id)
            except Exception as e:
                print(f"heartbeat of trial {trial_id} not recorded ({type(e).__name__}); retrying", file=sys.stderr)
            if stop.wait(storage.get_heartbeat_interval()):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
