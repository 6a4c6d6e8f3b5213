"""Bad input through the installed `ablate` script: one line on stderr naming what and where, exit code 2,
and nothing written: no run folder, no study folder, nothing in the working directory.

Also checked elsewhere: heads not dividing d_model and `report` on an empty runs folder (test_sweep.py),
every study-file check (test_study.py), every config key (test_config.py)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate

CLOSED_PORT_URL = "postgresql+psycopg2://postgres@127.0.0.1:9/ablate"  # nothing listens on loopback:9


def study_file(folder: Path, name: str = "study.yaml", **extra) -> Path:
    tree = {
        "name": "bad",
        "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "factors": {"model.pos_encoding": ["sinusoidal", "none"]},
        **extra,
    }
    path = folder / name
    path.write_text(yaml.safe_dump(tree))
    return path


def write(folder: Path, name: str, data: str | bytes) -> Path:
    path = folder / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def train_on(corpus: Path) -> list[str]:
    return ["train", "--set", "task.name=parallel", "--set", f"task.path={corpus}", "--out", "{out}"]


def train_copy(*args: str) -> list[str]:
    """Copy with sources of up to 8 tokens in its longest test split (9 with EOS)."""
    return ["train", "--set", "task.name=copy", "--set", "task.max_len=6", "--set", "task.test_max_len=8",
            *args, "--out", "{out}"]  # fmt: skip


# (arguments, the error line) built from the folder holding the inputs; `{out}` is where output would go.
CASES = {
    "unknown config key": lambda d: (
        ["train", str(write(d, "exp.yaml", "model:\n  d_model: 16\n  bogus: 1\n")), "--out", "{out}"],
        "model.bogus: unknown config key",
    ),
    "wrong type": lambda d: (
        ["train", "--set", "model.d_model=wide", "--out", "{out}"],
        "model.d_model: Input should be a valid integer (got 'wide')",
    ),
    "unknown task": lambda d: (
        ["train", "--set", "task.name=translate", "--out", "{out}"],
        "task.name: unknown task 'translate'; known: copy, reverse, sort, addition, recall, cues, digits, "
        "synth_mt, scan, parallel, bible",
    ),
    "unknown preset": lambda d: (
        ["train", "--preset", "gpt", "--out", "{out}"],
        "preset: unknown preset 'gpt'; known: ",
    ),
    "missing study file": lambda d: (
        ["sweep", str(d / "nowhere.yaml"), "--out", "{out}"],
        f"{d / 'nowhere.yaml'}: no such study file",
    ),
    "YAML syntax error": lambda d: (
        [
            "sweep",
            str(write(d, "broken.yaml", "name: x\nfactors:\n  model.norm: [pre, post\nseeds: [0]\n")),
            "--out",
            "{out}",
        ],  # fmt: skip
        f"{d / 'broken.yaml'}:4: YAML syntax error: expected ',' or ']', but got ':'",
    ),
    "empty factor list": lambda d: (
        ["worker", str(study_file(d, factors={"model.norm": []})), "--out", "{out}"],
        f"{d / 'study.yaml'}: factors.model.norm: empty list of values (the grid would be empty)",
    ),
    "malformed corpus line": lambda d: (
        train_on(write(d, "c.tsv", "a b\tb a\nc d\n")),
        f"{d / 'c.tsv'}:2: expected source<TAB>target, found no tab",
    ),
    "non-UTF-8 corpus": lambda d: (
        train_on(write(d, "latin1.tsv", b"a\ta\n" + "café\tcafé\n".encode("latin-1"))),
        f"{d / 'latin1.tsv'}:2: not UTF-8 text (invalid continuation byte at column 4)",
    ),
    "learned positions shorter than the outputs": lambda d: (
        train_copy("--set", "model.pos_encoding=learned", "--set", "model.max_positions=20"),
        "model.max_positions: 20 is too short for copy: decoding may run to 28 positions (sources of up to "
        "9 tokens); set it to at least 28",
    ),
    "location attention over sources longer than its table": lambda d: (
        train_copy("--preset", "lstm-luong-location", "--set", "model.max_positions=8"),
        "model.max_positions: 8 is too short for copy: sources reach 9 tokens; set it to at least 9",
    ),
    "unreachable storage URL": lambda d: (
        ["sweep", str(study_file(d)), "--storage", CLOSED_PORT_URL, "--out", "{out}"],
        f'storage {CLOSED_PORT_URL}: cannot open (connection to server at "127.0.0.1", port 9 failed: '
        "Connection refused",
    ),
    "report for an unknown study": lambda d: (
        ["report", "other", "--storage", existing_storage(d), "--out", "{out}"],
        f"report: no study 'other' in {existing_storage(d)} (studies there: present)",
    ),
}


def existing_storage(folder: Path) -> str:
    """A storage that exists and holds one study, 'present'."""
    url = f"sqlite:///{folder / 'present.db'}"
    if not (folder / "present.db").exists():
        optuna.create_study(study_name="present:eval", storage=url)
    return url


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    inputs, cwd, out = tmp_path / "inputs", tmp_path / "cwd", tmp_path / "out"
    inputs.mkdir()
    cwd.mkdir()
    args, message = CASES[case](inputs)
    before = sorted(inputs.iterdir())
    proc = ablate(*(a.replace("{out}", str(out)) for a in args), cwd=cwd, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {message}"), line
    assert not out.exists() and not list(cwd.iterdir()) and sorted(inputs.iterdir()) == before


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_storage_server_that_never_answers_is_given_up_within_the_connect_timeout(tmp_path):
    """A server that accepts the connection and then says nothing (a hung host behind a live port): the
    connect timeout, not the operating system's minutes, decides when the user hears about it."""
    from ablate.harness.study.storage import CONNECT_TIMEOUT_S

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads or writes
        port = silent.getsockname()[1]
        url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/ablate"
        started = time.monotonic()
        proc = ablate("sweep", str(study_file(tmp_path)), "--storage", url, "--out", str(tmp_path / "out"))
        elapsed = time.monotonic() - started
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert (
        line == f'error: storage {url}: cannot open (connection to server at "127.0.0.1", port {port} '
        "failed: timeout expired)"
    )
    assert CONNECT_TIMEOUT_S <= elapsed < CONNECT_TIMEOUT_S + 30
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_regular_file_is_one_line_exit_2(tmp_path):
    out = tmp_path / "afile"
    out.write_text("keep me")
    proc = ablate("sweep", "quickstart", "--out", str(out), "--no-report")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: --out: {out}: not a folder"]
    assert out.read_text() == "keep me"


def test_a_corrupted_study_db_is_named_in_one_line_exit_2(tmp_path):
    db = tmp_path / "runs" / "quickstart" / "study.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(bytes(range(256)) * 32)  # 8 KiB that are no SQLite file
    for command in (("report", "quickstart"), ("sweep", "quickstart", "--no-report")):
        proc = ablate(*command, "--out", str(tmp_path / "runs"))
        assert proc.returncode == 2, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last == f"error: storage sqlite:///{db}: cannot open (file is not a database)"
        assert "Traceback" not in proc.stderr
