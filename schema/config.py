"""ExperimentConfig = task + model + train + seed, from YAML, presets and dotted `--set key=value` overrides.

Every failure is a ConfigError with one line naming the dotted key, e.g.
`model.heads: must divide d_model=128 (got heads=3)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from ablate.models.config import MAX_MANY, PRESETS, Count, Many, ModelConfig, preset_keys
from ablate.models.kinds import FAMILIES
from ablate.models.optim import OptimConfig
from ablate.models.plugins import fault as plugin_fault
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig, ignored_task_keys
from ablate.schema.tasks import TASKS


class TrainConfig(OptimConfig):
    """train.*: OptimConfig (what Seq2SeqModule reads: lr, schedule, loss, decoding) and what the Trainer
    and the data read."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no key takes NaN or inf

    batch_size: Count = 64
    batch_tokens: Many | None = None
    # Budgets that train something: a zero or negative one would report an untrained model.
    max_epochs: Many | None = None
    max_time: float | None = Field(None, gt=0.0, le=366 * 86400.0)  # seconds, a year at most
    grad_clip: float | None = Field(1.0, gt=0.0, le=1e9)
    # auto: fp32 on every device, one precision for every variant (harness/trial.py resolve_precision).
    precision: Literal["auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "64-true"] = "auto"
    # validations without a better val/loss before stopping; None: never
    patience: Many | None = None
    deterministic: bool = False
    val_every: Many = 250  # steps between validations
    # Steps between full-state checkpoints a retried or preempted trial resumes from; 0: none.
    checkpoint_every: int = Field(500, ge=0, le=MAX_MANY, strict=True)
    keep_checkpoints: bool = False  # keep a finished trial's resume checkpoint (else it is removed)
    # The eval seeds of a variant train as one model (harness/fused.py); auto: where that pays, on a GPU (harness/grouping.py).
    fuse_seeds: bool | Literal["auto"] = "auto"


def fitting_task(arch: str) -> str:
    """A task a model of family `arch` reads: a labelled one for a classifier, an image for a family that
    reads images, else the default."""
    family = FAMILIES[arch]
    return next(
        (name for name, task in TASKS.items() if task.labelled == family.classifies and task.image == family.images),
        TaskConfig().name,
    )


def task_for_model(preset: str | None, sets: list[str]) -> str:
    """A task the model that `preset` and the `--set` overrides name reads (`ablate check`, which checks a model
    alone): its model.arch's fitting_task. An override it cannot read is left for load_config to refuse."""
    arch = PRESETS[preset].get("arch") if preset in PRESETS else None
    for item in sets:
        try:
            key, value = parse_override(item)
        except ConfigError:
            continue
        arch = value if key == "model.arch" else arch
    return fitting_task(arch) if arch in FAMILIES else TaskConfig().name


class ExperimentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no key takes NaN or inf

    seed: int = Field(0, ge=0, lt=2**32, strict=True)  # what numpy's and torch's seeding accept
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: TaskConfig) -> TaskConfig:
        if task.name not in TASKS:
            raise ValueError(
                f"name: {plugin_fault('task', task.name) or f'unknown task {task.name!r}'}; known: {', '.join(TASKS)}"
            )
        return task

    @model_validator(mode="after")
    def _readable_task(self) -> ExperimentConfig:
        """A classifier emits one label, and a label is all a labelled task's target holds: no EOS after it,
        which a decoder would have to learn to stop. A family that reads images folds its source back into
        an image, which only an image task's source is."""
        task, family = TASKS[self.task.name], FAMILIES[self.model.arch]
        classifiers = ", ".join(name for name, family in FAMILIES.items() if family.classifies)
        if task.labelled and not family.classifies:
            raise ValueError(
                f"task.name: {self.task.name}'s target is one label, which model.arch {self.model.arch} does "
                f"not predict (it decodes sequences); a family that classifies: {classifiers}"
            )
        if family.classifies and not task.labelled:
            labelled = ", ".join(name for name, task in TASKS.items() if task.labelled)
            raise ValueError(
                f"model.arch: {self.model.arch} predicts one label, so it cannot read task {self.task.name}, whose "
                f"targets are sequences; a task whose target is a label: {labelled}"
            )
        if family.images and not task.image:
            images = ", ".join(name for name, task in TASKS.items() if task.image)
            raise ValueError(
                f"model.arch: {self.model.arch} reads images, so it cannot read task {self.task.name}, whose "
                f"sources are token sequences; a task whose source is an image: {images}"
            )
        return self

    def flat(self) -> dict[str, Any]:
        """{'model.heads': 4, ...}: the form W&B configs, reports and `--set` use."""
        return flatten(self.model_dump())


