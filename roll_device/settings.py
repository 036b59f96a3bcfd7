"""The one idiom in which configuration is typed and read: a frozen pydantic model per config
section (`Section`), owned by the code that consumes it, read once by `read_section`.

A section declares its keys as fields: type, range or choices (`Annotated[..., Field(...)]`) and
a `description` that is printed as the hint after a refused value. The values a run starts from
are the YAML files' (configs/): a field has a default only where no YAML file sets its key. Unknown
keys are refused (`OpenSection` keeps them, for sections that tasks and experiments add keys to).
Numbers are strict (`StrictInt`, `StrictFloat`, `Count`): `true` is not 1, nor "1" a number; an
int is a valid float.
A field validator that refuses a value raises `ValueError` with what is allowed (the key and value
are prefixed); rules that cross keys of one section are its `model_validator`s and raise a
`ConfigError` that names the keys; rules that cross sections belong to the section that holds
them all (the run's configuration).

`read_section(cls, values, "trainer")` returns the checked, immutable section or raises a
`ConfigError` with one line that names the key, the value and what is allowed
(`trainer.lr=-1: input should be greater than 0`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from roll_device.errors import ConfigError, RollDeviceError

Count = Annotated[StrictInt, Field(ge=1)]  # a whole number >= 1 (also sizes in bytes)
NonNegative = Annotated[StrictInt, Field(ge=0)]
Seed = Annotated[
    StrictInt, Field(ge=0, lt=2**32, description="from 0 to 2**32 - 1, the range vLLM and numpy take")
]
# a model's weights as transformers and vLLM load them (auto: the checkpoint's own dtype)
WeightsDtype = Literal["auto", "float32", "bfloat16", "float16"]
S = TypeVar("S", bound=BaseModel)


class Section(BaseModel):
    """A config section: typed, immutable, unknown keys and numbers that are not finite refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no inf, no nan


class OpenSection(BaseModel):
    """A config section other parts add keys to (tasks, experiments): unknown keys are kept."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


def read_section(cls: type[S], values: Any, section: str) -> S:
    """`values` (a mapping, or a section already read) as `cls`, or a one-line ConfigError
    whose keys are prefixed with `section` ("" for the top level)."""
    if isinstance(values, cls):
        return values
    if isinstance(values, BaseModel):
        values = values.model_dump()
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(f"{section or 'the configuration'} must be a mapping of keys, got {values!r}")
    try:
        return cls.model_validate(dict(values or {}))
    except ValidationError as exc:
        raise ConfigError(one_line(exc.errors(include_url=False)[0], cls, section)) from None


def one_line(error: dict, model: type[BaseModel] | None, section: str) -> str:
    """`key=value: what is allowed (why)` for one pydantic error."""
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, RollDeviceError):
        return str(cause)
    loc = [str(part) for part in error["loc"] if not str(part).startswith(("function-", "constrained-"))]
    key = ".".join(filter(None, [section, *loc]))
    if error["type"] == "missing":
        return f"{key} is missing: set it (docs/configuration.md lists every key)"
    if error["type"] == "extra_forbidden":
        keys = _keys_at(model, error["loc"][:-1])
        return f"unknown key {key}: " + (f"the keys here are {', '.join(keys)}" if keys else "remove it")
    message = error["msg"][0].lower() + error["msg"][1:]
    message = message.removeprefix("value error, ")
    hint = _description(model, error["loc"])
    where = f"{key}={error['input']!r}" if loc else section or "the configuration"
    return f"{where}: {message}" + (f" ({hint})" if hint else "")


def _walk(model: type[BaseModel] | None, loc: tuple) -> tuple[Any, Any]:
    """(the field at `loc` under `model` or None, the type found there), through nested
    sections, dict values and the union members pydantic names in a location."""
    current, field = model, None
    for part in map(str, loc):
        if get_origin(current) is dict:
            current, field = get_args(current)[1], None
            continue
        models = _models_in(current)
        named = [m for m in models if m.__name__ == part]
        if named:
            current = named[0]
            continue
        field = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        if field is None:
            return None, None
        current = field.annotation
    return field, current


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The sections an annotation holds (itself, or the members of an Optional or a Union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _keys_at(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    return [key for m in _models_in(_walk(model, loc)[1]) for key in m.model_fields]


def _description(model: type[BaseModel] | None, loc: tuple) -> str | None:
    field = _walk(model, loc)[0]
    return None if field is None else field.description


def takes_new_key(cls: Any, parts: list[str]) -> bool:
    """Whether a section of type `cls` accepts the key at the path `parts` although no field
    names it: the key lies inside an open section or a free mapping (`+key=value` adds it)."""
    if get_origin(cls) is Annotated:
        return takes_new_key(get_args(cls)[0], parts)
    if get_origin(cls) in (Union, UnionType):
        return any(takes_new_key(option, parts) for option in get_args(cls))
    if isinstance(cls, type) and issubclass(cls, OpenSection):
        return True
    if get_origin(cls) is dict or cls is dict:
        return True
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or len(parts) < 2:
        return False
    field = cls.model_fields.get(parts[0])
    return field is not None and takes_new_key(field.annotation, parts[1:])
