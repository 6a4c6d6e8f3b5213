"""bible_genre: a Bible's verses, each labelled by the genre of its book (GENRES), for a classifier.

The verses are bible.py's: task.src_lang's module (`en`, the World English Bible, by default) in task.path's
library, cleaned and split by chapter as `bible` does, so no test chapter is trained on. Each non-empty verse
of a book GENRES names becomes one example (a book it does not name is left out, counted in task.json), its
text tokenized by task.tokenizer (learned on the training verses alone); a verse of more than task.max_tokens
tokens is left out. valid and test hold task.n_valid and task.n_test verses drawn with bible's SAMPLE_SEED
whatever the trial's seed; train every training verse, capped by task.max_examples with the trial's seed.
Labels are imbalanced (the histories and prophets hold most verses): macro-F1 weighs each genre alike."""

from __future__ import annotations

from ablate.harness.tasks.base import Example, TaskData, Vocab
from ablate.harness.tasks.bible import DEFAULT_LANGS, SAMPLE_SEED, library, module_name, setup_problem
from ablate.harness.tasks.bible_lm import read_verses
from ablate.harness.tasks.corpora import TRAIN_CAP, sample
from ablate.harness.tasks.tokenizers import build_tokenizer
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

# Each genre's books by OSIS name, the deuterocanonical ones the World English Bible carries included.
GENRES = {
    "law": ("Gen", "Exod", "Lev", "Num", "Deut"),
    "history": ("Josh", "Judg", "Ruth", "1Sam", "2Sam", "1Kgs", "2Kgs", "1Chr", "2Chr", "Ezra", "Neh", "Esth",
                "EsthGr", "1Esd", "Tob", "Jdt", "1Macc", "2Macc", "3Macc", "4Macc", "Acts"),
    "wisdom": ("Job", "Ps", "AddPs", "Prov", "Eccl", "Song", "Wis", "Sir", "PrMan"),
    "prophets": ("Isa", "Jer", "Lam", "Bar", "Ezek", "Dan", "Hos", "Joel", "Amos", "Obad", "Jonah", "Mic",
                 "Nah", "Hab", "Zeph", "Hag", "Zech", "Mal", "2Esd", "Rev"),
    "gospels": ("Matt", "Mark", "Luke", "John"),
    "letters": ("Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col", "1Thess", "2Thess", "1Tim", "2Tim", "Titus",
                "Phlm", "Heb", "Jas", "1Pet", "2Pet", "1John", "2John", "3John", "Jude"),
}  # fmt: skip
GENRE_OF = {book: genre for genre, books in GENRES.items() for book in books}


def bible_genre_task(cfg: TaskConfig, seed: int) -> TaskData:
    name = module_name(cfg.src_lang or DEFAULT_LANGS[0])
    problem = setup_problem(cfg, (name,))
    if problem:
        raise ConfigError(problem)
    folder = library(cfg)
    verses = read_verses(folder.resolve(), name)
    tokenizer = build_tokenizer(cfg.tokenizer, [text for _, text in verses["train"]], cfg.bpe_vocab_size)
    unnamed: set[str] = set()
    splits = {}
    for split, items in verses.items():
        examples = []
        for book, text in items:
            if book not in GENRE_OF:
                unnamed.add(book)
                continue
            tokens = tuple(tokenizer.tokenize(text))
            if cfg.max_tokens is None or len(tokens) <= cfg.max_tokens:
                examples.append(Example(tokens, (GENRE_OF[book],)))
        splits[split] = examples
    splits["train"] = sample(splits["train"], cfg.max_examples, [seed, TRAIN_CAP])
    splits["valid"] = sample(splits["valid"], cfg.n_valid, SAMPLE_SEED)
    splits["test"] = sample(splits["test"], cfg.n_test, SAMPLE_SEED)
    meta = {"path": str(folder), "module": name, "books_left_out": sorted(unnamed)}
    return TaskData(
        "bible_genre", splits, Vocab.from_examples(splits["train"], "src"), Vocab(GENRES), train_max_len=1,
        meta=meta, src_tokenizer=tokenizer, target_ends=False,
    )  # fmt: skip
