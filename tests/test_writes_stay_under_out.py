"""Every write under --out stays under --out: a symbolic link planted in a run folder (report/, study.db,
artifacts/, a trial's folder) is refused where the folder is opened, by every command that writes there, in
one line, exit 2, with nothing written through it; the whole-file writer refuses a target that exists and is
not a regular file (a device, a FIFO, a folder, a link) rather than rename over it."""

from __future__ import annotations

import os
import shutil

import pytest
from test_sweep import write_study

from ablate.reports.files import write_whole
from ablate.schema.errors import ConfigError
from tests.conftest import ablate


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    study = write_study(tmp / "study.yaml", variants={"transformer": {"preset": "transformer"}}, seeds=[0])
    out = tmp / "runs"
    proc = ablate("sweep", str(study), "--out", str(out), "--wandb", "disabled", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, study, out / "tiny"


# The storage's case by default; each other folder's (11 s of processes each on 2 cores) under -m slow.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "planted", ["study.db", *(pytest.param(p, marks=SLOW) for p in ("report", "artifacts", "trials/eval/0000"))]
)
def test_a_link_planted_in_the_run_folder_is_refused_by_every_command_that_writes_there(run, planted):
    tmp, study, folder = run
    saved = tmp / "saved"
    place, elsewhere = folder / planted, tmp / "elsewhere"
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(folder, saved, symlinks=True)
    try:
        elsewhere.mkdir()
        (shutil.rmtree if place.is_dir() else os.remove)(place)
        place.symlink_to(elsewhere)
        for command in (["report", str(study)], ["sweep", str(study), "--wandb", "disabled"],
                        ["worker", str(study), "--wandb", "disabled"]):  # fmt: skip
            proc = ablate(*command, "--out", str(folder.parent))
            assert proc.returncode == 2, (command, proc.stderr[-2000:])
            [line] = proc.stderr.splitlines()
            said = f"{place}: a symbolic link inside the run folder ({elsewhere}); ablate writes only to what it made there"
            # A storage planted elsewhere is found by the storage's own check first (it holds no study).
            assert said in line or (planted == "study.db" and line.startswith("error: storage ")), (command, line)
            assert list(elsewhere.iterdir()) == [], command
    finally:
        shutil.rmtree(folder)
        shutil.copytree(saved, folder, symlinks=True)
        shutil.rmtree(elsewhere, ignore_errors=True)


@pytest.mark.parametrize("kind", ["folder", "fifo", "link"])
def test_the_whole_file_writer_refuses_what_is_not_a_regular_file(tmp_path, kind):
    target, real = tmp_path / "target", tmp_path / "real.md"
    real.write_text("kept")
    {"folder": target.mkdir, "fifo": lambda: os.mkfifo(target), "link": lambda: target.symlink_to(real)}[kind]()
    with pytest.raises(ConfigError, match=rf"^{target}: exists and is not a regular file"):
        write_whole(target, "text")
    assert real.read_text() == "kept" and (target.is_symlink() or not target.is_file())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_compare_markdown_to_something_not_a_file_is_one_line_exit_2(run):
    tmp, study, folder = run
    rerun = tmp / "rerun"
    shutil.copytree(folder.parent, rerun, dirs_exist_ok=True)
    fifo = tmp / "pipe"
    os.mkfifo(fifo)
    proc = ablate("compare", str(study), str(study), "--out", str(folder.parent), "--out", str(rerun),
                  "--markdown", str(fifo))  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"error: {fifo}: exists and is not a regular file; give the path of a file to write"]
    assert proc.stdout == ""


def test_a_storage_outside_out_is_never_given_folders(run, tmp_path):
    # --storage names a file anywhere, the user's choice; its folders are the user's to make.
    _, study, _ = run
    db = tmp_path / "not" / "made" / "study.db"
    for command in (["sweep", str(study), "--workers", "1"], ["worker", str(study)]):
        proc = ablate(*command, "--wandb", "disabled", "--out", str(tmp_path / "runs"), "--storage", f"sqlite:///{db}")
        assert proc.returncode == 2, (command, proc.stderr[-2000:])
        [line] = proc.stderr.splitlines()
        assert line == f"error: --storage: sqlite:///{db}: no folder {db.parent}; make it first", command
        assert not (tmp_path / "not").exists() and not (tmp_path / "runs").exists(), command
