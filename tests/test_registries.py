"""Keys whose names come from the registry that dispatches them: each accepts exactly its registry's names
(read from the registry, so a name added there is covered) and refuses another, listing the known ones."""

from __future__ import annotations

import pytest

from ablate.harness.config import accepted_values, build_config
from ablate.harness.errors import ConfigError
from ablate.harness.study.validate import run_problems
from ablate.harness.tasks.options import REGISTRIES
from ablate.harness.tracking import MODES, OLD_MODES


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
