"""Dagster asset configs generated from the library's knobs (marin_assets/knobs.py).

    QualityConfig = stage_config("QualityConfig", (QualityScoreConfig, ["threshold"]))

gives a ``StageConfig`` whose ``threshold`` field has the library's default, help and
versioned marker, and records the knob it came from (``json_schema_extra["knob"]``), so the
UI's launchpad, the asset's content version and ``marin datakit run --quality-threshold``
all read one declaration. ``library_config`` turns the Dagster config back into the
library dataclass (whose own checks then run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
