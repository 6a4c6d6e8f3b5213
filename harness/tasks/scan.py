"""SCAN (Lake & Baroni 2018): navigation commands -> action sequences, generated from the published
grammar, with the paper's splits; or read from the official files with `task.path`.

    C -> S and S | S after S | S          [[x1 and x2]] = [[x1]] [[x2]]; [[x1 after x2]] = [[x2]] [[x1]]
    S -> V twice | V thrice | V           repeats the meaning 2 or 3 times
    V -> D[1] opposite D[2] | D[1] around D[2] | D | U
    D -> U left | U right | turn left | turn right
    U -> walk | look | run | jump

The generator gives the official tasks.txt exactly, as a set (20,910 commands). Splits:
- simple: a seeded 80/20 split of all commands;
- length: train on action sequences of at most 22 actions, test on the longer ones;
- addprim_jump / addprim_turn_left: the primitive alone is the only training command containing it,
  repeated to a tenth of the training set as in the official files; test is every other command with it.
SCAN has no validation split: valid is a seeded sample held out of train (train + valid = the
official training set), sized min(task.n_valid, a tenth of train)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ablate.harness.tasks.base import Example, TaskData, Vocab, longest_target
from ablate.harness.tasks.reading import read_lines
from ablate.schema.errors import ConfigError

if TYPE_CHECKING:
    from ablate.schema.task_config import TaskConfig

PRIMITIVES = {"walk": "I_WALK", "look": "I_LOOK", "run": "I_RUN", "jump": "I_JUMP"}
TURNS = {"left": "I_TURN_LEFT", "right": "I_TURN_RIGHT"}
REPEATS = {"twice": 2, "thrice": 3}
LENGTH_SPLIT_MAX_ACTIONS = 22

Pair = tuple[tuple[str, ...], tuple[str, ...]]  # (command words, actions)
Split = Callable[[list[Pair], int], tuple[list[Pair], list[Pair]]]  # (commands, seed) -> (train, test)


def verb_phrases() -> list[Pair]:
    """V: every direction phrase (turn or a primitive, plain / opposite / around, left / right) and U."""
    phrases = []
    for verb in [*PRIMITIVES, "turn"]:
        action = (PRIMITIVES[verb],) if verb in PRIMITIVES else ()  # turning alone does nothing else
        for direction, turn in TURNS.items():
            once = (turn, *action)
            phrases.append(((verb, direction), once))
            phrases.append(((verb, "opposite", direction), (turn, *once)))
            phrases.append(((verb, "around", direction), once * 4))
    return phrases + [((verb,), (action,)) for verb, action in PRIMITIVES.items()]


def all_commands() -> list[Pair]:
    """Every SCAN command with its action sequence, in grammar order."""
    sentences = []
    for words, actions in verb_phrases():
        sentences.append((words, actions))
        sentences.extend(((*words, rep), actions * n) for rep, n in REPEATS.items())
    commands = list(sentences)
    for first, first_actions in sentences:
        for second, second_actions in sentences:
            commands.append(((*first, "and", *second), first_actions + second_actions))
            commands.append(((*first, "after", *second), second_actions + first_actions))
    return commands


def contains(words: tuple[str, ...], phrase: tuple[str, ...]) -> bool:
    return any(words[i : i + len(phrase)] == phrase for i in range(len(words) - len(phrase) + 1))


def random_split(commands: list[Pair], seed: int) -> tuple[list[Pair], list[Pair]]:
    order = np.random.default_rng([seed, 5]).permutation(len(commands))
    n_test = round(0.2 * len(commands))
    return [commands[i] for i in order[n_test:]], [commands[i] for i in order[:n_test]]


def length_split(commands: list[Pair], seed: int) -> tuple[list[Pair], list[Pair]]:
    short = [c for c in commands if len(c[1]) <= LENGTH_SPLIT_MAX_ACTIONS]
    return short, [c for c in commands if len(c[1]) > LENGTH_SPLIT_MAX_ACTIONS]


def primitive_split(primitive: tuple[str, ...]) -> Split:
    """The split that holds out every command using `primitive` but the primitive alone, which train repeats
    as the official files do."""

    def split(commands: list[Pair], seed: int) -> tuple[list[Pair], list[Pair]]:
        alone = [c for c in commands if c[0] == primitive]
        test = [c for c in commands if contains(c[0], primitive) and c[0] != primitive]
        others = [c for c in commands if not contains(c[0], primitive)]
        # The primitive alone is a tenth of the official training set: others + k with k = (others + k) / 10.
        return others + alone * round(len(others) / 9), test

    return split


# Each of the paper's splits, (train, test) of all commands, by its name in schema/tasks.py's SCAN_SPLITS.
SPLITTERS: dict[str, Split] = {
    "simple": random_split,
    "length": length_split,
    "addprim_jump": primitive_split(("jump",)),
    "addprim_turn_left": primitive_split(("turn", "left")),
}


def parse_line(path: Path, number: int, line: str) -> Pair:
    command, sep, actions = line.removeprefix("IN: ").partition(" OUT: ")
    if not line.startswith("IN: ") or not sep or not command.strip() or not actions.strip():
        raise ConfigError(f"{path}:{number}: expected 'IN: <command> OUT: <actions>'")
    return tuple(command.split()), tuple(actions.split())


def read_scan_file(path: Path) -> list[Pair]:
    pairs = [parse_line(path, number, line) for number, line in read_lines(path)]
    if not pairs:
        raise ConfigError(f"{path}: empty file")
    return pairs


def find_official_file(root: Path, name: str) -> Path:
    """The official repository keeps each split in a subfolder (length_split/...); a flat copy works too."""
    if not root.is_dir():
        raise ConfigError(f"task.path: {root} is not a directory of SCAN files")
    found = sorted(root.rglob(name))
    if not found:
        raise ConfigError(f"task.path: no {name} under {root}")
    return found[0]


def hold_out_valid(train: list[Pair], n_valid: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    """A seeded validation sample of training commands that occur once: the repeated primitive of the
    addprim splits always stays in train."""
    counts = Counter(train)
    once = sorted(c for c, n in counts.items() if n == 1)
    size = min(n_valid, len(once) // 10)
    picked = {once[i] for i in np.random.default_rng([seed, 7]).choice(len(once), size, replace=False)}
    return [c for c in train if c not in picked], [c for c in once if c in picked]


def scan_task(cfg: TaskConfig, seed: int) -> TaskData:
    if cfg.path:
        root = Path(cfg.path)
        train = read_scan_file(find_official_file(root, f"tasks_train_{cfg.split}.txt"))
        test = read_scan_file(find_official_file(root, f"tasks_test_{cfg.split}.txt"))
    else:
        train, test = SPLITTERS[cfg.split](all_commands(), seed)
    train, valid = hold_out_valid(train, cfg.n_valid, seed)
    splits = {
        name: [Example(words, actions) for words, actions in pairs]
        for name, pairs in (("train", train), ("valid", valid), ("test", test), ("test_long", []))
    }
    every = train + test
    return TaskData(
        "scan", splits, Vocab(w for c, _ in every for w in c), Vocab(a for _, acts in every for a in acts),
        train_max_len=longest_target(splits["train"]), meta={"split": cfg.split},
    )  # fmt: skip
