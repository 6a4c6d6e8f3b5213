"""attention-ablate: ablation studies of attention models, swept with Optuna and reported with statistics.

The repository's folders models/, harness/, reports/, ablations/ and bench/ install as ablate.models,
ablate.harness, ablate.reports, ablate.ablations and ablate.bench (pyproject.toml maps them)."""

from pathlib import Path

# Run from a checkout without installing it (a scratch copy under mutation testing, PYTHONPATH=<checkout>),
# the same folders are found beside this one. An installed package never has a pyproject.toml beside it.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "harness" / "trial.py").is_file():
    __path__.append(str(_checkout))
