"""Keys whose names come from the registry that dispatches them: each accepts exactly its registry's names
(read from the registry, so a name added there is covered) and refuses another, listing the known ones."""

from __future__ import annotations

import optuna
import pytest
from pydantic import ValidationError
from test_config import one_of

from ablate.harness.study.queue import suggest
from ablate.harness.study.validate import run_problems
from ablate.harness.tracking import MODES, OLD_MODES
from ablate.models import build_model
from ablate.models.config import ModelConfig
from ablate.models.kinds import CELLS, FAMILIES, NORMS
from ablate.models.optim import SCHEDULES
from ablate.schema.config import TrainConfig, accepted_values, build_config, fitting_task, validation_problems
from ablate.schema.errors import ConfigError
from ablate.schema.spec import PRUNERS, TUNE_KINDS, TuneSpec
from ablate.schema.task_config import REGISTRIES


@pytest.mark.parametrize("key", REGISTRIES)
def test_a_registry_backed_task_key_accepts_exactly_the_registrys_names(key, monkeypatch):
    registry = REGISTRIES[key]
    for name in registry:
        assert getattr(build_config({"task": {key: name}}).task, key) == name
    with pytest.raises(ConfigError) as e:
        build_config({"task": {key: "nonsense"}})
    assert str(e.value) == f"task.{key}: unknown {key} 'nonsense'; known: {', '.join(registry)}"
    assert accepted_values()[f"task.{key}"] == " | ".join(registry)  # what `ablate list` shows
    monkeypatch.setitem(registry, "nonsense", next(iter(registry.values())))
    assert getattr(build_config({"task": {key: "nonsense"}}).task, key) == "nonsense"


def test_each_task_split_and_tokenizer_name_has_what_builds_it():
    """The schema lists the names (torch- and tokenizer-free); scan.py and tokenizers.py build them."""
    from ablate.harness.tasks.scan import SPLITTERS
    from ablate.harness.tasks.tokenizers import TOKENIZER_CLASSES

    assert list(SPLITTERS) == list(REGISTRIES["split"])
    assert list(TOKENIZER_CLASSES) == list(REGISTRIES["tokenizer"])


def test_the_wandb_modes_are_those_tracking_runs_in(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert all(run_problems(wandb=mode) == [] for mode in MODES)
    expected = f"expected {', '.join(MODES[:-1])} or {MODES[-1]}"
    assert run_problems(wandb="dryrun") == [("--wandb", f"{expected} (got 'dryrun')")]
    for old in OLD_MODES:  # W&B's former names: the environment may still hold them
        monkeypatch.setenv("WANDB_MODE", old)
        assert run_problems(wandb=None) == []
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    assert run_problems(wandb=None) == [("WANDB_MODE", f"{expected} (got 'sometimes' from the environment)")]


# Keys whose registries' names form their Literal, so that pydantic's error names each.
LITERAL_REGISTRIES = {
    "model.arch": FAMILIES, "model.cell": CELLS, "model.norm": NORMS, "train.schedule": SCHEDULES,
}  # fmt: skip


@pytest.mark.parametrize("key", LITERAL_REGISTRIES)
def test_a_registry_backed_model_or_train_key_accepts_exactly_the_registrys_names(key):
    registry = LITERAL_REGISTRIES[key]
    for name in registry:
        # a family reads the tasks it can (a classifier's target is a label, a captioner's source an image)
        task = {"task.name": fitting_task(name)} if key == "model.arch" else {}
        assert build_config({}, {key: name, **task}).flat()[key] == name
    with pytest.raises(ConfigError) as e:
        build_config({}, {key: "nonsense"})
    assert str(e.value) == f"{key}: Input should be {one_of(list(registry))} (got 'nonsense')"
    assert accepted_values()[key] == " | ".join(registry)  # what `ablate list` shows


def test_each_family_builds_its_class_and_each_cell_its_state():
    for arch, family in FAMILIES.items():
        assert type(build_model(ModelConfig(arch=arch, d_model=8), 5, 5)).__name__ == family.model.split(":")[1]
    for cell, kind in CELLS.items():
        model = build_model(ModelConfig(arch="lstm", cell=cell, d_model=8, layers=1), 5, 5)
        assert model.state_names == kind.states
        assert model.decoder.weight_ih_l0.shape[0] == kind.gates * 8


def test_the_tune_kinds_and_pruners_are_the_registries():
    for name in TUNE_KINDS:
        assert list(TuneSpec.model_validate({"params": {"x": {name: [1, 2]}}}).params["x"]) == [name]
    for pruner in PRUNERS:
        assert TuneSpec.model_validate({"params": {}, "pruner": pruner}).pruner == pruner
    with pytest.raises(ValidationError) as e:
        TuneSpec.model_validate({"params": {"x": {"nonsense": [1, 2]}}, "pruner": "nonsense"})
    assert dict(validation_problems(e.value)) == {
        "params.x.nonsense": f"Input should be {one_of(list(TUNE_KINDS))} (got 'nonsense')",
        "pruner": f"Input should be {one_of(list(PRUNERS))} (got 'nonsense')",
    }


@pytest.mark.parametrize("name", TUNE_KINDS)
def test_each_tune_kind_samples_within_its_list(name):
    kind = TUNE_KINDS[name]
    args = [0.5, 2.0] if kind.bounds and not kind.integer else [1, 4] if kind.bounds else ["a", "b"]
    trial = optuna.create_study().ask()
    value = suggest(trial, "x", {name: args})
    assert (args[0] <= value <= args[1]) if kind.bounds else value in args
    assert isinstance(value, int) == (kind.bounds and kind.integer)
    assert getattr(trial.distributions["x"], "log", False) == kind.positive  # positive bounds: a log scale


def test_each_pruner_builds_an_optuna_pruner():
    for name, build in PRUNERS.items():
        assert isinstance(build(optuna.pruners, TrainConfig()), optuna.pruners.BasePruner), name
