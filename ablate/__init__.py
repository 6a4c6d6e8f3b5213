"""attention-ablate: ablation studies of attention models, swept with Optuna and reported with statistics.

The Python API (ablate/api.py): `load_study(...)` -> Study (`.run()`, `.results()`, `.claims()`,
`.report()`, `.report_path`, `.compare(other)`), `compare(first, second)` of two stored runs, and
`train(config)` -> metrics; ConfigError for bad input, RunFailed for a fault during a run, TimeLimit for a
run stopped at its time limit with trials left (run it again).

The repository's folders schema/, models/, harness/, analysis/, reports/, ablations/ and bench/ install as
ablate.schema, ablate.models, ablate.harness, ablate.analysis, ablate.reports, ablate.ablations and
ablate.bench (pyproject.toml maps them)."""

from pathlib import Path

# Run from a checkout without installing it (a scratch copy under mutation testing, PYTHONPATH=<checkout>),
# the same folders are found beside this one. An installed package never has a pyproject.toml beside it.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "harness" / "trial.py").is_file():
    __path__.append(str(_checkout))

API = ("load_study", "Study", "train", "compare")
ERRORS = ("ConfigError", "RunFailed", "TimeLimit")
__all__ = [*API, *ERRORS]


def __getattr__(name: str):
    """The API on first use: `import ablate` stays light (no torch, no Optuna)."""
    if name in API:
        from ablate import api

        return getattr(api, name)
    if name in ERRORS:
        from ablate.schema import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'ablate' has no attribute {name!r}")
