"""Prints a pip constraint `name==floor` for every `name>=floor` in pyproject.toml (extras included), torch
excepted: installed with them, each lower bound is tried exactly, and a floor that cannot be installed
fails instead of being silently raised by the resolver."""

import re
import sys
import tomllib
from pathlib import Path

HELD = {"torch"}  # the local build is used at every resolution

project = tomllib.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml").read_text())["project"]
requirements = [
    *project["dependencies"],
    *(r for extra in project["optional-dependencies"].values() for r in extra),
]
for requirement in requirements:
    found = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?>=([^,;\s]+).*", requirement.strip())
    if found and found[1] not in HELD:
        print(f"{found[1]}=={found[3]}")
