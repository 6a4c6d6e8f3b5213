"""`ablate worker`: the one way a process joins a study and works on it (the local launcher's, and so
`ablate sweep`'s and `Study.run`'s, workers too). The study comes from its file (sweep.join_study) or
stored by name; its queued trials run until none is left (harness/workers.py); the worker that records the
last trial writes the report (sweep.write_report). ConfigError for bad input, before any trial runs."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ablate.sweep import check_artifacts, is_study_file, join_study, stored_study, write_report


def work(
    study: str, storage: str | None, out: Path, wandb: str | None, artifacts: str | None, threads: int | None,
    stored: bool, report: bool, console: Console,
):  # fmt: skip
    """Joins `study` and runs its trials (harness.workers.run_worker, whose Worker this returns: `stopped`
    says why it stopped early); the report when it finished the study and `report`."""
    from ablate.harness import tracking
    from ablate.harness.artifacts import default_storage_url
    from ablate.harness.study.storage import open_storage
    from ablate.harness.study.validate import load_study, raise_problems, run_problems

    check_artifacts(artifacts, reach=True)
    problems = run_problems(out, storage, wandb)
    if not stored and is_study_file(study):
        spec = load_study(study, also=problems)
        store = join_study(study, spec, storage or default_storage_url(spec.slug, out))
    else:
        raise_problems("", [], problems)
        spec, found = stored_study("worker", study, storage, out, stored=stored)
        found.close()  # opened read-only: again with the study's heartbeat periods
        store = open_storage(found.url, create_dir=False, heartbeat=spec.heartbeat)
    mode = tracking.resolve_mode(wandb)  # type: ignore[arg-type]
    if threads:
        import torch

        torch.set_num_threads(threads)
    from ablate.harness.workers import run_worker

    done = run_worker(spec, store, out, mode, artifacts)
    if report and done.finished_last and not done.stopped:
        write_report(spec, store, out, mode, artifacts, console)
    return done
