"""bible: verse pairs of two public-domain Bibles from Debian's SWORD modules, so a real language pair
installs offline: `apt-get install sword-text-web sword-text-sparv` (World English Bible, Spanish
Reina-Valera 1909), read with pysword (the [bible] extra).

task.src_lang / task.tgt_lang: `en` (WEB), `es` (RV1909) (English -> Spanish by default) or any installed
SWORD Bible module's name; task.path: the SWORD library holding mods.d/ (default: $SWORD_PATH, which SWORD's
own programs read too, else Debian's /usr/share/sword).

A pair, fixed here so every run reads the same corpus (`clean_verse`, `aligned_pairs`):
- verses pair by reference (book, chapter, verse) both modules have;
- markup: text after a book's last verse (the WEB's glossary) is cut; notes, alternative readings,
  catchwords, speaker labels and headings go with their text, except canonical psalm titles (text in both
  translations); other tags go, their text stays (Strong's numbers live in attributes); entities are
  unescaped, whitespace collapsed, a word in capitals (RV1909's drop capitals, "EN el principio") capitalised;
- a verse with text on one side only is where the versifications part (the RV1909 numbers some chapters as
  the Hebrew: its Numbers 13:1 is the WEB's 12:16, the rest of 13 one verse late): that chapter and the next
  are dropped whole; a verse empty on both sides is skipped;
- a lopsided pair, longer side over MAX_RATIO times the shorter's words (verses merged or split otherwise),
  is dropped.

Splits ignore the trial's seed, so every trial is tested on the same verses: chapter i of the shared
versification (Genesis 1 is 0, canonical order, before any filter) goes to valid when i % SPLIT_EVERY is 0,
to test when it is SPLIT_EVERY / 2, to train otherwise (chapters stay whole; every part of the Bible is in
every split). valid / test keep n_valid / n_test pairs drawn with SAMPLE_SEED; as for `parallel`,
task.max_tokens (or long_after) moves longer test pairs to test_long, and task.max_examples caps train with
the trial's seed. bible_lm.py reads one Bible alone, cleaned and split the same way.

Debian 12's modules (WEB 426.0, RV1909 2.60) give 30,082 pairs of the KJV versification's 31,102 verses:
27,172 train, 1,509 valid, 1,401 test; 25 verses one-sided, 941 dropped with their chapters, 54 lopsided.
Reading and pairing them takes about two seconds, once per process."""

from __future__ import annotations

import functools
import html
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from ablate.harness.extras import require
from ablate.harness.tasks.base import TaskData
from ablate.harness.tasks.corpora import Corpus, corpus_task, sample
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

DEBIAN_LIBRARY = "/usr/share/sword"
# Language code -> (SWORD module, Debian package that installs it).
BIBLES = {"en": ("engWEB2015eb", "sword-text-web"), "es": ("spaRV1909eb", "sword-text-sparv")}
DEFAULT_LANGS = ("en", "es")
MAX_RATIO = 2.0  # a pair whose longer side has more than twice the words of the shorter is dropped
SPLIT_EVERY = 20  # chapter i: valid when i % 20 == 0, test when i % 20 == 10 (5 % each), train otherwise
SAMPLE_SEED = 0  # the valid / test samples of n_valid / n_test pairs, the same for every trial

Reference = tuple[str, int, int]  # (OSIS book name, chapter, verse)
T = TypeVar("T")

# Where a module's last verse of a book runs on into what is not scripture (a book's end, a glossary).
END_OF_TEXT = re.compile(r'<div\b[^>]*\b(?:eID="[^"]*"[^>]*type="book"|type="glossary")')
# Elements dropped with their text; a title is kept only when canonical (psalm titles).
NOT_TEXT = re.compile(
    r"<(note|rdg|catchWord|speaker)\b[^>]*(?<!/)>.*?</\1>"
    r'|<title\b(?![^>]*canonical="true")[^>]*(?<!/)>.*?</title>',
    re.DOTALL,
)
TAG = re.compile(r"<[^>]*>")
GAP = "\x00"  # where dropped text was: a space between two words, nothing next to punctuation
CAPITALS = re.compile(r"\b[^\W\d_]{2,}\b")


def clean_verse(markup: str) -> str:
    """The plain text of one verse's OSIS markup (see the module doc)."""
    end = END_OF_TEXT.search(markup)
    text = NOT_TEXT.sub(GAP, markup[: end.start()] if end else markup)
    text = TAG.sub("", text)
    text = re.sub(rf"(?<=\w){GAP}+(?=\w)", " ", text).replace(GAP, "")
    text = CAPITALS.sub(lambda m: m[0].capitalize() if m[0].isupper() else m[0], html.unescape(text))
    return " ".join(text.split())


def lopsided(src: str, tgt: str) -> bool:
    shorter, longer = sorted((len(src.split()), len(tgt.split())))
    return longer > MAX_RATIO * max(shorter, 1)


def shared_chapters(src: dict[Reference, str], tgt: dict[Reference, str]) -> list[tuple[str, int]]:
    """(book, chapter) of every reference both sides have, once each, in the source's order."""
    return list(dict.fromkeys(ref[:2] for ref in src if ref in tgt))


