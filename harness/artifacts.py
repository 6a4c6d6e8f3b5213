"""Where a study's and a trial's outputs live, under one name each; the trial that writes them and the report
that reads them both go through here.

    runs/<study>/                   study_dir (the study's folder name: StudySpec.slug)
        study.db                    the default SQLite storage (default_storage_url)
        artifacts/                  Optuna's artifact store: every trial's files, recorded in the storage
        report/                     report.html, report.md, results.csv, figures
        wandb/                      W&B's run folders (wandb.init(dir=runs/<study>) adds the wandb/)
        trials/eval/<NNNN>/         one folder per trial (trial_dir); tune trials under trials/tune/<variant>/
            config.json             the trial's full config
            metrics.json            metrics, history, per-length accuracy, cost
            checkpoints/{best,last}.ckpt   best: weights only; last: full state, to train on
            checkpoints/resume.ckpt     the periodic full state a retried trial resumes from (while it runs)
            attention/probe<i>_<split>.npz    AttentionSample.save / load
            attention/probe<i>_<split>.png    its heatmap (harness.attention_maps), shown by optuna-dashboard
            translations.jsonl      text tasks: {split, src_len, hyp, ref} per test sentence
            data/                   vocabularies and tokenizers

The artifact store is that folder or, with `--artifacts s3://bucket/prefix`, an S3-compatible bucket
(<prefix>/<study>/<artifact id>; endpoint from AWS_ENDPOINT_URL, credentials from the usual AWS variables,
read by boto3 alone: nothing here sees them), so workers without a shared filesystem, and `ablate report`
anywhere, meet the same files. Paths take plain names (folder, phase, trial number), not the study spec;
numpy and Optuna only, so reading artifacts needs no torch."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from ablate.schema.errors import ConfigError

STUDY_DB = "study.db"
CONFIG = "config.json"
METRICS = "metrics.json"
CHECKPOINTS = "checkpoints"
BEST_CHECKPOINT = "best"  # ModelCheckpoint's filename, without .ckpt
LAST_CHECKPOINT = "last.ckpt"
RESUME_CHECKPOINT = "resume.ckpt"
ATTENTION = "attention"
DATA = "data"
TRANSLATIONS = "translations.jsonl"


S3_TIMEOUT_S = 10  # an artifact store that does not answer is reported before the first trial, not waited on



def study_dir(slug: str, runs_root: str | Path = "runs") -> Path:
    return Path(runs_root) / slug


def check_run_folder(slug: str, runs_root: str | Path = "runs") -> None:
    """ConfigError for a symbolic link anywhere in the study's folder but W&B's (whose `latest-run` link W&B
    makes). Nothing here makes one, so it was placed there and would send writes outside --out: every
    command that writes under the folder calls this on opening it."""
    root = study_dir(slug, runs_root)
    if not root.is_dir():
        return
    for folder, dirs, files in os.walk(root):  # links are not followed
        if Path(folder) == root and "wandb" in dirs:
            dirs.remove("wandb")
        for name in (*dirs, *files):
            path = Path(folder) / name
            if path.is_symlink():
                raise ConfigError(f"{path}: a symbolic link inside the run folder ({os.readlink(path)}); ablate "
                                  "writes only to what it made there: remove it")  # fmt: skip


def default_storage_url(slug: str, runs_root: str | Path = "runs") -> str:
    return f"sqlite:///{(study_dir(slug, runs_root) / STUDY_DB).resolve()}"


def trial_dir(root: Path, phase: str, number: int, variant_folder: str | None = None) -> Path:
    """A trial's own folder under the study folder `root`: trials/<phase>/[<variant_folder>/]<NNNN>."""
    folder = root / "trials" / phase
    return (folder / variant_folder if variant_folder else folder) / f"{number:04d}"


def artifact_dir(slug: str, runs_root: str | Path = "runs") -> Path:
    return study_dir(slug, runs_root) / "artifacts"


REPORT_HTML, REPORT_MD, RESULTS_CSV = "report.html", "report.md", "results.csv"  # in report_dir


def report_dir(slug: str, runs_root: str | Path = "runs") -> Path:
    return study_dir(slug, runs_root) / "report"


def attention_file(index: int, split: str, suffix: str = ".npz") -> str:
    """A probe's sample (.npz) or its heatmap (.png), relative to the trial folder."""
    return f"{ATTENTION}/probe{index}_{split}{suffix}"


def artifact_store(slug: str, runs_root: str | Path = "runs", location: str | None = None):
    """The Optuna artifact store of per-trial files (metrics, per-length results, attention, checkpoints):
    the study folder's, or the bucket `location` names; trials record them in the storage."""
    if location is not None:
        return prefixed_s3_store(*study_prefix(slug, location))
    path = artifact_dir(slug, runs_root)
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(path)


def artifact_location(slug: str, runs_root: str | Path = "runs", location: str | None = None) -> str:
    """Where artifact_store keeps a study's files, as a user names it: its folder, or s3://bucket/prefix."""
    if location is None:
        return str(artifact_dir(slug, runs_root))
    bucket, prefix = study_prefix(slug, location)
    return f"s3://{bucket}/{prefix}"


