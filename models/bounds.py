"""Every number a config takes has both ends in its schema: `unbounded` finds the int and float fields of a
pydantic model (in unions, lists and nested models too) that lack a lower or an upper bound. The config's
and the study file's schemas are held to it by a test; a plug-in's settings when they are loaded."""

from __future__ import annotations

import typing
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo


def unbounded(model: type[BaseModel], prefix: str) -> list[str]:
    """'<prefix>.<field>' of each number field of `model` without both ends (a dict of values excepted: what
    it holds is ranged where it is read)."""
    return [where for name, field in model.model_fields.items()
            for where in _unbounded(field.annotation, field.metadata, f"{prefix}.{name}")]  # fmt: skip


def _unbounded(annotation: Any, metadata: list, where: str) -> list[str]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _unbounded(args[0], [*metadata, *annotation.__metadata__], where)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return unbounded(annotation, where)
    if origin is dict:
        return []
    if origin is list:
        return _unbounded(args[0], [], f"{where}[]")
    if args and origin is not typing.Literal:  # a union: each member with the field's own bounds
        return [w for a in args if a is not type(None) for w in _unbounded(a, metadata, where)]
    if annotation in (int, float):
        kinds = {type(c) for m in metadata for c in (m.metadata if isinstance(m, FieldInfo) else [m])}
        low = kinds & {annotated_types.Ge, annotated_types.Gt}
        high = kinds & {annotated_types.Le, annotated_types.Lt}
        return [] if low and high else [where]
    return []
