"""A report's files, and `ablate compare`'s Markdown, are written whole or not at all."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ablate.schema.errors import ConfigError


def write_whole(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside `path`, then rename: never half-written. A path that exists and is
    not a regular file (/dev/null, a folder, a symlink) is refused, never renamed over. open(), not mkstemp
    (always 0600), creates it, so its mode follows the umask (classmates on a shared server can read it)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):  # a device, a folder, a planted link
        raise ConfigError(f"{path}: exists and is not a regular file; give the path of a file to write")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    with open(tmp, "xb") if isinstance(data, bytes) else open(tmp, "x", encoding="utf-8") as f:
        f.write(data)
    os.replace(tmp, path)
