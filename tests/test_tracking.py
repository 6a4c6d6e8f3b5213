"""W&B: the mode chosen from credentials, and what an offline run records, read back from its file."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate_exe
from wandb.proto import wandb_internal_pb2 as pb

from ablate.harness import tracking
from ablate.harness.trial import best_validation


def offline_records(run_dir: Path) -> list[pb.Record]:
    """The records of an offline run's .wandb file: a ':W&B' header, then LevelDB-log chunks (a 7-byte
    header each: crc, length, type) in 32 KiB blocks, which reassemble into protobuf Records."""
    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunk, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def offline_run(run_dir: Path) -> dict:
    """group, name, job_type, tags, config and exit code of an offline run."""
    # wandb-core writes the run's log in the background: wait (bounded) until its run and exit records are in.
    deadline = time.monotonic() + 30
    while True:
        records = offline_records(run_dir)
        kinds = [r.WhichOneof("record_type") for r in records]
        if ("run" in kinds and "exit" in kinds) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    exits = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
    config = {u.key: json.loads(u.value_json) for u in run.config.update if u.key != "_wandb"}
    return {"group": run.run_group, "name": run.display_name, "job_type": run.job_type, "tags": list(run.tags),
            "config": config, "exit_code": exits[-1] if exits else None}  # fmt: skip


def test_mode_falls_back_to_offline_without_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tracking.resolve_mode(None) == "offline"
    assert tracking.resolve_mode("online") == "offline"
    assert tracking.resolve_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(tracking, "server_unreachable", lambda url: None)  # reachability: test_reliability.py
    assert tracking.resolve_mode(None) == "online"


def test_offline_run_records_group_name_tags_config_and_failure(tmp_path):
    config = {"model.heads": 2, "train.lr": 0.001, "task.name": "reverse"}
    with tracking.wandb_logger("offline", tmp_path, group="study", name="pos=none-seed1", job_type="eval",
                               tags=["pos_encoding=none"], config=config) as logger:  # fmt: skip
        logger.log_metrics({"val/loss": 1.5}, step=1)
    with pytest.raises(RuntimeError):
        with tracking.wandb_logger("offline", tmp_path, group="study", name="boom-seed0", job_type="tune",
                                   tags=[], config=config):  # fmt: skip
            raise RuntimeError("boom")
    runs = [offline_run(d) for d in sorted((tmp_path / "wandb").glob("offline-run-*"))]
    by_name = {r["name"]: r for r in runs}
    assert by_name.keys() == {"pos=none-seed1", "boom-seed0"}
    ok = by_name["pos=none-seed1"]
    assert (ok["group"], ok["job_type"], ok["tags"], ok["config"]) == (
        "study",
        "eval",
        ["pos_encoding=none"],
        config,
    )
    assert ok["exit_code"] == 0
    assert by_name["boom-seed0"]["exit_code"] == 1 and by_name["boom-seed0"]["job_type"] == "tune"


def test_disabled_mode_starts_no_run(tmp_path):
    with tracking.wandb_logger("disabled", tmp_path, "g", "n", "eval", [], {}) as logger:
        assert logger is None
    assert not (tmp_path / "wandb").exists()


def offline_summary(run_dir: Path) -> dict:
    """An offline run's final summary: its summary records applied in order."""
    offline_run(run_dir)  # waits until the run's exit record is written
    summary = {}
    for record in offline_records(run_dir):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def test_a_self_hosted_server_in_netrc_counts_as_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    # What `wandb login --host https://wandb.example.org:8443` writes: the URL's host and port as machine.
    netrc.write_text(f"machine wandb.example.org:8443\n  login user\n  password {'k' * 40}\n")
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org:8443/")
    assert tracking.has_credentials()
    monkeypatch.setattr(tracking, "server_unreachable", lambda url: None)
    assert tracking.resolve_mode(None) == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.other.org")
    assert not tracking.has_credentials()
    monkeypatch.delenv("WANDB_BASE_URL")  # api.wandb.ai: no entry for it
    assert not tracking.has_credentials()
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    assert tracking.has_credentials()


def readme_sweep() -> dict:
    """The W&B sweep file the README shows (the yaml block after `<!-- wandb-sweep -->`)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("<!-- wandb-sweep -->", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


def test_a_wandb_sweep_agent_runs_ablate_train_as_the_readme_shows(tmp_path):
    sweep = readme_sweep()
    # One point of the sweep's space, as the agent picks it, plus the sizes that keep it a few seconds.
    params = {key: space.get("value", space.get("values", [space.get("min")])[0])
              for key, space in sweep["parameters"].items()}  # fmt: skip
    params.update({f"task.{k}": v for k, v in TINY_TASK.items()})
    params.update({f"model.{k}": v for k, v in TINY_MODEL.items()})
    params.update({f"train.{k}": v for k, v in TINY_TRAIN.items()})
    args = [f"{key}={value}" for key, value in params.items()]  # what ${args_no_hyphens} becomes
    command = []
    for part in sweep["command"]:
        command += args if part == "${args_no_hyphens}" else [part.replace("${program}", sweep["program"])]
    assert command[:2] == ["ablate", "train"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SWEEP_ID": "sweep01", "WANDB_RUN_ID": "run0001"}
    env.pop("WANDB_SERVICE", None)  # its own W&B service, as under an agent, not this test process's
    proc = subprocess.run(
        [ablate_exe(), *command[1:], "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    (run_dir,) = (tmp_path / "runs" / "train" / "wandb").glob("offline-run-*-run0001")
    run = offline_run(run_dir)
    # Named, grouped, tagged and configured as a sweep trial is.
    assert (run["name"], run["group"], run["job_type"]) == ("transformer-seed0", "transformer", "train")
    assert "pos_encoding=sinusoidal" in run["tags"] and "lr=0.0001" in run["tags"]
    assert run["config"]["model.pos_encoding"] == "sinusoidal" and run["config"]["train.lr"] == 1e-4
    assert run["config"]["train.max_steps"] == TINY_TRAIN["max_steps"] and run["exit_code"] == 0
    # Its summary is the trial's result: the best checkpoint's val/* and the test metrics, with the step.
    summary = offline_summary(run_dir)
    metrics = {k: v for k, v in result.items() if k.startswith(("val/", "test/", "test_long/"))}
    assert {k: summary[k] for k in metrics} == pytest.approx(metrics)
    assert summary["val/best_step"] in (2, 4)
    # The same media: attention heatmaps, the per-length table, the attention arrays.
    files = {
        p.relative_to(run_dir / "files").as_posix() for p in (run_dir / "files").rglob("*") if p.is_file()
    }
    assert any(f.startswith("media/images/attention/cross/") for f in files)
    assert any(f.startswith("media/table/per_length") for f in files)
    assert "attention/probe0_test.npz" not in files  # those travel with --out, not without it


def test_best_step_is_the_validation_whose_checkpoint_was_tested():
    rows = [{"step": 2, "val/loss": 1.5, "val/seq_acc": 0.2}, {"step": 4, "val/loss": 1.1, "val/seq_acc": 0.1},
            {"step": 6, "val/loss": float("nan"), "val/seq_acc": 0.9}, {"step": 8, "train/loss": 0.5}]  # fmt: skip
    assert best_validation(rows) == {"step": 4, "val/loss": 1.1, "val/seq_acc": 0.1}
