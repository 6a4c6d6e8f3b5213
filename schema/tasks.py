"""The task registry: TASKS, the names `task.name` accepts, each with what it is, the task.* keys its builder
reads (`ablate list` shows them; `ignored_task_keys` refuses the others) and where the builder is; SCAN_SPLITS
and TOKENIZERS, the names `task.split` and `task.tokenizer` accept. Names and keys only: a builder, named
'module:function' of harness/tasks/, is imported when a task is built, so reading a config loads no task
module or tokenizer library. tests/test_task_keys.py checks each entry against what its builder reads."""

from __future__ import annotations

from typing import Literal, NamedTuple

# The task.* keys each family's builder reads. Generated tasks (synthetic.py's sample_splits): lengths and
# split sizes; a task of vocab_size symbols also its vocabulary size.
GENERATED_KEYS = ("min_len", "max_len", "test_max_len", "n_train", "n_valid", "n_test")
SYMBOL_KEYS = (*GENERATED_KEYS, "vocab_size")
SCAN_KEYS = ("split", "path", "n_valid")
# corpus_task (corpora.py), and with task.tokenizer also the keys its tokenizer reads (TOKENIZERS).
CORPUS_KEYS = ("tokenizer", "min_tokens", "max_tokens", "long_after", "max_examples")
PARALLEL_KEYS = ("path", "src_lang", "tgt_lang", "hf_config", "n_valid", "n_test", *CORPUS_KEYS)
BIBLE_KEYS = ("path", "src_lang", "tgt_lang", "n_valid", "n_test", *CORPUS_KEYS)
# One Bible's verses labelled by genre: one language, no shortest verse.
BIBLE_GENRE_KEYS = ("path", "src_lang", "n_valid", "n_test", "tokenizer", "max_tokens", "max_examples")
# One Bible as running text: no pairs, so no target language and no shortest pair.
BIBLE_LM_KEYS = (
    "path", "src_lang", "n_valid", "n_test", "tokenizer", "max_tokens", "max_examples", "train_factor"
)

# The test splits, in the order they are evaluated: test holds the training lengths; test_long longer
# examples (beyond TaskConfig.long_cut); test_x2 / test_x4 the test text again in windows of 2 and 4 times
# the training length. Each task declares those it fills (Task.test_splits); an empty split is not evaluated.
TEST_SPLITS = ("test", "test_long", "test_x2", "test_x4")
LENGTH_SPLITS = ("test", "test_long")
# Each split of longer windows -> its window length in training lengths.
WINDOW_SPLITS = {"test_x2": 2, "test_x4": 4}

# task.split: SCAN's splits, each built by its function in scan.py (SPLITTERS), with what it holds out.
SCAN_SPLITS = {
    "simple": "a seeded 80/20 split of all commands",
    "length": "train on the shorter action sequences, test on the longer ones",
    "addprim_jump": "jump alone in train, every other command with it in test",
    "addprim_turn_left": "turn left alone in train, every other command with it in test",
}
# task.tokenizer: each tokenizer (its class in tokenizers.py, TOKENIZER_CLASSES) -> the task.* keys it reads
# beyond task.tokenizer.
TOKENIZERS: dict[str, tuple[str, ...]] = {"char": (), "word": (), "bpe": ("bpe_vocab_size",)}
# Each task.* key a tokenizer reads -> the tokenizers that read it: a corpus task ignores it with any other.
TOKENIZER_KEYS = {key: [name for name, reads in TOKENIZERS.items() if key in reads]
                  for reads in TOKENIZERS.values() for key in reads}  # fmt: skip


class Task(NamedTuple):
    """A task family in the registry: where its builder is, what it is, and which task.* keys it reads."""

    build: str  # 'module:function' of harness/tasks/: function(TaskConfig, seed) -> TaskData
    about: str  # what the task is, in one line
    # The task.* keys `build` reads besides task.name; with task.tokenizer, also those its tokenizer reads.
    reads: tuple[str, ...]
    # Those of them it cannot run without (their default is unset): refused when missing, before any trial.
    needs: tuple[str, ...] = ()
    # The test splits it fills, of TEST_SPLITS; test_long only where the configuration sets a length apart
    # (TaskConfig.test_splits).
    test_splits: tuple[str, ...] = LENGTH_SPLITS
    # What it reads from this machine, checked with the study before anything is made (by building the task
    # once): "nothing" (it generates its data), "always" (files or modules it cannot run without), or
    # "path" (what task.path names, when it names something local).
    reads_machine: Literal["nothing", "always", "path"] = "nothing"
    # What its data carries beyond token pairs, known before any is built (the metrics a study may name
    # depend on it): text scored with BLEU / chrF (TaskData.is_text), gold word alignments (Example.alignment).
    text: bool = False
    aligned: bool = False
    # Its target is one label (a classifier's task, models/kinds.py Family.classifies): macro-F1 is reported.
    labelled: bool = False
    # Its source is an image, its pixels column by column (models/sequences.py IMAGE_ROWS), which a family
    # that reads images (models/kinds.py Family.images) folds back.
    image: bool = False

    def keys(self) -> tuple[str, ...]:
        """Every task.* key the task reads under some configuration: its own and, with task.tokenizer, every
        tokenizer's."""
        return (*self.reads, *(TOKENIZER_KEYS if "tokenizer" in self.reads else ()))

    @property
    def doc(self) -> str:
        """The line `ablate list` shows: what the task is and the keys it reads."""
        keys = [key if key in self.reads else f"{key} (tokenizer {' | '.join(TOKENIZER_KEYS[key])})"
                for key in self.keys()]  # fmt: skip
        return f"{self.about}; reads {', '.join(keys)}"


