"""Dagster asset configs generated from the library's knobs (marin_assets/knobs.py).

    QualityConfig = stage_config("QualityConfig", (QualityScoreConfig, ["threshold"]))

gives a ``StageConfig`` whose ``threshold`` field has the library's default, help and
versioned marker, and records the knob it came from (``json_schema_extra["knob"]``), so the
UI's launchpad, the asset's content version and ``marin datakit run --quality-threshold``
all read one declaration. ``library_config`` turns the Dagster config back into the
library dataclass (whose own checks then run).

A config that mirrors a whole library dataclass (a phase, a base train config) is generated from
its fields the same way:

    PhaseSpecConfig = dataclass_config("PhaseSpecConfig", PhaseSpec, [f.name for f in fields(PhaseSpec)])

Each field keeps the dataclass's type and default and records where it came from
(``json_schema_extra["field_of"]``: "module:Class.field"); a field that must depart from the
library (a value only the config layer understands) says so with an ``Override`` and its reason.
tests/test_knobs.py holds every generated field to its source's default.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import dagster as dg
import pydantic
from pydantic import Field

from marin_assets.knobs import knob_info
from marin_assets.orchestration.versioned import StageConfig

KnobSource = tuple[type, Sequence[str] | Mapping[str, str]]  # (library config, knob names or {knob: field name})


def _names(names: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    return dict(names) if isinstance(names, Mapping) else {n: n for n in names}


def stage_config(name: str, *sources: KnobSource, base: type[StageConfig] = StageConfig, doc: str = "") -> type[StageConfig]:
    """A StageConfig subclass with one field per knob of ``sources`` (see the module docstring)."""
    fields: dict[str, Any] = {}
    for cls, names in sources:
        for knob_name, field_name in _names(names).items():
            info = knob_info(cls, knob_name)
            extra = {"versioned": info.versioned, "knob": info.id}
            default = info.default
            if isinstance(default, (list, dict)):
                field = Field(default_factory=lambda d=default: type(d)(d), description=info.help, json_schema_extra=extra)
            else:
                field = Field(default, description=info.help, json_schema_extra=extra)
            if field_name in fields:
                raise ValueError(f"{name}: two knobs map to the field {field_name!r}")
            fields[field_name] = (info.annotation, field)
    model = pydantic.create_model(name, __base__=base, **fields)
    model.__doc__ = doc or f"Knobs of {', '.join(cls.__name__ for cls, _ in sources)} (marin_assets/knobs.py)."
    return model


def library_config(config: StageConfig, cls: type, names: Sequence[str] | Mapping[str, str] | None = None, **fixed: Any) -> Any:
    """The library dataclass ``cls`` from the knob fields of ``config`` (every field that
    came from a knob of ``cls`` unless ``names`` says which), plus ``fixed`` fields."""
    values = {}
    mapping = _names(names) if names is not None else None
    for field_name, info in type(config).model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        knob = extra.get("knob", "")
        owner, _, knob_name = str(knob).rpartition(".")
        if owner != cls.__name__:
            continue
        if mapping is not None and mapping.get(knob_name) != field_name:
            continue
        values[knob_name] = getattr(config, field_name)
    return cls(**{**values, **fixed})


@dataclasses.dataclass(frozen=True)
class Override:
    """A generated field that departs from its library field: its type and default, and why."""

    annotation: Any
    default: Any
    reason: str


class DataclassConfig(dg.Config):
    """The base of a ``dataclass_config``: ``of`` builds one from the library value it mirrors."""

    @classmethod
    def of(cls, value: Any) -> Any:
        """This config holding ``value``'s fields (a nested config from the nested dataclass)."""
        fields = {}
        for name, info in cls.model_fields.items():
            item = getattr(value, name)
            if isinstance(info.annotation, type) and issubclass(info.annotation, DataclassConfig):
                item = info.annotation.of(item)
            elif isinstance(item, Mapping):
                item = dict(item)
            fields[name] = item
        return cls(**fields)


def dataclass_config(
    name: str,
    cls: type,
    fields: Sequence[str],
    *,
    nested: Mapping[str, type[DataclassConfig]] | None = None,
    overrides: Mapping[str, Override] | None = None,
    values: Mapping[str, Any] | None = None,
    why: str = "",
) -> Any:  # a DataclassConfig subclass; Any, as its fields exist only at run time (a type checker cannot see them)
    """A Dagster config with the library dataclass ``cls``'s ``fields``: its types and defaults (a
    field without a default is required), ``nested`` configs for dataclass-typed fields (their class
    defaults), ``overrides`` where the config layer means something the dataclass does not, and
    ``values``: a run's own defaults (the demo's), each an override for the reason ``why``.

    A run's values must be class defaults: Dagster builds a nested config's schema from its class and
    ignores a default instance (``base: TrainBaseConfig = TrainBaseConfig(d_model=32)`` launches 64)."""
    nested, overrides, values = nested or {}, dict(overrides or {}), values or {}
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(by_name))
    if unknown:
        raise ValueError(f"{name}: {cls.__name__} has no field(s) {unknown}")
    unlisted = sorted((set(nested) | set(overrides) | set(values)) - set(fields))
    if unlisted:
        raise ValueError(f"{name}: {unlisted} are set but not among the fields {list(fields)}")
    hints = typing.get_type_hints(cls)
    if values and not why.strip():
        raise ValueError(f"{name}: values {sorted(values)} depart from {cls.__name__}'s defaults: say why")
    for field_name, value in values.items():
        overrides.setdefault(field_name, Override(_config_type(hints[field_name]), value, why))
    out: dict[str, Any] = {}
    for field_name in fields:
        extra: dict[str, Any] = {"field_of": f"{cls.__module__}:{cls.__qualname__}.{field_name}"}
        if field_name in nested:
            out[field_name] = (nested[field_name], pydantic.Field(nested[field_name](), json_schema_extra=extra))
        elif field_name in overrides:
            o = overrides[field_name]
            out[field_name] = (
                o.annotation,
                pydantic.Field(o.default, description=o.reason, json_schema_extra=extra | {"override": o.reason}),
            )
        else:
            out[field_name] = (_config_type(hints[field_name]), _library_default(by_name[field_name], extra))
    model = pydantic.create_model(name, __base__=DataclassConfig, **out)
    model.__doc__ = f"{cls.__name__}'s fields ({cls.__module__}), as Dagster config."
    return model


def field_default(field: dataclasses.Field) -> Any:
    """A dataclass field's default (``dataclasses.MISSING`` when it has none)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _library_default(field: dataclasses.Field, extra: dict[str, Any]) -> Any:
    default = field_default(field)
    if default is dataclasses.MISSING:
        return pydantic.Field(json_schema_extra=extra)
    if isinstance(default, (list, dict)):
        return pydantic.Field(default_factory=lambda d=default: type(d)(d), json_schema_extra=extra)
    return pydantic.Field(default, json_schema_extra=extra)


def _config_type(hint: Any) -> Any:
    """A library type as Dagster config takes it: a Mapping is a dict, a Literal of strings a str (the
    dataclass checks the value when the config becomes one)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1:
            raise TypeError(f"a Literal of one type becomes config, not {hint!r}")
        return kinds.pop()
    if origin in (Mapping, dict):
        if not args:
            return dict
        key, value = (_config_type(a) for a in args)
        return dict[key, value]
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, (_config_type(a) for a in args))
    return hint
