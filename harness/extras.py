"""Optional dependencies (pyproject.toml's extras): a feature that needs one imports it through `require`,
which says in one line what to install when it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from ablate.schema.errors import ConfigError

DISTRIBUTION = "attention-ablate"  # pyproject.toml's name: what pip installs, from a clone or an index


def require(module: str, extra: str, feature: str) -> ModuleType:
    """`module`, imported; a ConfigError (exit 2 on the command line) naming the extra when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{feature}: the [{extra}] extra is not installed (no module {module}); "
            f"pip install '{DISTRIBUTION}[{extra}]'"
        ) from None