TASKS: dict[str, Task] = {
    "copy": Task("synthetic:copy_task", "output = input; symbols 0..vocab_size-1", SYMBOL_KEYS, aligned=True),
    "reverse": Task("synthetic:reverse_task", "output = input reversed", SYMBOL_KEYS, aligned=True),
    "sort": Task("synthetic:sort_task", "output = input sorted (stable)", SYMBOL_KEYS, aligned=True),
    "addition": Task(
        "synthetic:addition_task", "a + b -> digits of the sum, with carries; lengths in digits", GENERATED_KEYS
    ),
    "recall": Task(
        "synthetic:recall_task",
        "k1 v1 ... kn vn ? k -> value of k; lengths in pairs (at most 26), vocab_size values",
        SYMBOL_KEYS,
        aligned=True,
    ),
    "cues": Task(
        "synthetic:cues_task",
        "a text of random symbols with one to three cue words (good great nice | bad awful poor) -> the label of "
        "most of its cues (positive | negative); the cues are the gold rationale; lengths in tokens (at least 3)",
        SYMBOL_KEYS,
        aligned=True,
        labelled=True,
    ),
    "digits": Task(
        "digits:digits_task",
        "strips of handwritten digits (scikit-learn's 1,797 8x8 images: pip install 'attention-ablate[digits]') -> "
        "the digits; pixels as tokens of their 17 levels, column by column; lengths in digits; no image in two "
        "splits; the gold alignment is the digit's pixels",
        GENERATED_KEYS,
        reads_machine="always",
        aligned=True,
        image=True,
    ),
    "synth_mt": Task(
        "synth_mt:synth_mt_task",
        "SVO -> SOV toy translation with gold alignments; lengths in source words (at least 5)",
        GENERATED_KEYS,
        text=True,
        aligned=True,
    ),
    "scan": Task(
        "scan:scan_task",
        "SCAN commands -> actions; path: a folder of the official files (optional)",
        SCAN_KEYS,
        test_splits=("test",),
        reads_machine="path",
    ),
    "parallel": Task(
        "corpora:parallel_task",
        "sentence pairs; path: TSV | JSONL | Moses prefix | save_to_disk folder | hub name",
        PARALLEL_KEYS,
        reads_machine="path",
        text=True,
    ),
    "bible": Task(
        "bible:bible_task",
        "World English Bible -> Reina-Valera 1909 verses (apt-get install sword-text-web sword-text-sparv); "
        "src_lang/tgt_lang: en | es | a SWORD module; path: the SWORD library (default $SWORD_PATH, else "
        "/usr/share/sword)",
        BIBLE_KEYS,
        reads_machine="always",
        text=True,
    ),
    "bible_genre": Task(
        "bible_genre:bible_genre_task",
        "one Bible's verses (default the World English Bible) -> the genre of their book (law | history | "
        "wisdom | prophets | gospels | letters); src_lang, path: as bible",
        BIBLE_GENRE_KEYS,
        test_splits=("test",),
        reads_machine="always",
        labelled=True,
    ),
    "bible_lm": Task(
        "bible_lm:bible_lm_task",
        "one Bible's running text (default the World English Bible) as a language model's windows of "
        "max_tokens tokens (train_factor times that in training), tested on 1, 2 and 4 times max_tokens; "
        "src_lang: en | es | a SWORD module; path: as bible",
        BIBLE_LM_KEYS,
        needs=("max_tokens",),
        test_splits=("test", *WINDOW_SPLITS),
        reads_machine="always",
    ),
}


def tasks_reading(key: str) -> list[str]:
    """The tasks that read task.`key` under some configuration, in registry order."""
    return [name for name, task in TASKS.items() if key in task.keys()]


# Tasks whose training length is task.max_tokens (pairs or windows of at most that many tokens).
CORPUS_TASKS = frozenset(tasks_reading("max_tokens"))
