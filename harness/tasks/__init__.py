"""Task registry: `build_task(cfg.task, seed)` gives a TaskData with train / valid / test / test_long.

TASKS maps each task name to (builder, one line on what it is and which task.* options it reads); it is
the one list of names `task.name` accepts."""

from __future__ import annotations

from collections.abc import Callable

from ablate.harness.errors import ConfigError
from ablate.harness.tasks.base import SPLITS, Example, TaskData, Vocab
from ablate.harness.tasks.bible import bible_task
from ablate.harness.tasks.corpora import parallel_task
from ablate.harness.tasks.options import TaskConfig
from ablate.harness.tasks.scan import scan_task
from ablate.harness.tasks.synth_mt import synth_mt_task
from ablate.harness.tasks.synthetic import addition_task, copy_task, recall_task, reverse_task, sort_task

SYNTHETIC_OPTIONS = "min_len, max_len, test_max_len, n_train/n_valid/n_test"

TASKS: dict[str, tuple[Callable[[TaskConfig, int], TaskData], str]] = {
    "copy": (copy_task, f"output = input; symbols 0..vocab_size-1; {SYNTHETIC_OPTIONS}, vocab_size"),
    "reverse": (reverse_task, f"output = input reversed; {SYNTHETIC_OPTIONS}, vocab_size"),
    "sort": (sort_task, f"output = input sorted (stable); {SYNTHETIC_OPTIONS}, vocab_size"),
    "addition": (
        addition_task,
        f"a + b -> digits of the sum, with carries; lengths in digits; {SYNTHETIC_OPTIONS}",
    ),
    "recall": (
        recall_task,
        f"k1 v1 ... kn vn ? k -> value of k; lengths in pairs (at most 26); {SYNTHETIC_OPTIONS}, vocab_size (values)",
    ),
    "synth_mt": (
        synth_mt_task,
        f"SVO -> SOV toy translation with gold alignments; lengths in source words (at least 5); {SYNTHETIC_OPTIONS}",
    ),
    "scan": (
        scan_task,
        "SCAN commands -> actions; split (simple | length | addprim_jump | addprim_turn_left), "
        "n_valid, path (folder of official files, optional)",
    ),  # fmt: skip
    "parallel": (
        parallel_task,
        "sentence pairs; path (TSV | JSONL | Moses prefix | save_to_disk folder | hub name), src_lang/tgt_lang, "
        "hf_config, tokenizer (char | word | bpe), bpe_vocab_size, min_tokens, max_tokens, max_examples, n_valid/n_test",
    ),
    "bible": (
        bible_task,
        "World English Bible -> Reina-Valera 1909 verses (apt-get install sword-text-web sword-text-sparv); "
        "src_lang/tgt_lang (en | es | a SWORD module), path (SWORD library; default $SWORD_PATH, else "
        "/usr/share/sword), tokenizer, bpe_vocab_size, "
        "min_tokens, max_tokens, max_examples, n_valid/n_test",
    ),
}
# What a task's data carries beyond token pairs, known before any is built (the metrics a study may name
# depend on it): text scored with BLEU / chrF (TaskData.is_text), gold word alignments (Example.alignment).
TEXT_TASKS = frozenset({"synth_mt", "parallel", "bible"})
ALIGNED_TASKS = frozenset({"copy", "reverse", "sort", "recall", "synth_mt"})
# Tasks whose lengths come from task.min_len / max_len / test_max_len (test_long beyond max_len).
GENERATED_TASKS = frozenset({"copy", "reverse", "sort", "addition", "recall", "synth_mt"})
# Corpus tasks: test pairs longer than task.max_tokens form test_long.
CORPUS_TASKS = frozenset({"parallel", "bible"})


def build_task(cfg: TaskConfig, seed: int) -> TaskData:
    """The task cfg.name names (TaskConfig accepts only TASKS' names)."""
    data = TASKS[cfg.name][0](cfg, seed)
    if not data.splits["train"]:
        raise ConfigError(f"task.name: {cfg.name} produced no training examples")
    return data


__all__ = [
    "ALIGNED_TASKS", "CORPUS_TASKS", "GENERATED_TASKS", "SPLITS", "TASKS", "TEXT_TASKS",
    "Example", "TaskData", "Vocab", "build_task",
]  # fmt: skip
