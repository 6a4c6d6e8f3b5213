"""A tiny SWORD library written here: zText Bible modules in the KJV versification with the verses a test
gives, as Debian's Bible packages lay them out (mods.d/<name>.conf, modules/texts/ztext/<name>/ot.bz[svz],
one compressed block a book). Needs pysword, for the verse index of each reference."""

from __future__ import annotations

import struct
import zlib
from collections import defaultdict
from pathlib import Path

DEBIAN_MODULES = ("engWEB2015eb", "spaRV1909eb")
NEEDS_DEBIAN = (
    "needs Debian's sword-text-web and sword-text-sparv: apt-get install sword-text-web sword-text-sparv"
)


def debian_bibles_missing() -> str | None:
    """Why the bible task cannot read Debian's Bibles here (a skip reason), or None."""
    from ablate.harness.tasks.bible import setup_problem
    from ablate.schema.task_config import TaskConfig

    problem = setup_problem(TaskConfig(name="bible"))
    return NEEDS_DEBIAN if problem and "SWORD module" in problem else problem


Verses = dict[tuple[str, int, int], str]  # (book name as pysword spells it, chapter, verse) -> OSIS markup


def write_module(library: Path, name: str, lang: str, verses: Verses) -> None:
    """Module `name` of language `lang` under `library`, holding `verses`; every other verse is empty."""
    from pysword.books import BibleStructure

    structure = BibleStructure("kjv", ["ot", "nt"])
    blocks: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))  # testament -> book -> verses
    for (book, chapter, verse), text in verses.items():
        testament, _ = structure.find_book(book)
        [index] = structure.ref_to_indicies(books=[book], chapters=[chapter], verses=[verse])[testament]
        blocks[testament][book].append((index, text.encode("utf-8")))
    folder = library / "modules" / "texts" / "ztext" / name.lower()
    folder.mkdir(parents=True)
    for testament, books in blocks.items():
        records: dict[int, tuple[int, int, int]] = {}
        block_index, data = [], b""
        for number, entries in enumerate(books.values()):
            text = b""
            for index, raw in entries:
                records[index] = (number, len(text), len(raw))
                text += raw
            packed = zlib.compress(text)
            block_index.append(struct.pack("<III", len(data), len(packed), len(text)))
            data += packed
        size = max(records) + 1
        (folder / f"{testament}.bzv").write_bytes(
            b"".join(struct.pack("<IIH", *records.get(i, (0, 0, 0))) for i in range(size))
        )
        (folder / f"{testament}.bzs").write_bytes(b"".join(block_index))
        (folder / f"{testament}.bzz").write_bytes(data)
    (library / "mods.d").mkdir(parents=True, exist_ok=True)
    (library / "mods.d" / f"{name.lower()}.conf").write_text(
        f"[{name}]\nDataPath=./modules/texts/ztext/{name.lower()}/\nModDrv=zText\nSourceType=OSIS\n"
        f"Encoding=UTF-8\nCompressType=ZIP\nBlockType=BOOK\nVersification=KJV\nLang={lang}\n",
        encoding="utf-8",
    )
