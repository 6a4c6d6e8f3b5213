"""Names that become folders, Optuna studies, W&B runs and command-line arguments: a study's and a variant's
name as checked, and the folder name each gets."""

from __future__ import annotations

import hashlib
import re

MAX_NAME_BYTES = 200  # in UTF-8; ablate then meets no file name limit (NAME_MAX is 255 bytes)
UNSAFE = re.compile(r"[^A-Za-z0-9_.=,-]+")  # what some filesystem would refuse, misread or fold
MAX_FOLDER_BYTES = 200  # under the 255 of common filesystems, with room for what tools append


def checked_name(name: str) -> str:
    """A study's or variant's name: it names folders, Optuna studies (`<study>:tune:<variant>`), W&B groups
    and runs, and a worker's command line, so it is one non-empty printable line of bounded length."""
    if not name.strip():
        raise ValueError("must not be empty")
    if not name.isprintable():
        raise ValueError("must be one line of printable characters")
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{size} bytes long; a name is at most {MAX_NAME_BYTES} bytes (UTF-8)")
    return name


def slugify(name: str) -> str:
    """A study's or variant's folder name, safe on every filesystem: the name itself where safe (so existing
    folders stay put), else its slug, '+' and a hash of the name; no safe name holds '+', so distinct names
    ('team/x', 'team_x') never share a folder. Names too long are shortened the same way."""
    slug = UNSAFE.sub("_", name).strip("._")
    if slug == name and 0 < len(name) <= MAX_FOLDER_BYTES:
        return name
    return f"{slug[: MAX_FOLDER_BYTES - 9] or 'study'}+{hashlib.sha256(name.encode()).hexdigest()[:8]}"