def accepted_values(section: type[BaseModel] = ExperimentConfig, prefix: str = "") -> dict[str, str]:
    """Dotted key -> what it accepts, for `ablate list`: the field's description, else its choices and the
    range the schema states ('post | pre | none | rms_pre', 'integer >= 1, or unset', 'number > 0')."""
    accepted: dict[str, str] = {}
    for name, field in section.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            accepted.update(accepted_values(field.annotation, f"{prefix}{name}."))
        else:
            accepted[f"{prefix}{name}"] = field.description or allowed(field)
    return accepted


BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
KINDS = {int: "integer", float: "number", bool: "true | false", str: "text"}


def allowed(field: FieldInfo) -> str:
    """A field's choices, its kind with the schema's bounds, and 'unset' where None is accepted."""
    annotation = field.annotation
    types = (get_args(annotation) if get_origin(annotation) is not Literal else ()) or (annotation,)
    choices = [str(c) for t in types if get_origin(t) is Literal for c in get_args(t)]
    parts = [" | ".join(choices)] if choices else []
    for t in types:  # a bounded member of a union (`Count | None`) carries its bounds with it
        kind, metadata = (get_args(t)[0], t.__metadata__) if get_origin(t) is Annotated else (t, field.metadata)
        if kind in KINDS:
            parts.append(" ".join([KINDS[kind], ", ".join(bounds(metadata))]).strip())
    return ", or ".join(parts + (["unset"] if type(None) in types else []))


def bounds(metadata) -> list[str]:
    """'>= 1', '<= 1048576', ... of a field's constraints (pydantic's, or a Field's inside Annotated)."""
    flat = [c for m in metadata for c in (m.metadata if isinstance(m, FieldInfo) else [m])]
    return [f"{op} {str(getattr(m, attr)).removesuffix('.0')}" for m in flat for attr, op in BOUNDS if hasattr(m, attr)]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Sets tree['a']['b'] = value for 'a.b', creating levels as needed."""
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
        node = child
    node[leaf] = value


def parse_override(item: str) -> tuple[str, Any]:
    """'model.heads=4' -> ('model.heads', 4); the value is read as YAML (numbers, bools, lists)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. model.heads=4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):
        # YAML 1.1 reads '3e-4' as a string; a user typing it means a number.
        try:
            value = float(value)
        except ValueError:
            pass
    return key.strip(), value


class StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' may repeat what it merges
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool):
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {first_line[key] + 1})",
                        key_node.start_mark,
                    )  # fmt: skip
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


MAX_YAML_BYTES = 1_000_000  # a config or study file; larger is a mistake (or an attack), not a study


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    with path.open("rb") as f:  # read no further than the bound: the file may be huge, or still growing
        raw = f.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        size = path.stat().st_size
        raise ConfigError(f"{path}: {size:,} bytes; a config or study file is at most {MAX_YAML_BYTES:,}")
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    return data


def build_config(tree: dict[str, Any], overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """A config from a nested tree with an optional `preset` (filling `model`), then dotted overrides on top;
    keys under `model` and in overrides win over the preset."""
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    for key, value in (overrides or {}).items():
        if key == "preset":
            tree["preset"] = value
        else:
            set_dotted(tree, key, value)
    preset = tree.pop("preset", None)
    if preset is not None:
        model = tree.get("model") or {}
        if not isinstance(model, dict):
            raise ConfigError("model: expected a mapping of model keys")
        try:
            tree["model"] = preset_keys(preset, model)
        except ValueError as e:
            raise ConfigError(f"preset: {e}") from None
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e), validation_problems(e)) from None