def aligned_pairs(
    src: dict[Reference, str], tgt: dict[Reference, str]
) -> tuple[list[tuple[Reference, str, str]], dict[str, int]]:
    """(reference, source, target) of the pairs the module doc's rules keep, in order; each rule's drops."""
    common = [ref for ref in src if ref in tgt]
    chapters = shared_chapters(src, tgt)
    broken = {ref[:2] for ref in common if bool(src[ref]) != bool(tgt[ref])}
    after = {chapters[i + 1] for i, chapter in enumerate(chapters[:-1]) if chapter in broken}
    dropped = {"one_sided": 0, "versification": 0, "lopsided": 0}
    pairs = []
    for ref in common:
        if not src[ref] or not tgt[ref]:
            dropped["one_sided"] += bool(src[ref] or tgt[ref])  # a verse neither module has is no pair
        elif ref[:2] in broken or ref[:2] in after:
            dropped["versification"] += 1
        elif lopsided(src[ref], tgt[ref]):
            dropped["lopsided"] += 1
        else:
            pairs.append((ref, src[ref], tgt[ref]))
    return pairs, dropped


def module_name(lang: str) -> str:
    """The SWORD module of a language code of BIBLES, or the module `lang` names."""
    return BIBLES[lang][0] if lang in BIBLES else lang


def module_names(cfg: TaskConfig) -> tuple[str, str]:
    langs = (cfg.src_lang, cfg.tgt_lang) if cfg.src_lang is not None else DEFAULT_LANGS
    return module_name(langs[0]), module_name(langs[1])


def library(cfg: TaskConfig) -> Path:
    return Path(cfg.path or os.environ.get("SWORD_PATH") or DEBIAN_LIBRARY).expanduser()


def installed(folder: Path) -> set[str]:
    """The module names of a SWORD library: the [section] of each mods.d/*.conf."""
    names = set()
    for conf in sorted((folder / "mods.d").glob("*.conf")):
        found = re.search(r"^\[([^\]]+)\]", conf.read_text(encoding="utf-8", errors="replace"), re.MULTILINE)
        if found:
            names.add(found[1])
    return names


def setup_problem(cfg: TaskConfig, names: tuple[str, ...] | None = None) -> str | None:
    """One line saying what to install (or which task.path to give) for the modules `names` (default: the
    two cfg names) and for pysword, or None when both are there."""
    folder, names = library(cfg), names or module_names(cfg)
    have = installed(folder)
    missing = [name for name in names if name not in have]
    if missing:
        packages = [package for module, package in BIBLES.values() if module in missing]
        install = (
            f"apt-get install {' '.join(packages)}" if packages else "install them with SWORD's installmgr"
        )
        return (
            f"task {cfg.name}: no SWORD module {', '.join(missing)} in {folder} ({install}, "
            "or set task.path to the SWORD library that holds them)"
        )
    try:
        require("pysword", extra="bible", feature=f"the {cfg.name} task")
    except ConfigError as e:
        return str(e)
    return None


def read_module(folder: Path, name: str) -> dict[Reference, str]:
    """Every verse of a module by reference, cleaned; empty where the module has no text."""
    from pysword.modules import SwordModules  # setup_problem has checked it is there

    from ablate.harness import compat  # Optuna's too: imported when a Bible is read

    modules = SwordModules(str(folder))
    modules.parse_modules()
    bible = modules.get_bible_from_module(name)
    compat.cache_sword_blocks(bible)
    verses = {}
    for testament in bible.get_structure().get_books().values():
        for book in testament:
            refs = [
                (book.osis_name, c, v) for c, n in enumerate(book.chapter_lengths, 1) for v in range(1, n + 1)
            ]
            verses.update(
                zip(refs, map(clean_verse, bible.get_iter(books=[book.name], clean=False)), strict=True)
            )
    return verses


def split_by_chapter(
    items: Iterable[tuple[Reference, T]], chapters: list[tuple[str, int]]
) -> dict[str, list[T]]:
    """train / valid / test of each (reference, item) by its chapter's index in `chapters`, order kept."""
    index = {chapter: i for i, chapter in enumerate(chapters)}
    splits: dict[str, list[T]] = {"train": [], "valid": [], "test": []}
    for ref, item in items:
        position = index[ref[:2]] % SPLIT_EVERY
        split = "valid" if position == 0 else "test" if position == SPLIT_EVERY // 2 else "train"
        splits[split].append(item)
    return splits


@functools.lru_cache(maxsize=2)
def read_bible(folder: Path, src: str, tgt: str) -> tuple[Corpus, dict[str, int]]:
    """Two modules' aligned_pairs split by chapter, and each rule's drops; read once for a worker's trials."""
    source, target = read_module(folder, src), read_module(folder, tgt)
    pairs, dropped = aligned_pairs(source, target)
    corpus = split_by_chapter(((ref, (s, t)) for ref, s, t in pairs), shared_chapters(source, target))
    return corpus, dropped


def bible_task(cfg: TaskConfig, seed: int) -> TaskData:
    problem = setup_problem(cfg)
    if problem:
        raise ConfigError(problem)
    folder, (src, tgt) = library(cfg), module_names(cfg)
    whole, dropped = read_bible(folder.resolve(), src, tgt)
    # The same valid / test pairs for every trial, whatever its seed.
    corpus = {"train": whole["train"], "valid": sample(whole["valid"], cfg.n_valid, SAMPLE_SEED),
              "test": sample(whole["test"], cfg.n_test, SAMPLE_SEED)}  # fmt: skip
    meta = {"path": str(folder), "modules": [src, tgt], "pairs": {k: len(v) for k, v in whole.items()},
            "dropped": dropped}  # fmt: skip
    return corpus_task("bible", corpus, cfg, seed, meta)
