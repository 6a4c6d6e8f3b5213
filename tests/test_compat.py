"""The private Optuna / Lightning / torch behaviour harness/compat.py relies on, pinned: an
upgrade that changes it fails here, by name."""

import optuna
from optuna.trial import TrialState

from ablate.harness import compat


def test_trial_id_is_the_storage_id_that_claims_and_heartbeats_use():
    storage = optuna.storages.InMemoryStorage()
    first = optuna.create_study(storage=storage, study_name="a")
    second = optuna.create_study(storage=storage, study_name="b")
    first.enqueue_trial({"x": 1})
    second.enqueue_trial({"x": 2})
    frozen = second.get_trials(deepcopy=False)[0]
    assert frozen.number == 0  # numbers restart in each study; the storage id does not
    assert compat.trial_id(frozen) != compat.trial_id(first.get_trials(deepcopy=False)[0])
    # What Leases.claim and Picker.claim_from do: flip the queued trial to RUNNING by id, then wrap it in a live Trial.
    assert storage.set_trial_state_values(compat.trial_id(frozen), TrialState.RUNNING)
    live = optuna.Trial(second, compat.trial_id(frozen))
    assert compat.trial_id(live) == compat.trial_id(frozen)
    assert live.params == {} and storage.get_trial(compat.trial_id(live)).system_attrs["fixed_params"] == {
        "x": 2
    }


def test_lightning_still_decides_validation_steps_in_its_epoch_loop():
    # Checkpointer defers a periodic checkpoint past the validation that follows its step; if Lightning
    # moves this rule, checkpoints would silently be saved before validations again.
    import lightning as L

    seen: list[tuple[int, bool]] = []

    class Spy(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append((trainer.global_step, compat.validates_this_step(trainer)))

    from ablate.harness.trial import run_trial
    from ablate.schema.config import build_config
    from tests.conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN

    cfg = build_config(
        {"task": dict(TINY_TASK), "model": dict(TINY_MODEL), "train": {**TINY_TRAIN, "max_steps": 5}}
    )
    run_trial(cfg, callbacks=[Spy()])
    # val_every 2, and the last step validates through ValidateOnStop.
    assert seen == [(1, False), (2, True), (3, False), (4, True), (5, True)]


def test_rng_states_round_trip_every_generator_a_resumed_trial_draws_from():
    import random

    import numpy as np
    import torch

    states = compat.rng_states()
    assert {"torch", "numpy", "python"} <= set(states)
    first = (torch.rand(3), np.random.rand(3), random.random())
    compat.restore_rng_states(states)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_sword_blocks_are_decompressed_once_and_read_the_same(tmp_path):
    """pysword's zText reader gets each verse's block through `_decompressed_text(testament, block)`;
    cached, a book's verses cost one decompression and read as they did."""
    import pytest

    pytest.importorskip("pysword")
    from pysword.modules import SwordModules
    from sword_fixture import write_module

    verses = {("Genesis", 1, v): f"verse {v}" for v in range(1, 4)} | {("Exodus", 2, 1): "another book"}
    write_module(tmp_path, "tiny", "en", verses)
    modules = SwordModules(str(tmp_path))
    modules.parse_modules()
    plain, cached = (modules.get_bible_from_module("tiny") for _ in range(2))
    compat.cache_sword_blocks(cached)
    reads = {book: list(plain.get_iter(books=[book], chapters=[c], clean=False)) for book, c in
             (("Genesis", 1), ("Exodus", 2))}  # fmt: skip
    assert reads["Genesis"][:4] == ["verse 1", "verse 2", "verse 3", ""]
    assert {book: list(cached.get_iter(books=[book], chapters=[c], clean=False)) for book, c in
            (("Genesis", 1), ("Exodus", 2))} == reads  # fmt: skip
    assert cached._decompressed_text.cache_info().misses == 2  # one block a book


def test_views_are_told_from_kernels_by_their_schema():
    """`ablate plan` counts kernels (harness/study/cost.py): what returns a view launches none."""
    import torch

    aten = torch.ops.aten
    views = [aten.view.default, aten.transpose.int, aten.t.default, aten.select.int, aten.detach.default]
    kernels = [aten.mm.default, aten.add.Tensor, aten.add_.Tensor, aten.relu.default, aten.clone.default]
    assert [compat.returns_a_view(op) for op in views] == [True] * len(views)
    assert [compat.returns_a_view(op) for op in kernels] == [False] * len(kernels)
