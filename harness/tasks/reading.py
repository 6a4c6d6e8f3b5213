"""Reading user data files line by line, where every failure is one ConfigError line naming file:line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ablate.schema.errors import ConfigError


def require_file(path: Path) -> Path:
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    return path


def read_lines(path: Path, skip_blank: bool = True) -> Iterator[tuple[int, str]]:
    """(line number from 1, text without the line break) for every line, blank ones too unless skipped;
    decoded line by line, so bytes that are not UTF-8 are reported with their line."""
    with require_file(path).open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"{path}:{number}: not UTF-8 text ({e.reason} at column {e.start + 1})"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark is not part of the text
            if line.strip() or not skip_blank:
                yield number, line
