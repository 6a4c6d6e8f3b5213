"""The Python API, for notebooks and scripts: what the `ablate` command does, as calls.

    study = ablate.load_study("quickstart", sets={"train.max_steps": 50}, out="runs")
    study.run(workers=2, wandb="disabled")   # as `ablate sweep`; progress bars in Jupyter too
    study.results()                          # the trial table, a pandas DataFrame
    study.claims()                           # each claim's verdict, as the report gives it
    study.report_path                        # runs/quickstart/report/report.html
    study.compare(rerun)                     # as `ablate compare`: two runs' verdicts and means side by side
    ablate.train({"preset": "lstm"}, sets={"train.max_steps": 100})   # as `ablate train --json`

Each call runs the command line's own code (ablate/sweep.py, ablate/training.py, ablate/comparison.py),
so the checks and their messages are the same: bad input raises ConfigError (one line per problem, naming
what and where) before anything is created; a fault during a run raises RunFailed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from ablate.sweep import SweepOptions, checked, load_sweep, size_line, stored_study, sweep, write_report

if TYPE_CHECKING:
    import pandas as pd

    from ablate.analysis.claims import ClaimResult
    from ablate.analysis.compare import Comparison
    from ablate.harness.study.storage import Storage
    from ablate.schema.config import ExperimentConfig
    from ablate.schema.spec import StudySpec


def load_study(
    study: str | Path,
    profile: str | None = None,
    sets: dict[str, Any] | None = None,
    *,
    out: str | Path = "runs",
    storage: str | None = None,
    artifacts: str | None = None,
    allow_large: bool = False,
) -> Study:
    """A study file or bundled study's name (`ablate list`), with one of its profiles and `sets`
    ({"train.max_steps": 50}) fixed for every trial, as `ablate sweep --profile --set` take them. Runs live
    in `out`/<study>/, trials in `storage` (default: SQLite there), their files in `artifacts`
    (s3://bucket/prefix; default: the folder). ConfigError lists every problem of the study and options."""
    options = checked(
        SweepOptions,
        {"storage": storage, "out": Path(out), "artifacts": artifacts, "allow_large": allow_large},
    )
    spec, _ = load_sweep(study, profile, sets, options)  # its launcher is planned again by each run
    return Study(str(study), profile, dict(sets or {}), options, spec)


class Study:
    """A checked study and where its runs live: run it, then read its results, claims and report."""

    def __init__(
        self, source: str, profile: str | None, sets: dict[str, Any], options: SweepOptions, spec: StudySpec
    ) -> None:
        self.source, self.profile, self.sets, self.options = source, profile, sets, options
        self.spec = spec  # the study file as checked (schema/spec.py)

    def __repr__(self) -> str:
        return f"<Study {size_line(self.spec).plain}>"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def report_path(self) -> Path:
        """The report's HTML file (report.md, results.csv and the figures lie beside it)."""
        from ablate.harness.artifacts import REPORT_HTML, report_dir

        return report_dir(self.spec.slug, self.options.out) / REPORT_HTML

    def run(
        self,
        workers: int | None = None,
        *,
        devices: str | None = None,
        per_device: int = 1,
        wandb: str | None = None,
        report: bool = True,
        launcher: str | None = None,
        launch: tuple[str, ...] = (),
        time_limit: float | None = None,
    ) -> Path | None:
        """Runs every variant x seed not yet done, as `ablate sweep` (reading the study file again): `workers`
        local CPU processes, or `per_device` on each GPU of `devices` ("0,1"); W&B `online`, `offline` or
        `disabled` (default: online with credentials, else offline); `launcher` ("slurm", "ray", "local") and
        `launch` ("tasks=4") as `ablate sweep --launcher --launch`. Writes the report unless `report=False`;
        returns its HTML file, or None when a scheduler took the workers. Ctrl-C (or a notebook's stop) stops
        the workers, which checkpoint their trials, and raises KeyboardInterrupt; run again resumes them. After
        `time_limit` seconds the workers checkpoint and stop, and TimeLimit is raised where trials are left; run
        again continues them."""
        options = checked(SweepOptions, {**self.options.model_dump(), "workers": workers, "devices": devices,
                                         "per_device": per_device, "wandb": wandb, "report": report,
                                         "launcher": launcher, "launch": tuple(launch),
                                         "time_limit": time_limit})  # fmt: skip
        return sweep(self.source, self.profile, self.sets, options, Console(stderr=True), stop_on_signals=False)

    @contextmanager
    def _stored(self, call: str, read_only: bool = True) -> Iterator[tuple[StudySpec, Storage]]:
        """The study as its storage holds it (what was run), and the storage, closed after the call: a
        notebook that asks for results again and again would otherwise hold a connection per call."""
        spec, store = stored_study(call, self.name, self.options.storage, self.options.out, read_only)
        with store:
            yield spec, store

    def results(self) -> pd.DataFrame:
        """One row per eval trial, from the storage alone (analysis/table.py): trial, variant, seed, state
        (COMPLETE, FAIL, ...), the factor keys, cost columns, every metric (`test/seq_acc`, ...)."""
        from ablate.analysis.table import trials_frame
        from ablate.harness.study.queue import load_phase_study
        from ablate.schema.trials import EVAL

        with self._stored("results") as (spec, store):
            return trials_frame(spec, load_phase_study(spec, store, EVAL).get_trials(deepcopy=False))

    def claims(self) -> list[ClaimResult]:
        """Each claim's verdict with the numbers behind it, as the report judges it (analysis/claims.py
        ClaimResult: kind, claim.text, verdict, diff, ci_low, ci_high, level, decision, ...): tests of
        published findings, then mechanism checks (kind 'check'), in study order; claims.tally counts them."""
        from ablate.analysis.claims import tests_first
        from ablate.harness.study.looks import judge

        with self._stored("claims") as (spec, store):
            return tests_first(judge(spec, store))

    def report(self) -> Path:
        """Builds the report from the storage and the trials' files, as `ablate report`; its HTML file."""
        with self._stored("report", read_only=False) as (spec, store):  # the report writes its notes there
            return write_report(spec, store, self.options.out, None, self.options.artifacts, None)

    def compare(self, other: Study | str) -> Comparison:
        """This run beside `other`, as `ablate compare`: another Study (its own out and storage: a re-run on
        fresh seeds, another profile) or a study's name stored where this one's are; see `compare` below."""
        from ablate.comparison import compare_stored

        here = (self.name, self.options.storage, self.options.out)
        if isinstance(other, Study):
            there = (other.name, other.options.storage, other.options.out)
        else:
            there = (other, self.options.storage, self.options.out)
        names, storages, outs = zip(here, there)
        return compare_stored("compare", names, storages, outs)


def compare(
    first: str | Path,
    second: str | Path,
    *,
    storage: str | tuple[str | None, str | None] | None = None,
    out: str | Path | tuple[str | Path, str | Path] = "runs",
) -> Comparison:
    """Two stored runs side by side, as `ablate compare FIRST SECOND`: each a study's name or file in
    `storage` (default: SQLite under `out`/<study>/); `storage` and `out` are one value or a (first, second)
    pair. Returns analysis/compare.py's Comparison: `claims` (per claim its `text`, each run's ClaimResult or
    None in `results`, and `changed`) and `variants` (per variant each run's `means`: mean, ci_low, ci_high,
    seeds of the study metric). ConfigError: a study not stored, a storage unreadable, both one run."""
    from ablate.comparison import compare_stored, per_run

    studies = (str(first), str(second))
    return compare_stored("compare", studies, per_run("storage", storage), per_run("out", out))


def train(
    config: ExperimentConfig | dict[str, Any] | str | Path | None = None,
    *,
    preset: str | None = None,
    sets: dict[str, Any] | None = None,
    out: str | Path | None = None,
    wandb: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains and tests one configuration, as `ablate train`: `config` is a YAML file, a nested dict
    ({"task": {"name": "reverse"}, "model": {...}}) or an ExperimentConfig; `preset` fills the model keys
    it does not give; `sets` overrides dotted keys ({"train.max_steps": 200}). Returns the metrics
    `ablate train --json` prints: test/seq_acc, test/tok_acc, val/..., params, wall_time, ...
    W&B: `wandb` as on the command line (default: disabled). With `out`, leaves its artifacts there."""
    from ablate.schema.config import ExperimentConfig, config_from_tree, read_yaml
    from ablate.training import train_config

    config_file = config if isinstance(config, str | Path) else None
    if config_file is not None:
        tree = read_yaml(config_file)
    elif isinstance(config, ExperimentConfig):
        tree = config.model_dump()
    else:
        tree = dict(config or {})
    overrides = {**({"preset": preset} if preset else {}), **(sets or {})}
    cfg = config_from_tree(tree, overrides, by_hand=not isinstance(config, ExperimentConfig))
    result = train_config(
        cfg, config_file=config_file, preset=preset, overrides=sets or {}, out=Path(out) if out else None,
        wandb=wandb, progress=progress,
    )  # fmt: skip
    return result.summary()
