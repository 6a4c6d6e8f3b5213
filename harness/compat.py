"""The private Optuna, Lightning, torch and pysword attributes this project relies on, in one place: none has a
public equivalent, and tests/test_compat.py pins the behaviour each use assumes, so an upgrade that changes
it fails there, by name, rather than somewhere inside a study."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import optuna

if TYPE_CHECKING:  # reports use trial_id too, and must not load Lightning
    import lightning as L


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The storage's id of a trial, which a worker's claim (set_trial_state_values) and heartbeat take;
    Optuna exposes only `number`, unique within one study, not across the storage's per-variant studies."""
    return trial._trial_id


def validates_this_step(trainer: L.Trainer) -> bool:
    """Whether the step that just ended is followed by a validation, by Lightning's own rule (val_every,
    epoch ends, max_steps), decided in its epoch loop with no public query (Checkpointer waits for it)."""
    return trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher)


def rng_states() -> dict[str, Any]:
    """Every generator's state a resumed trial needs (torch, CUDA, numpy, Python), as Lightning's own seeding
    collects them; its public `pl_worker_init_function` and `seed_everything` only set seeds."""
    from lightning.fabric.utilities.seed import _collect_rng_states

    return _collect_rng_states()


def restore_rng_states(states: dict[str, Any]) -> None:
    """Sets the generators back to `rng_states()`'s result."""
    from lightning.fabric.utilities.seed import _set_rng_states

    _set_rng_states(states)


def cache_sword_blocks(bible: Any) -> None:
    """Makes a pysword Bible decompress each block once: zText stores compressed blocks (a whole book each
    in Debian's Bibles) and pysword decompresses one for every verse, so reading a Bible would take minutes,
    not a fraction of a second. Other module kinds, without zText's `_decompressed_text(testament, block)`,
    are left as they are."""
    if hasattr(bible, "_decompressed_text"):
        bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)


def returns_a_view(op: Any) -> bool:
    """Whether an ATen operator returns a view of an input (`view`, `transpose`: no kernel runs), from the
    alias annotations of its schema, which no public attribute of torch's OpOverload gives; an in-place
    operator's written alias (`add_`) is a kernel."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)

