"""Knobs: every tunable setting declared once, on the library config that uses it.

A knob is a field of a library config dataclass declared with ``knob(default, help=...)``.
What exposes it is generated from that declaration, never written again by hand:

- the Dagster asset config field (``marin_assets.orchestration.knob_configs.stage_config``),
- the ``marin`` CLI flag (``add_flags``), whose parsed value goes back into the same dataclass,
- run specs, which carry the library configs themselves.

So a knob has one default, and ``tests/test_knobs.py`` walks every CLI flag and asset config
field to check it. ``versioned=True`` (the default) says the knob changes what is computed, so
it enters the content version of the artifacts that use it (Marin's executor marks such fields
explicitly too); ``versioned=False`` marks knobs that only change how the work runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

KNOB = "marin.knob"


@dataclasses.dataclass(frozen=True)
class KnobInfo:
    """One knob: where it is declared, its default and what it means."""

    owner: type
    name: str
    default: Any
    help: str
    versioned: bool
    annotation: Any

    @property
    def id(self) -> str:
        return f"{self.owner.__name__}.{self.name}"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def knob(default: Any, *, help: str, versioned: bool = True) -> Any:
    """A dataclass field that is a knob (see the module docstring). Mutable defaults (lists)
    are copied per instance."""
    metadata = {KNOB: {"help": help, "versioned": versioned}}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def knobs_of(cls: type) -> dict[str, KnobInfo]:
    """Every knob of a library config dataclass, by field name, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(KNOB)
        if meta is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out[f.name] = KnobInfo(cls, f.name, default, meta["help"], meta["versioned"], hints[f.name])
    return out


def knob_info(cls: type, name: str) -> KnobInfo:
    found = knobs_of(cls).get(name)
    if found is None:
        raise KeyError(f"{cls.__name__}.{name} is not a knob (declare it with marin_assets.knobs.knob)")
    return found


def _scalar_type(annotation: Any) -> type:
    """int/float/str/bool for a flag; ``X | None`` counts as X."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if base not in (int, float, str, bool):
        raise TypeError(f"a CLI flag needs an int, float, str or bool knob, got {annotation!r}")
    return base


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    names: Iterable[str] | Mapping[str, str],
    *,
    float_type: Callable[[str], float] = float,
) -> None:
    """One flag per knob of ``cls`` (``names``, or {knob: flag name} to rename a flag; a name that
    starts with "-" is the option as given, e.g. "-n"), typed, defaulted and documented by the
    declaration. ``float_type`` parses float knobs (a command whose float flags refuse nan and inf
    at parse time passes ``marin_assets.cli._types.finite_float``). The value lands in ``args``
    under the knob's id (``from_flags`` reads it back), and each argparse action records its knob
    in ``action.marin_knob`` (what tests/test_knobs.py reads)."""
    renames = dict(names) if isinstance(names, Mapping) else {n: n.replace("_", "-") for n in names}
    for name, flag in renames.items():
        info = knob_info(cls, name)
        kind = _scalar_type(info.annotation)
        shown = "none" if info.default is None else info.default
        option = flag if flag.startswith("-") else f"--{flag}"
        common = {"dest": info.id, "default": info.default, "help": f"{info.help} (default: {shown})"}
        if kind is bool:
            action = parser.add_argument(option, action=argparse.BooleanOptionalAction, **common)
        else:
            parse = float_type if kind is float else kind
            action = parser.add_argument(option, type=parse, metavar=kind.__name__.upper(), **common)
        action.marin_knob = info.id  # type: ignore[attr-defined]


def from_flags(args: argparse.Namespace, cls: type, **fixed: Any) -> Any:
    """``cls`` built from the flags ``add_flags`` made for it (plus ``fixed`` fields); the
    dataclass's own checks run, so a bad value fails here, before any work."""
    given = vars(args)
    values = {name: given[info.id] for name, info in knobs_of(cls).items() if info.id in given}
    return cls(**{**values, **fixed})
