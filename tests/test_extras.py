"""Features behind an extra (pyproject.toml's optional dependencies): without it, one line naming the
install, exit code 2, nothing started."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from ablate.cli import app
from ablate.harness.extras import require
from ablate.harness.study.storage import with_driver
from ablate.schema.errors import ConfigError


def missing(monkeypatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError


def test_require_imports_or_names_the_extra(monkeypatch):
    assert require("json", extra="none", feature="JSON").dumps([1]) == "[1]"
    missing(monkeypatch, "datasets")
    with pytest.raises(ConfigError) as error:
        require("datasets", extra="hf", feature="Hugging Face dataset folders")
    assert str(error.value) == (
        "Hugging Face dataset folders: the [hf] extra is not installed (no module datasets); "
        "pip install 'attention-ablate[hf]'"
    )


def test_training_on_a_dataset_folder_without_the_hf_extra(monkeypatch, tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    missing(monkeypatch, "datasets")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["train", "task.name=parallel", f"task.path={tmp_path / 'corpus'}",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: Hugging Face dataset folders: the [hf] extra is not installed (no module datasets); "
        "pip install 'attention-ablate[hf]'"
    ]
    assert not out.exists()


def test_s3_artifacts_without_the_s3_extra(monkeypatch, tmp_path):
    missing(monkeypatch, "boto3")
    result = CliRunner().invoke(
        app, ["sweep", "quickstart", "--out", str(tmp_path), "--artifacts", "s3://b/p"]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --artifacts s3://: the [s3] extra is not installed (no module boto3); "
        "pip install 'attention-ablate[s3]'"
    ]
    assert not any(tmp_path.iterdir())


def test_postgresql_urls_use_psycopg2_and_need_the_postgres_extra(monkeypatch):
    # SQLAlchemy 2.1 would read a bare postgresql:// as psycopg 3; the [postgres] extra installs psycopg2.
    assert (
        with_driver("postgresql://ablate@db:5432/studies") == "postgresql+psycopg2://ablate@db:5432/studies"
    )
    assert with_driver("postgresql+psycopg2://db/s") == "postgresql+psycopg2://db/s"
    assert with_driver("sqlite:///runs/x/study.db") == "sqlite:///runs/x/study.db"
    missing(monkeypatch, "psycopg2")
    result = CliRunner().invoke(
        app, ["status", "tiny", "--storage", "postgresql://ablate@127.0.0.1:9/studies"]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: PostgreSQL storage: the [postgres] extra is not installed (no module psycopg2); "
        "pip install 'attention-ablate[postgres]'"
    ]


def test_dashboard_without_the_dashboard_extra(monkeypatch, tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "study.db").touch()
    missing(monkeypatch, "optuna_dashboard")
    result = CliRunner().invoke(app, ["dashboard", "tiny", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: ablate dashboard: the [dashboard] extra is not installed (no module optuna_dashboard); "
        "pip install 'attention-ablate[dashboard]'"
    ]
