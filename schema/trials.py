"""A trial as the storage holds it: the shape of every attribute the project stores with a trial (as JSON),
and how readers get its phase, variant, seed and grid point. `check_readable` (harness/study/storage.py)
holds each stored trial to these shapes first, so JSON of the wrong shape is one line naming the trial and
the attribute, not a TypeError in whatever reads it next. A user's own attributes may hold anything."""

from __future__ import annotations

import functools
import reprlib
from typing import TYPE_CHECKING, Any, NotRequired

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic reads typing's TypedDict only from Python 3.12

if TYPE_CHECKING:
    from ablate.schema.spec import StudySpec


class ResumeRecord(TypedDict):
    """harness/checkpoints.py's RESUME_ATTR: the latest checkpoint a retried trial resumes from."""

    step: int
    key: str
    state: str  # artifact id
    best: NotRequired[str]  # artifact id
    kind: NotRequired[str]  # checkpoints.FUSED_STATE; none: Lightning's


# Every user attribute a trial is given (harness/workers.py, study/queue.py, checkpoints.py), by name. A float
# takes an int too: the cost columns are numbers to the table. Any: what only the report's provenance prints.
USER_ATTRS: dict[str, Any] = {
    "grid_point": str, "phase": str, "variant": str, "seed": int, "tune_trial": int,
    "factors": dict[str, Any], "tuned": dict[str, Any], "config": dict[str, Any],
    "metrics": dict[str, float], "seed_values": dict[str, float], "split_sizes": dict[str, int], "artifacts": dict[str, str],
    "params": float, "wall_time": float, "tokens_per_sec": float, "peak_mem_mb": float, "steps": float,
    "resumed_from_step": int, "fail_reason": str, "traceback": str, "resume": ResumeRecord,
    "worker": Any, "hardware": Any, "versions": Any, "git_commit": Any, "signatures": Any, "fusion": str,
}  # fmt: skip
# The system attributes read here: Optuna's retry record and the parameters an enqueued trial was given.
SYSTEM_ATTRS: dict[str, Any] = {
    "retry_history": list[int],
    "failed_trial": int,
    "fixed_params": dict[str, Any],
}


def attribute_problem(trial) -> str | None:
    """Why a stored trial's attributes are not of the shape their readers take, naming the trial and the
    attribute (with where inside it), or None."""
    for kind, stored, shapes in (("user", trial.user_attrs, USER_ATTRS),
                                 ("system", trial.system_attrs, SYSTEM_ATTRS)):  # fmt: skip
        for name, value in stored.items():
            if name not in shapes:
                continue
            try:
                adapter(shapes[name]).validate_python(value, strict=True)  # strict: "1" is no number
            except ValidationError as e:
                return f"trial {trial.number}: {kind} attribute {name!r}{shape_error(e)}"
    return None


def shape_error(e: ValidationError) -> str:
    """The first error, as what follows the attribute's name: "['test/acc'] holds 'x': input should be a
    valid number", "['resume'] has no 'key'"."""
    error = e.errors()[0]
    path = [f"[{part!r}]" for part in error["loc"]]
    if error["type"] == "missing":
        return f"{''.join(path[:-1])} has no {error['loc'][-1]!r}"
    reason = error["msg"][0].lower() + error["msg"][1:]
    return f"{''.join(path)} holds {reprlib.repr(error['input'])}: {reason}"


@functools.cache
def adapter(shape: Any) -> TypeAdapter:
    return TypeAdapter(shape)


# Where a trial is and what it is: one Optuna study per phase and variant (harness/study/queue.py).
EVAL, TUNE = "eval", "tune"


def optuna_study_name(spec: StudySpec, phase: str = EVAL, variant: str | None = None) -> str:
    return f"{spec.name}:{phase}" if variant is None else f"{spec.name}:{phase}:{variant}"


def grid_point(variant: str, seed: int) -> str:
    """The identity of one eval trial: retries of a grid point share it (user attr 'grid_point')."""
    return f"{variant}/seed={seed}"


def trial_seed(trial) -> int | None:
    """An eval trial's seed: its user attribute (a parameter or fixed parameter in studies queued before
    seeds became attributes)."""
    for source in (trial.user_attrs, trial.params, trial.system_attrs.get("fixed_params", {})):
        if "seed" in source:
            return source["seed"]
    return None


def trial_variant(trial) -> str | None:
    """A trial's variant, whether it has started (params) or still waits (its fixed params, its attrs)."""
    return (
        trial.params.get("variant")
        or trial.system_attrs.get("fixed_params", {}).get("variant")
        or trial.user_attrs.get("variant")
    )
