"""W&B: the mode chosen from credentials, and what an offline run records, read back from its file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2 as pb

from harness import tracking


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