def study_prefix(slug: str, location: str) -> tuple[str, str]:
    """The bucket of `location` and its key prefix for a study's files: the location's, then the study's."""
    bucket, prefix = parse_s3_url(location)
    return bucket, f"{prefix}/{slug}".lstrip("/")


def parse_s3_url(location: str) -> tuple[str, str]:
    """s3://bucket[/prefix] -> (bucket, prefix); ValueError naming what is wrong."""
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    if not location.startswith("s3://") or not bucket:
        raise ValueError(f"expected s3://bucket/prefix (got {location!r})")
    return bucket, prefix.strip("/")


def s3_problem(location: str) -> str | None:
    """Why `location`'s bucket cannot hold trial files, from one request before anything runs: no answer
    within S3_TIMEOUT_S, no credentials, no such bucket, access refused; None when the bucket answers."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    config = Config(connect_timeout=S3_TIMEOUT_S, read_timeout=S3_TIMEOUT_S, retries={"max_attempts": 1})
    try:
        boto3.client("s3", config=config).head_bucket(Bucket=parse_s3_url(location)[0])
    except ClientError as e:  # the endpoint answered: 404, 403, ...
        code = e.response.get("Error", {}).get("Code", "")
        return {"404": "no such bucket", "403": "access denied"}.get(code, str(e))
    except BotoCoreError as e:  # unreachable endpoint, no credentials, a malformed endpoint URL
        return str(e)
    return None


def prefixed_s3_store(bucket: str, prefix: str):
    """Optuna's Boto3ArtifactStore with every artifact id under `prefix/` (it has no prefix of its own)."""
    from optuna.artifacts import Boto3ArtifactStore

    class PrefixedStore(Boto3ArtifactStore):
        def open_reader(self, artifact_id: str):
            return super().open_reader(f"{prefix}/{artifact_id}")

        def write(self, artifact_id: str, content_body) -> None:
            super().write(f"{prefix}/{artifact_id}", content_body)

        def remove(self, artifact_id: str) -> None:
            super().remove(f"{prefix}/{artifact_id}")

    return PrefixedStore(bucket)


def upload_trial_files(trial, folder: Path, store) -> dict[str, str]:
    """Uploads every file under `folder`; returns {path relative to folder: artifact id}, which the trial
    keeps as its 'artifacts' user attr (Optuna's own record keeps only the file's base name)."""
    ids = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        ids[path.relative_to(folder).as_posix()] = upload_artifact(
            artifact_store=store, file_path=str(path), study_or_trial=trial
        )
    return ids


@dataclass
class AttentionSample:
    """One probe example's attention. weights[kind] is (layers, heads, rows, cols) for kind in
    encoder (src x src), decoder (tgt_out x tgt_in) and cross (tgt_out x src); a classifier's also
    importance (1, 1, 1, src): each token's gradient importance (models/explanation.py), summing to 1."""

    split: str
    src: list[str]  # source tokens, EOS included
    tgt_in: list[str]  # decoder inputs: BOS + target
    tgt_out: list[str]  # what each decoder step predicts: target + EOS
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    alignment: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 2), dtype=np.int64)
    )  # (src, tgt) pairs: the sure gold links
    possible: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 2), dtype=np.int64)
    )  # (src, tgt) pairs: the possible ones beside them (Example.possible)
    image: bool = False  # its source is an image's pixels column by column (schema/tasks.py Task.image)

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """Row and column labels of a weight matrix of `kind`."""
        return {"encoder": (self.src, self.src), "decoder": (self.tgt_out, self.tgt_in),
                "cross": (self.tgt_out, self.src), "importance": (self.tgt_out, self.src)}[kind]  # fmt: skip

    def save(self, path: str | Path) -> None:
        arrays = {f"weights_{kind}": w for kind, w in self.weights.items()}
        np.savez_compressed(
            path, split=np.array(self.split), src=np.array(self.src), tgt_in=np.array(self.tgt_in),
            tgt_out=np.array(self.tgt_out), alignment=self.alignment, possible=self.possible,
            image=np.array(self.image), **arrays,
        )  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> AttentionSample:
        with np.load(path, allow_pickle=False) as f:
            weights = {key.removeprefix("weights_"): f[key] for key in f.files if key.startswith("weights_")}
            possible = f["possible"] if "possible" in f.files else np.zeros((0, 2), dtype=np.int64)
            return cls(str(f["split"]), f["src"].tolist(), f["tgt_in"].tolist(), f["tgt_out"].tolist(),
                       weights, f["alignment"], possible, "image" in f.files and bool(f["image"]))  # fmt: skip


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """One JSON object a line (UTF-8, text as written)."""
    lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    Path(path).write_text("".join(lines), encoding="utf-8")


def read_jsonl(path: str | Path) -> list[dict]:
    """What write_jsonl wrote; ValueError for a line that is not JSON."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
