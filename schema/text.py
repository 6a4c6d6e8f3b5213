"""User text (names, claim texts, paths, error details) as each sink writes it, so that no sink interprets
it: a terminal (`shown`; `terminal` for Rich, which would read `[...]` as markup), a CSV cell a spreadsheet
would run as a formula (`csv_cell`); Markdown cells: reports/formats.py `md_cell`. Dependency-free but for
Rich, imported lazily: every layer may use it."""

from __future__ import annotations

from typing import Any

# The first characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def shown(text: Any) -> str:
    """text with each control character (an escape sequence's ESC, a carriage return, a bell) written as its
    Python escape, so a terminal or a file shows it rather than acts on it; newlines and tabs stay."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode() for c in s)


def terminal(text: Any):
    """A Rich Text of `shown(text)`: printed, or put in a table cell or title, as it reads, never as markup."""
    from rich.text import Text

    return Text(shown(text))


def csv_cell(value: Any) -> Any:
    """A CSV cell: text that a spreadsheet would take for a formula gets a leading apostrophe (OWASP's
    advice), so it is shown, not run; numbers (a negative one included) and other values stay as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + shown(value)
    return shown(value) if isinstance(value, str) else value