def format_validation_error(e: ValidationError) -> str:
    """The first error as one line: 'model.heads: must divide d_model=128 (got heads=3)'."""
    return one_line(validation_problems(e))


def one_line(problems: list[tuple[str, str]]) -> str:
    """The first (location, message) as 'loc: msg', with how many more there are."""
    loc, msg = problems[0]
    extra = f" ({len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{loc}: {msg}{extra}" if loc else f"{msg}{extra}"  # a check across sections names its keys itself


UNION_TAGS = {"str", "int", "float", "bool"}  # what a union member adds to an error's location


def location(parts: tuple) -> str:
    """('factors', 'train.lr', 0, 'float') -> 'factors.train.lr[0]': the field path, without the tags
    union members add ('float', 'literal[...]')."""
    loc, previous = "", None
    for part in parts:
        if isinstance(part, int):
            loc += f"[{part}]"
        elif previous == "plugin" or (part not in UNION_TAGS and all(n.isidentifier() for n in part.split("."))):
            loc += f".{part}" if loc else part  # a plug-in's name may hold '-' (model.plugin.learned-alibi)
        previous = part
    return loc


def validation_problems(e: ValidationError) -> list[tuple[str, str]]:
    """Every error as (dotted location, one-line message), the first of each location only: a union
    reports a miss for every member."""
    problems: dict[str, str] = {}
    for err in e.errors():
        loc = location(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown config key"
        elif err["type"] == "literal_error" and plugin_fault(loc.rsplit(".", 1)[-1], err["input"]):
            msg = plugin_fault(loc.rsplit(".", 1)[-1], err["input"])  # an installed plug-in that failed
        elif err["type"].startswith(("literal_error", "greater_than", "less_than", "int_type")):
            msg = f"{msg} (got {err['input']!r})"
        # Model-level checks name the field themselves: 'heads: must divide ...' under 'model'.
        field, sep, rest = msg.partition(": ")
        if sep and field.isidentifier():
            loc, msg = f"{loc}.{field}" if loc else field, rest
        problems.setdefault(loc, msg)
    return list(problems.items())


def load_config(
    path: str | Path | None = None, preset: str | None = None, sets: list[str] | None = None
) -> ExperimentConfig:
    """The `ablate train` entry: YAML file, then --preset, then --set overrides."""
    overrides: dict[str, Any] = {"preset": preset} if preset else {}
    for item in sets or []:
        key, value = parse_override(item)
        overrides[key] = value
    return config_from_tree(read_yaml(path) if path else {}, overrides)


def config_from_tree(
    tree: dict[str, Any], overrides: dict[str, Any], by_hand: bool = True
) -> ExperimentConfig:
    """build_config, refusing a model or task key set by hand that the config ignores (`ablate train`, the
    API): in the overrides, and in the tree unless it is a built config's dump (by_hand False)."""
    cfg = build_config(tree, overrides)
    sections = [section for section in ("model", "task") if by_hand and isinstance(tree.get(section), dict)]
    written = {f"{section}.{key}" for section in sections for key in flatten(tree[section])} | set(overrides)
    ignored = ignored_settings(cfg, written)
    if ignored:
        problems = [(key, f"has no effect ({why})") for key, why in ignored]
        raise ConfigError(one_line(problems), problems)
    return cfg


def ignored_settings(cfg: ExperimentConfig, written: Iterable[str]) -> list[tuple[str, str]]:
    """(key, why) for each dotted key of `written` the configured model or task ignores: a key set by hand
    that changes nothing makes two different-looking configs build one model on the same data."""
    ignored = {**{f"model.{key}": why for key, why in cfg.model.ignored_keys().items()},
               **{f"task.{key}": why for key, why in ignored_task_keys(cfg.task).items()}}  # fmt: skip
    return [(key, ignored[key]) for key in sorted(written) if key in ignored]
