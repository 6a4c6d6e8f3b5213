"""`ablate dashboard`: optuna-dashboard on a study's storage with its trials' files, found from a study's
name or file, or --storage alone (`find`; ConfigError for bad input, before anything is served). The server
runs in this process, so a killed `ablate` leaves none behind and the URL stays off the command lines `ps`
shows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ablate.schema.errors import ConfigError
from ablate.sweep import check_artifacts, study_name


@dataclass(frozen=True)
class Dashboard:
    storage: str  # the URL as given, password and all
    name: str | None  # the study whose trials and files it shows; None: the storage's every study
    out: Path
    artifacts: str | None

    @property
    def slug(self) -> str | None:
        from ablate.schema.names import slugify

        return None if self.name is None else slugify(self.name)

    def files(self) -> str:
        """Where the trials' files are, as said before serving."""
        from ablate.harness.artifacts import artifact_location

        return "none" if self.slug is None else artifact_location(self.slug, self.out, self.artifacts)

    def serve(self, host: str, port: int, console: Console) -> None:
        """Serves until Ctrl-C. The storage is opened here, not by optuna-dashboard, which would give a
        database of another program Optuna's tables."""
        from ablate.harness.artifacts import artifact_store
        from ablate.harness.extras import require
        from ablate.harness.study.storage import check_readable, open_storage

        require("optuna_dashboard", extra="dashboard", feature="ablate dashboard")
        store = open_storage(self.storage, create_dir=False)
        check_readable(store, self.storage, self.name)
        from optuna_dashboard import run_server

        console.print(f"optuna-dashboard on http://{host}:{port} (Ctrl-C to stop)")
        try:
            files = None if self.slug is None else artifact_store(self.slug, self.out, self.artifacts)
            run_server(store, host=host, port=port, artifact_store=files)
        except KeyboardInterrupt:
            pass


def find(study: str | None, storage: str | None, out: Path, artifacts: str | None) -> Dashboard:
    """The dashboard of `study` (a name or file; None: the one study under `out`, unless `storage` is
    given), in `storage` (default: its SQLite file under `out`)."""
    from ablate.harness.artifacts import STUDY_DB, default_storage_url
    from ablate.harness.study.storage import check_url
    from ablate.schema.names import slugify

    if storage is None and study is None:
        found = sorted(out.glob(f"*/{STUDY_DB}"))
        if len(found) != 1:
            where = ", ".join(str(p.parent.name) for p in found) or "none"
            raise ConfigError(f"dashboard: name a study or give --storage (studies in {out}: {where})")
        study = found[0].parent.name
    name = None if study is None else study_name(study)
    storage = storage or default_storage_url(slugify(name), out)
    check_url(storage, exists=True)  # all that --dry-run checks: it connects to nothing
    check_artifacts(artifacts)
    if artifacts and name is None:
        raise ConfigError("--artifacts: name the study too (its files lie under the prefix by name)")
    return Dashboard(storage, name, out, artifacts)
