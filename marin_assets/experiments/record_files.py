"""Reading an experiment record: ``experiments/<name>.yaml`` (the format is record.py's docstring) into an
``ExperimentRecord`` (``load_record``, ``record_from_dict``), or only what the code location lists
(``record_outline``, which builds no TrainConfig). Every error names the file and the field."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from marin_assets.config_files import load_structured
from marin_assets.experiments.record import (
    BASELINE,
    DEFAULT_DATA_FILES,
    Amendment,
    Arm,
    Check,
    Criterion,
    ExperimentRecord,
    ScheduleScaling,
    _finite,
    _mapping,
    _seeds,
    _yaml_number,
    merge,
    validate_name,
)
from marin_assets.train.config import config_from_dict, config_to_dict

_TOP_FIELDS = (
    "name",
    "hypothesis",
    "links",
    "baseline",
    "budgets",
    "seeds",
    "arms",
    "criterion",
    "schedule",
    "validation_windows",
    "bootstrap",
    "data_files",
    "amendments",
)


def _amendments(value: Any, source: str) -> tuple[Amendment, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{source}: amendments must be a list of {{date, reason}}, got {value!r}")
    out = []
    for i, spec in enumerate(value):
        where = f"{source}: amendments[{i}]"
        spec = _mapping(spec, where)
        if set(spec) != {"date", "reason"}:
            raise ValueError(f"{where}: needs exactly the fields ['date', 'reason'], got {sorted(spec)}")
        date = spec["date"]  # YAML reads an unquoted 2026-11-30 as a date
        if isinstance(date, datetime.date) and not isinstance(date, datetime.datetime):
            date = date.isoformat()
        try:
            out.append(Amendment(date, spec["reason"]))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return tuple(out)


_PER_RUN = {"num_steps", "seed", "data_seed"}
_PER_RUN_SCHEDULE = {"total_steps", "warmup_steps", "decay_steps"}


def _check_change(change: Mapping[str, Any], where: str) -> None:
    fixed = sorted(_PER_RUN & set(change)) + sorted(
        f"schedule.{k}" for k in _PER_RUN_SCHEDULE & set(_mapping(change.get("schedule"), f"{where}.schedule"))
    )
    if fixed:
        raise ValueError(
            f"{where}: {fixed} are set per run (steps from the budget, seeds from the seed list, "
            "warmup/decay from the record's schedule fractions); change those instead"
        )


def _baseline(spec: Any, base_dir: Path, source: str) -> dict:
    spec = _mapping(spec, f"{source}: baseline")
    unknown = sorted(set(spec) - {"config", "override"})
    if unknown:
        raise ValueError(f"{source}: baseline: unknown field(s) {unknown}; allowed: ['config', 'override']")
    config = spec.get("config")
    if isinstance(config, str):
        path = (base_dir / config).resolve()
        if not path.is_file():
            raise ValueError(f"{source}: baseline.config {config!r}: no such file {path}")
        config = load_structured(path) or {}
    data = merge(_mapping(config, f"{source}: baseline.config"), _mapping(spec.get("override"), f"{source}: baseline.override"))
    resolved = config_to_dict(config_from_dict(data, where=f"{source}: baseline"))
    if "vocab_size" not in _mapping(data.get("model"), f"{source}: baseline model"):
        del resolved["model"]["vocab_size"]  # unset: the corpus's vocabulary, filled per run (train_config)
    return resolved


def _budgets(budgets: Any, source: str) -> tuple[float, ...]:
    if not isinstance(budgets, (list, tuple)):
        raise ValueError(f"{source}: budgets must be a list of FLOP counts, got {budgets!r}")
    return tuple(_finite(_yaml_number(b), f"{source}: budgets[{i}]") for i, b in enumerate(budgets))


def _int_field(data: Mapping[str, Any], key: str, default: int, source: str) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{source}: {key} must be an int, got {value!r}")
    return value


def _read_yaml(path: Path) -> Any:
    try:
        return load_structured(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the experiment record: {e}") from None


@dataclasses.dataclass(frozen=True)
class RecordOutline:
    """What the code location needs to list a record's assets (name, hypothesis, every run's
    (arm, budget, seed)), read without building any TrainConfig: that would import jax into
    every process that loads the definitions. The full record is validated when a run starts."""

    name: str
    hypothesis: str
    runs: tuple[tuple[str, float, int], ...]  # (arm, budget, seed), baseline first, in plan order
    data_files: int = DEFAULT_DATA_FILES  # the corpus the runs read (the code location materialises it)


def record_outline(path: str | Path) -> RecordOutline:
    path = Path(path)
    source = str(path)
    data = _mapping(_read_yaml(path), source)
    for required in ("name", "hypothesis", "budgets", "seeds", "arms"):
        if required not in data:
            raise ValueError(f"{source}: missing required field {required!r}")
    name = validate_name(data["name"], f"{source}: name")
    if name != path.stem:
        raise ValueError(f"{path}: name {name!r} must equal the file name {path.stem!r}")
    if not isinstance(data["hypothesis"], str):
        raise ValueError(f"{source}: hypothesis must be a string")
    budgets = _budgets(data["budgets"], source)
    arms = [(BASELINE, _seeds(data["seeds"], f"{source}: seeds"))]
    for arm, spec in _mapping(data["arms"], f"{source}: arms").items():
        spec = _mapping(spec, f"{source}: arms.{arm}")
        seeds = _seeds(spec["seeds"], f"{source}: arms.{arm}.seeds") if "seeds" in spec else arms[0][1]
        arms.append((validate_name(arm, f"{source}: arm name"), seeds))
    return RecordOutline(
        name,
        data["hypothesis"],
        tuple((a, b, s) for a, seeds in arms for b in budgets for s in seeds),
        _int_field(data, "data_files", DEFAULT_DATA_FILES, source),
    )


def record_from_dict(data: Any, base_dir: str | Path = ".", source: str = "<inline>") -> ExperimentRecord:
    """Validate a parsed record; every error names ``source`` and the field."""
    data = _mapping(data, source)
    unknown = sorted(set(data) - set(_TOP_FIELDS))
    if unknown:
        raise ValueError(f"{source}: unknown field(s) {unknown}; allowed: {list(_TOP_FIELDS)}")
    for required in ("name", "hypothesis", "baseline", "budgets", "seeds", "arms", "criterion"):
        if required not in data:
            raise ValueError(f"{source}: missing required field {required!r}")
    name = validate_name(data["name"], f"{source}: name")
    budgets = _budgets(data["budgets"], source)
    seeds = _seeds(data["seeds"], f"{source}: seeds")
    arms = []
    for arm_name, spec in _mapping(data["arms"], f"{source}: arms").items():
        where = f"{source}: arms.{arm_name}"
        validate_name(arm_name, f"{source}: arm name")
        spec = _mapping(spec, where)
        unknown = sorted(set(spec) - {"change", "seeds", "expect"})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: ['change', 'expect', 'seeds']")
        arm_seeds = _seeds(spec["seeds"], f"{where}.seeds") if "seeds" in spec else seeds
        _check_change(_mapping(spec.get("change"), f"{where}.change"), f"{where}.change")
        arms.append(
            Arm(
                arm_name,
                _mapping(spec.get("change"), f"{where}.change"),
                arm_seeds,
                tuple(Check.parse(arm_name, spec.get("expect"), f"{where}.expect")),
            )
        )
    crit = _mapping(data["criterion"], f"{source}: criterion")
    unknown = sorted(set(crit) - {"statement", "checks"})
    if unknown:
        raise ValueError(f"{source}: criterion: unknown field(s) {unknown}; allowed: ['checks', 'statement']")
    checks = []
    for i, spec in enumerate(crit.get("checks") or []):
        spec = _mapping(spec, f"{source}: criterion.checks[{i}]")
        arm = spec.pop("arm", None)
        if not isinstance(arm, str):
            raise ValueError(f"{source}: criterion.checks[{i}] needs an 'arm'")
        checks += Check.parse(arm, spec, f"{source}: criterion.checks[{i}]")
    statement = crit.get("statement")
    if not isinstance(statement, str):
        raise ValueError(f"{source}: criterion.statement must be a string")
    hypothesis = data["hypothesis"]
    if not isinstance(hypothesis, str):
        raise ValueError(f"{source}: hypothesis must be a string")
    schedule = _mapping(data.get("schedule"), f"{source}: schedule")
    unknown = sorted(set(schedule) - {"warmup_fraction", "decay_fraction"})
    if unknown:
        raise ValueError(f"{source}: schedule: unknown field(s) {unknown}")
    ints = {
        key: _int_field(data, key, default, source)
        for key, default in (("validation_windows", 64), ("bootstrap", 1000), ("data_files", DEFAULT_DATA_FILES))
    }
    links = _mapping(data.get("links"), f"{source}: links")
    return ExperimentRecord(
        name=name,
        hypothesis=hypothesis,
        links=links,
        baseline=_baseline(data["baseline"], Path(base_dir), source),
        budgets=budgets,
        seeds=seeds,
        arms=tuple(arms),
        criterion=Criterion(statement, tuple(checks)),
        schedule=ScheduleScaling(**{k: _finite(v, f"{source}: schedule.{k}") for k, v in schedule.items()}),
        amendments=_amendments(data.get("amendments"), source),
        source=source,
        **ints,
    )


def load_record(path: str | Path) -> ExperimentRecord:
    """Read and validate ``experiments/<name>.yaml``; ``name`` must equal the file's stem."""
    path = Path(path)
    record = record_from_dict(_read_yaml(path), base_dir=path.parent, source=str(path))
    if record.name != path.stem:
        raise ValueError(f"{path}: name {record.name!r} must equal the file name {path.stem!r}")
    return record
