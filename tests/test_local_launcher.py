"""The local launcher (harness/launchers/local.py): `ablate sweep` without --launcher and the Python API's
`Study.run(launcher="local")` start the same worker processes, through the one Launch path."""

from __future__ import annotations

import pytest
from conftest import ablate
from test_sweep import write_study

import ablate as api
from ablate.harness.study.queue import load_phase_study
from ablate.harness.study.storage import open_storage
from ablate.harness.study.validate import load_study
from ablate.schema.trials import EVAL

RUN_BOUND = ("worker", "wall_time")  # which process ran a trial, and how fast


def records(study, runs) -> list[tuple]:
    """Each eval trial as the storage holds it, less which process ran it and how fast; of its files, their
    names (each file's id in the artifact store is new with each upload)."""
    store = open_storage(f"sqlite:///{runs / 'tiny' / 'study.db'}", create_dir=False)
    return [
        (t.number, t.state, t.params, t.values, sorted(t.user_attrs["artifacts"]),
         {k: v for k, v in t.user_attrs.items() if k not in (*RUN_BOUND, "artifacts")})  # fmt: skip
        for t in load_phase_study(load_study(study), store, EVAL).get_trials()
    ]


@pytest.mark.slow  # two sweeps of two tiny trials: about a minute on 2 busy cores
def test_the_command_line_and_the_api_give_the_same_trial_records(tmp_path):
    study = write_study(tmp_path / "tiny.yaml", variants={"transformer": {"preset": "transformer"}})
    by_command = ablate("sweep", str(study), "--out", str(tmp_path / "cli"), "--wandb", "disabled",
                        "--workers", "1", "--no-report")  # fmt: skip
    assert by_command.returncode == 0, by_command.stderr[-3000:]
    assert "1 worker(s), storage sqlite:///" in by_command.stderr
    run = api.load_study(study, out=tmp_path / "api").run(
        wandb="disabled", report=False, launcher="local", launch=("workers=1",)
    )
    assert run is None  # no report asked for
    from_command = records(study, tmp_path / "cli")
    assert [r[1].name for r in from_command] == ["COMPLETE", "COMPLETE"]
    assert records(study, tmp_path / "api") == from_command
