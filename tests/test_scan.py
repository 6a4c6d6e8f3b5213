"""SCAN: the generator against the grammar and the official files, the paper's splits, the file loader."""

from collections import Counter
from pathlib import Path

import pytest

from ablate.harness.tasks import build_task
from ablate.harness.tasks.scan import all_commands, read_scan_file
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

OFFICIAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "scan"
needs_official = pytest.mark.skipif(
    not (OFFICIAL / "tasks.txt").is_file(), reason=f"official SCAN files not found at {OFFICIAL}"
)
OFFICIAL_SIZES = {  # (train, test) line counts of the official files
    "simple": (16728, 4182), "length": (16990, 3920),
    "addprim_jump": (14670, 7706), "addprim_turn_left": (21890, 1208),
}  # fmt: skip


def pairs(examples):
    return [(ex.src, ex.tgt) for ex in examples]


def words(command: str) -> tuple[str, ...]:
    return tuple(command.split())


def test_grammar_gives_20910_distinct_commands_with_their_meanings():
    commands = dict(all_commands())
    assert len(all_commands()) == len(commands) == 20910
    expected = {
        "jump": "I_JUMP",
        "turn left": "I_TURN_LEFT",
        "walk right": "I_TURN_RIGHT I_WALK",
        "turn opposite right": "I_TURN_RIGHT I_TURN_RIGHT",
        "look opposite left": "I_TURN_LEFT I_TURN_LEFT I_LOOK",
        "turn around left": "I_TURN_LEFT I_TURN_LEFT I_TURN_LEFT I_TURN_LEFT",
        "run around right twice": " ".join(["I_TURN_RIGHT I_RUN"] * 8),
        "walk thrice and jump": "I_WALK I_WALK I_WALK I_JUMP",
        "walk thrice after jump": "I_JUMP I_WALK I_WALK I_WALK",
        "jump around left thrice and walk opposite right twice": " ".join(
            ["I_TURN_LEFT I_JUMP"] * 12 + ["I_TURN_RIGHT I_TURN_RIGHT I_WALK"] * 2
        ),
    }
    for command, actions in expected.items():
        assert commands[words(command)] == words(actions)
    assert max(len(actions) for actions in commands.values()) == 48


@needs_official
def test_generator_reproduces_the_official_tasks_file():
    assert set(all_commands()) == set(read_scan_file(OFFICIAL / "tasks.txt"))


def test_splits_follow_the_paper_without_the_files():
    length = build_task(TaskConfig(name="scan", split="length"), 0)
    assert max(len(ex.tgt) for ex in length.splits["train"] + length.splits["valid"]) == 22
    assert min(len(ex.tgt) for ex in length.splits["test"]) == 24  # no command has 23 actions
    jump = build_task(TaskConfig(name="scan", split="addprim_jump"), 0)
    train_jump = [ex for ex in jump.splits["train"] + jump.splits["valid"] if "jump" in ex.src]
    assert {ex.src for ex in train_jump} == {("jump",)}
    assert len(train_jump) * 10 == len(jump.splits["train"]) + len(jump.splits["valid"])
    assert all("jump" in ex.src for ex in jump.splits["test"]) and len(jump.splits["test"]) == 7706
    assert all(ex.src != ("jump",) for ex in jump.splits["valid"])


def test_simple_split_is_a_seeded_80_20_split():
    first, again, other = (build_task(TaskConfig(name="scan", split="simple"), seed) for seed in (0, 0, 1))
    assert first.splits == again.splits and first.splits["test"] != other.splits["test"]
    train, valid, test = (set(pairs(first.splits[s])) for s in ("train", "valid", "test"))
    assert len(train) + len(valid) == 16728 and len(test) == 4182
    assert train | valid | test == set(all_commands()) and not (train | valid) & test
    assert first.sizes() == {"train": 16228, "valid": 500, "test": 4182, "test_long": 0}


@needs_official
@pytest.mark.parametrize("split", ["length", "addprim_jump", "addprim_turn_left"])
def test_deterministic_splits_equal_the_official_files(split):
    data = build_task(TaskConfig(name="scan", split=split), 0)
    official_train = read_scan_file(OFFICIAL / f"tasks_train_{split}.txt")
    official_test = read_scan_file(OFFICIAL / f"tasks_test_{split}.txt")
    assert (len(official_train), len(official_test)) == OFFICIAL_SIZES[split]
    # valid is held out of the official training set, so train + valid is that set, repetitions included.
    assert Counter(pairs(data.splits["train"] + data.splits["valid"])) == Counter(official_train)
    assert Counter(pairs(data.splits["test"])) == Counter(official_test)


@needs_official
@pytest.mark.parametrize("split", list(OFFICIAL_SIZES))
def test_loader_reads_the_official_files(split):
    data = build_task(TaskConfig(name="scan", split=split, path=str(OFFICIAL), n_valid=300), 0)
    n_train, n_test = OFFICIAL_SIZES[split]
    assert data.sizes() == {"train": n_train - 300, "valid": 300, "test": n_test, "test_long": 0}
    assert len(data.src_vocab) == 4 + 13 and len(data.tgt_vocab) == 4 + 6


def write_official_copy(root: Path, train_lines: list[bytes]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tasks_train_length.txt").write_bytes(b"\n".join(train_lines) + b"\n")
    (root / "tasks_test_length.txt").write_bytes(b"IN: jump twice OUT: I_JUMP I_JUMP\n")


def test_loader_finds_files_in_subfolders_and_reports_bad_lines(tmp_path):
    good = [f"IN: walk OUT: I_WALK {i}".encode() for i in range(30)]
    write_official_copy(tmp_path / "ok" / "length_split", good)
    data = build_task(TaskConfig(name="scan", split="length", path=str(tmp_path / "ok")), 0)
    assert data.sizes() == {"train": 27, "valid": 3, "test": 1, "test_long": 0}

    write_official_copy(tmp_path / "bad", [*good[:2], b"walk => I_WALK"])
    with pytest.raises(
        ConfigError, match=r"tasks_train_length.txt:3: expected 'IN: <command> OUT: <actions>'$"
    ):
        build_task(TaskConfig(name="scan", split="length", path=str(tmp_path / "bad")), 0)

    write_official_copy(tmp_path / "latin1", [*good[:4], "IN: walk OUT: caf\xe9".encode("latin-1")])
    with pytest.raises(ConfigError, match=r"tasks_train_length.txt:5: not UTF-8 text"):
        build_task(TaskConfig(name="scan", split="length", path=str(tmp_path / "latin1")), 0)

    with pytest.raises(ConfigError, match=r"^task.path: no tasks_train_addprim_jump.txt under "):
        build_task(TaskConfig(name="scan", split="addprim_jump", path=str(tmp_path / "ok")), 0)
