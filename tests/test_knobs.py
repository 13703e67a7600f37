"""Each knob declared once (issue 22 item 6): every `marin` CLI flag and every asset config
field of the code location either comes from a knob (marin_assets/knobs.py) and has exactly the
knob's declared default, or has no default of its own, or is in ALLOWLIST with its reason.

Rules, checked by ``problems`` (the self-checks at the end feed it hand-made duplicates):
(a) a flag or field tagged with a knob ("Cls.field") has the knob's default (and, for an asset
    field, its versioned marker and type), and carries it under the knob's dest/name;
(b) a knob is a knob in one place: its tag names one library dataclass (one class of that name
    declares knobs, under marin_assets/), and one parser or config exposes it at most once;
(c) any other flag or field with a default of its own is in ALLOWLIST (which must not go stale);
(d) a field generated from a library dataclass's field (``dataclass_config``: "module:Cls.field")
    has that field's default, unless it is an ``Override`` that gives its reason. A nested config
    whose value is the run's own (PhaseConfig.base) is still checked: its class's defaults are.
"Its own default" leaves out None, a switch that is off unless given (store_true) and a
repeatable flag that starts empty; an asset field's '' or [] is a value and counts.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic import Field

from marin_assets.cli import build_parser
from marin_assets.knobs import add_flags, knob_info
from marin_assets.orchestration import StageConfig, versioned
from marin_assets.orchestration.knob_configs import Override, dataclass_config, field_default
from marin_assets.orchestration.versioned import planner_of

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = "marin_assets"
DEFINITION_LAYER = ("assets", "jobs", "sensors", "demo")
HOW = "declare it once as a knob of the library config that uses it"

# Flags and asset config fields with a default that is not a knob's: each says why.
ALLOWLIST = {
    "marin telemetry query --format": "output format of the printed rows (csv or json), not a setting of the store",
    "marin cluster gen-jobs --out": "where the stream is written ('-' = stdout): a location",
    "marin export hf --layout": "the output format of the export (auto: the one the model's config maps to), as --format is",
    "ExportConfig.layout": "the output format of export/<run>, as marin export hf --layout is",
    "PhaseConfig.phase": "run plumbing: the phase controller sets the phase of every run (the plan's first is a "
    "default in Python only: Dagster asks for a nested config's required fields)",
    "PhaseConfig.warm_start_version": "run plumbing: the phase controller sets the warm-start artifact's version",
    "PhaseConfig.attempt": "run plumbing: a roll-back bumps it so the retry draws fresh randomness",
    "PhaseConfig.budget_file": "run plumbing: the phase controller names its budget file ('' = none): a location",
    "MixtureConfig.schedule": "the demo's data schedule (weights per step over its datasets), a value of the run",
    "WatchedSourceConfig.directory": "a machine path ('' = the directory the watch variable names): a location",
    "WatchedSourceConfig.expected": "run plumbing: the directory digest the new-file sensor saw",
    "FitConfig.fit_budgets": "which of the ladder's budgets the fit reads ([] = all): a selection of partitions",
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One CLI flag or asset config field, as the rules see it."""

    where: str  # "marin cluster gen-jobs --out" or "PhaseConfig.phase"
    name: str  # flag without dashes, or field name: compared with knob names for a hint
    default: Any
    knob: str | None  # "Cls.field" when generated from a knob
    own_default: bool  # a default of its own (see the module docstring)
    dest_ok: bool = True  # the value lands where the knob's reader looks (argparse dest / field name)
    versioned: bool | None = None  # asset fields only
    annotation: Any = None  # asset fields only
    field_of: str | None = None  # "module:Cls.field" when generated from a library dataclass's field
    override: str | None = None  # why a generated field departs from its library field


# ---- what the code location exposes ------------------------------------------------------


def _switch_off(action: argparse.Action) -> bool:
    switches = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction)
    return isinstance(action, switches) and action.default in (False, True, 0) and action.nargs == 0


def _own_flag_default(action: argparse.Action) -> bool:
    if action.default is None or action.default is argparse.SUPPRESS or _switch_off(action):
        return False
    return not (isinstance(action, argparse._AppendAction) and action.default == [])


def cli_settings(parser: argparse.ArgumentParser, seen: set[int] | None = None) -> list[Setting]:
    """Every flag and positional of ``parser`` and of its subcommands, recursively."""
    seen = set() if seen is None else seen
    if id(parser) in seen:
        return []
    seen.add(id(parser))
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += cli_settings(sub, seen)
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        option = max(action.option_strings, key=len) if action.option_strings else action.dest
        tag = getattr(action, "marin_knob", None)
        out.append(
            Setting(
                f"{parser.prog} {option}",
                option.lstrip("-").replace("-", "_"),
                action.default,
                tag,
                _own_flag_default(action),
                dest_ok=tag is None or action.dest == tag,
            )
        )
    return out


def _is_config(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, dg.Config)


def _nested_matches_its_class(annotation: type, default: Any) -> bool:
    """A nested config's default is its class's own defaults (so its fields' knobs hold), not other values."""
    try:
        return isinstance(default, annotation) and default.model_dump() == annotation().model_dump()
    except Exception:  # the nested class has required fields: its default is a value of its own
        return False


def config_settings(cls: type, prefix: str = "") -> list[Setting]:
    """Every field of an asset config class, recursing into nested configs whose default is their class's;
    a nested config with a value of its own is one setting, and its class's defaults are walked too."""
    out = []
    for name, field in cls.model_fields.items():
        where = f"{prefix or cls.__name__}.{name}"
        if _is_config(field.annotation) and not field.is_required():
            default = field.get_default(call_default_factory=True)
            if _nested_matches_its_class(field.annotation, default):
                out += config_settings(field.annotation, where)
                continue
            out += config_settings(field.annotation)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        out.append(
            Setting(
                where,
                name,
                default,
                extra.get("knob"),
                default is not None,
                versioned=extra.get("versioned"),
                annotation=field.annotation,
                field_of=extra.get("field_of"),
                override=extra.get("override"),
            )
        )
    return out


def asset_config_classes(defs: dg.Definitions) -> list[type]:
    """The config class of every versioned asset, once each."""
    found: dict[int, type] = {}
    for assets_def in defs.resolve_asset_graph().assets_defs:
        planner = planner_of(assets_def)
        if planner is not None and planner.config_cls is not None:
            found.setdefault(id(planner.config_cls), planner.config_cls)
    return list(found.values())


def plain_asset_config_settings(defs: dg.Definitions) -> list[Setting]:
    """Config fields with defaults of assets that are not versioned assets (none today: a new one is checked too)."""
    out = []
    for assets_def in defs.resolve_asset_graph().assets_defs:
        if not assets_def.is_executable:  # reported, never run (checkpoints/demo): no op, no config
            continue
        schema = assets_def.op.config_schema
        if planner_of(assets_def) is not None or schema is None:
            continue
        for name, field in (getattr(schema.as_field().config_type, "fields", None) or {}).items():
            if field.default_provided:
                out.append(Setting(f"{assets_def.op.name}.{name}", name, field.default_value, None, True))
    return out


# ---- where knobs are declared ------------------------------------------------------------


def knob_declarations(roots: Iterable[str]) -> dict[str, dict[str, set[str]]]:
    """{class name: {module: {knob field names}}} of every class body that assigns ``knob(...)``
    (read with ast, so a class no command imports is seen too)."""
    found: dict[str, dict[str, set[str]]] = {}
    for root in roots:
        base = ROOT / root
        for path in sorted(base.rglob("*.py")) if base.is_dir() else [base]:
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                names = {
                    s.target.id
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and _calls_knob(s.value)
                }
                if names:
                    found.setdefault(node.name, {}).setdefault(module, set()).update(names)
    return found


def _calls_knob(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "knob"


def resolve_knob(tag: str, declared: Mapping[str, Mapping[str, set[str]]]):
    """(KnobInfo, "") for a tag declared in one place, else (None, why)."""
    owner, _, name = tag.rpartition(".")
    modules = {m: names for m, names in declared.get(owner, {}).items() if m.startswith(LIBRARY + ".")}
    if len(modules) != 1:
        return None, f"names the knob {tag}, which {len(modules)} library classes named {owner} declare (need exactly 1)"
    module, names = next(iter(modules.items()))
    if name not in names:
        return None, f"names the knob {tag}, but {module}.{owner} declares no knob {name!r}"
    return knob_info(getattr(importlib.import_module(module), owner), name), ""


# ---- the rules -------------------------------------------------------------------------------


def _tagged_problem(s: Setting, declared) -> str | None:
    info, why = resolve_knob(s.knob, declared)
    if info is None:
        return f"{s.where} {why}"
    if s.default != info.default:
        return f"{s.where} defaults to {s.default!r}, but its knob {info.id} declares {info.default!r}: one default per knob"
    if not s.dest_ok:
        return f"{s.where} carries {info.id} under another dest: generate it with marin_assets.knobs.add_flags"
    if s.versioned is not None and s.versioned != info.versioned:
        return f"{s.where} is versioned={s.versioned}, its knob {info.id} versioned={info.versioned}"
    if s.annotation is not None and s.annotation != info.annotation:
        return f"{s.where} is typed {s.annotation!r}, its knob {info.id} {info.annotation!r}"
    return None


def library_field_default(field_of: str) -> Any:
    """The default of the library dataclass field "module:Cls.field" (``dataclasses.MISSING``: none)."""
    module, _, path = field_of.partition(":")
    owner, _, name = path.rpartition(".")
    cls = importlib.import_module(module)
    for part in owner.split("."):
        cls = getattr(cls, part)
    return field_default(next(f for f in dataclasses.fields(cls) if f.name == name))


def _generated_problem(s: Setting) -> str | None:
    if s.override is not None:
        return None if s.override.strip() else f"{s.where} overrides {s.field_of} without a reason"
    library = library_field_default(s.field_of)
    default = None if library is dataclasses.MISSING else library
    if s.default != default:
        return f"{s.where} defaults to {s.default!r}, but {s.field_of} to {default!r}: one default per field (or an Override with its reason)"
    return None


def _untagged_problem(s: Setting, knob_names: Mapping[str, list[str]]) -> str:
    same = knob_names.get(s.name)
    hint = f" (a knob of this name exists: {', '.join(sorted(same))})" if same else ""
    return f"{s.where} has a default of its own, {s.default!r}{hint}: {HOW} (marin_assets/knobs.py) and generate it from that"


def _exposed_twice(settings: list[Setting]) -> list[str]:
    """A knob exposed twice by one parser or one config class."""
    seen: dict[tuple[str, str], str] = {}
    out = []
    for s in settings:
        if s.knob is None:
            continue
        scope = s.where.rsplit(" ", 1)[0] if " " in s.where else s.where.rsplit(".", 1)[0]
        if (scope, s.knob) in seen:
            out.append(f"{s.where} and {seen[scope, s.knob]} both expose the knob {s.knob}: one place each")
        seen.setdefault((scope, s.knob), s.where)
    return out


def problems(settings: list[Setting], allowlist: Mapping[str, str], declared) -> list[str]:
    """Every violation of rules (a)-(c) in ``settings`` (see the module docstring)."""
    knob_names: dict[str, list[str]] = {}
    for owner, modules in declared.items():
        for names in modules.values():
            for name in names:
                knob_names.setdefault(name, []).append(f"{owner}.{name}")
    out, used = [], set()
    for s in settings:
        if s.knob is not None or s.field_of is not None:
            found = _tagged_problem(s, declared) if s.knob is not None else _generated_problem(s)
            if found:
                out.append(found)
        elif s.own_default:
            key = _allowlisted(s.where, allowlist)
            used.add(key)
            if key is None:
                out.append(_untagged_problem(s, knob_names))
    stale = sorted(set(allowlist) - used)
    out += [f"ALLOWLIST names {key}, which has no default of its own (any more): remove it" for key in stale]
    return out + _exposed_twice(settings)


def _allowlisted(where: str, allowlist: Mapping[str, str]) -> str | None:
    """The ALLOWLIST key covering ``where``: itself, or a nested config above it (its whole value is allowlisted)."""
    return next((key for key in allowlist if where == key or where.startswith(key + ".")), None)


# ---- the code location ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def declared():
    return knob_declarations([LIBRARY, *DEFINITION_LAYER, "definitions.py"])


@pytest.fixture(scope="module")
def everything():
    from definitions import defs

    settings = cli_settings(build_parser())
    for cls in asset_config_classes(defs):
        settings += config_settings(cls)
    settings += plain_asset_config_settings(defs)
    return list({s.where: s for s in settings}.values())  # a nested class reached twice is one set of settings


def test_every_flag_and_asset_config_field_has_one_default(everything, declared):
    assert problems(everything, ALLOWLIST, declared) == []


def test_knobs_are_declared_in_the_library_only(declared):
    outside = {owner: sorted(m for m in modules if not m.startswith(LIBRARY + ".")) for owner, modules in declared.items()}
    assert {owner: ms for owner, ms in outside.items() if ms} == {}, "a knob belongs to a library config (marin_assets/)"
    twice = {owner: sorted(modules) for owner, modules in declared.items() if len(modules) > 1}
    assert twice == {}, "two library classes of one name declare knobs: a tag 'Cls.field' would be ambiguous"


def test_the_walk_sees_what_the_issue_names(everything):
    """The converted flags and fields are reached, and tagged with the knob that owns them."""
    tags = {s.where: s.knob for s in everything}
    assert tags["marin scaling fit-isoflop --bootstrap"] == "IsoFlopConfig.bootstrap_n"
    assert tags["FitConfig.bootstrap_n"] == "IsoFlopConfig.bootstrap_n"
    assert tags["marin scaling fit-parametric --bootstrap"] == "ParametricFitConfig.bootstrap_n"
    assert tags["PredictionConfig.sweep.recipe"] == tags["SweepConfig.recipe"] == "SweepSettings.recipe"
    assert tags["EvalConfig.limit"] == "EvalSettings.limit"
    assert tags["marin cluster gen-jobs -n"] == "JobStreamConfig.n"
    assert tags["marin cluster simulate --tick-s"] == "SimulationConfig.tick_s"
    assert tags["marin cluster manifest --namespace"] == "ManifestConfig.namespace"
    assert tags["marin telemetry compact --grace-seconds"] == "CompactionConfig.grace_s"
    assert tags["marin datakit run --validation-fraction"] == "TokenizeConfig.validation_fraction"
    assert "PhaseConfig.phase" in tags and "PhaseConfig.phase.name" not in tags  # a nested value of its own is not walked into


def test_the_phase_configs_are_generated_from_the_library(everything):
    """PhaseConfig's base is walked field by field (its class's defaults are the demo's), its phase's class is
    walked too (the phase is a value of the run): every field is one of PhaseSpec's or TrainConfig's (and nested
    ModelConfig's...), with the library's default or a stated override, the demo's values among them."""
    from assets.run_plan import DEMO_BASE

    generated = {s.where: s.field_of for s in everything if s.field_of}
    assert generated["PhaseSpecConfig.is_cooldown"] == "marin_assets.phases.plan:PhaseSpec.is_cooldown"
    assert generated["PhaseConfig.base.model.d_model"] == "marin_assets.model.config:ModelConfig.d_model"
    assert generated["PhaseConfig.base.schedule.warmup_steps"] == "marin_assets.train.config:ScheduleConfig.warmup_steps"
    assert generated["PhaseConfig.base.num_steps"] == "marin_assets.train.config:TrainConfig.num_steps"
    for prefix in ("PhaseSpecConfig.", "PhaseConfig.base."):  # no hand-written field left in them
        assert [s.where for s in everything if s.where.startswith(prefix) and not s.field_of] == []
    overrides = {s.where.removeprefix("PhaseConfig.base."): s.override for s in everything if s.override}
    demo = {f"{k}.{f}" if isinstance(v, dict) else k for k, v in DEMO_BASE.items() for f in (v if isinstance(v, dict) else [k])}
    assert set(overrides) == {"PhaseSpecConfig.mixture", "model.vocab_size", *demo}
    assert {k: why for k, why in overrides.items() if k in demo} == dict.fromkeys(
        demo, "the demo's value (assets/run_plan.py DEMO_BASE)"
    )


def test_dagster_launches_the_demos_base_config():
    """Dagster builds a nested config's schema from its class (a default instance is ignored): the launchpad's
    and the phase controller's runs get the demo's base only because it is TrainBaseConfig's defaults."""
    from assets.train_base import TrainBaseConfig
    from assets.training import train_phase

    schema = train_phase.op.config_schema.as_field().config_type
    assert schema.fields["base"].default_value == TrainBaseConfig().model_dump() == DEMO_BASE_AS_LAUNCHED


# The demo's whole base config, the library defaults it keeps included: a change of a library default that
# would change the demo's model (and every phase's content version) fails here, not silently.
DEMO_BASE_AS_LAUNCHED = {
    "model": {
        "vocab_size": 0,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "d_ff": 128,
        "n_routed_experts": 4,
        "n_shared_experts": 0,
        "top_k": 2,
        "expert_d_ff": 64,
        "max_seq_len": 64,
        "router_gating": "softmax",
        "balancing": "none",
    },
    "optimizer": {"name": "adamw", "weight_decay": 0.1},
    "schedule": {"kind": "wsd", "peak_lr": 0.003, "warmup_steps": 8, "decay_steps": 8},
    "seq_len": 64,
    "batch_size": 8,
    "num_steps": 48,
    "checkpoint_every_steps": 16,
    "checkpoint_every_seconds": 60.0,
}


def test_the_one_bootstrap_default_is_100(everything):
    defaults = {s.where: s.default for s in everything if s.knob and s.knob.endswith(".bootstrap_n")}
    assert defaults == {
        "marin scaling fit-parametric --bootstrap": 100,
        "marin scaling fit-isoflop --bootstrap": 100,
        "FitConfig.bootstrap_n": 100,
    }


# ---- self-checks: the rules catch hand-written duplicates ---------------------------------


def _fake_parser() -> argparse.ArgumentParser:
    from marin_assets.datakit.tokenize import TokenizeConfig

    parser = argparse.ArgumentParser(prog="marin fake")
    add_flags(parser, TokenizeConfig, ["min_validation_docs"])
    return parser


def test_a_hand_written_duplicate_flag_is_caught(declared):
    parser = _fake_parser()
    parser.add_argument("--validation-fraction", type=float, default=0.05)
    found = problems(cli_settings(parser), {}, declared)
    assert len(found) == 1 and found[0].startswith("marin fake --validation-fraction has a default of its own, 0.05")
    assert "TokenizeConfig.validation_fraction" in found[0] and HOW in found[0]
    assert problems(cli_settings(_fake_parser()), {}, declared) == []  # the generated flag alone passes


def test_a_generated_flag_with_another_default_or_dest_is_caught(declared):
    parser = _fake_parser()
    (action,) = [a for a in parser._actions if getattr(a, "marin_knob", None)]
    action.default = 7
    assert problems(cli_settings(parser), {}, declared) == [
        "marin fake --min-validation-docs defaults to 7, but its knob TokenizeConfig.min_validation_docs declares 1: "
        "one default per knob"
    ]
    action.default, action.dest = 1, "min_validation_docs"
    assert "under another dest" in problems(cli_settings(parser), {}, declared)[0]


def test_a_flag_exposing_a_knob_twice_is_caught(declared):
    from marin_assets.datakit.tokenize import TokenizeConfig

    parser = _fake_parser()
    add_flags(parser, TokenizeConfig, {"min_validation_docs": "min-docs"})
    assert problems(cli_settings(parser), {}, declared) == [
        "marin fake --min-docs and marin fake --min-validation-docs both expose the knob TokenizeConfig.min_validation_docs: "
        "one place each"
    ]


class _HandWritten(StageConfig):
    shard_bytes: int = versioned(123)


class _WrongKnobDefault(StageConfig):
    threshold: float = Field(0.9, json_schema_extra={"versioned": True, "knob": "QualityScoreConfig.threshold"})


class _NoSuchKnob(StageConfig):
    threshold: float = Field(0.0, json_schema_extra={"versioned": True, "knob": "QualityScoreConfig.nope"})


class _Inner(dg.Config):
    threshold: float = Field(0.0, json_schema_extra={"versioned": True, "knob": "QualityScoreConfig.threshold"})


class _NestedOtherValue(StageConfig):
    inner: _Inner = versioned(_Inner(threshold=0.0))
    other: _Inner = versioned(_Inner(threshold=0.3))


def test_hand_written_and_mistagged_asset_fields_are_caught(declared):
    assert problems(config_settings(_HandWritten), {}, declared) == [
        f"_HandWritten.shard_bytes has a default of its own, 123 (a knob of this name exists: ShardingConfig.shard_bytes): "
        f"{HOW} (marin_assets/knobs.py) and generate it from that"
    ]
    assert problems(config_settings(_WrongKnobDefault), {}, declared) == [
        "_WrongKnobDefault.threshold defaults to 0.9, but its knob QualityScoreConfig.threshold declares 0.0: "
        "one default per knob"
    ]
    (why,) = problems(config_settings(_NoSuchKnob), {}, declared)
    assert why.endswith("declares no knob 'nope'")
    # A nested config with its class's defaults is walked into; one with other values is a value of its own
    # (and its class's defaults are walked under the class's name).
    nested = config_settings(_NestedOtherValue)
    assert [s.where for s in nested] == ["_NestedOtherValue.inner.threshold", "_Inner.threshold", "_NestedOtherValue.other"]
    assert [p.split(" has")[0] for p in problems(nested, {}, declared)] == ["_NestedOtherValue.other"]


@dataclasses.dataclass(frozen=True)
class _LibrarySettings:
    width: int = 64
    name: str = "x"


def test_a_generated_field_that_departs_from_its_library_default_is_caught(declared):
    generated = dataclass_config("_Gen", _LibrarySettings, ["width", "name"])
    assert problems(config_settings(generated), {}, declared) == []
    changed = type(
        "_Changed",
        (generated,),
        {
            "__annotations__": {"width": int},
            "width": Field(32, json_schema_extra=dict(generated.model_fields["width"].json_schema_extra)),
        },
    )
    assert problems(config_settings(changed), {}, declared) == [
        f"_Changed.width defaults to 32, but {__name__}:_LibrarySettings.width to 64: one default per field "
        "(or an Override with its reason)"
    ]
    with pytest.raises(ValueError, match=r"\['name'\] are set but not among the fields \['width'\]"):
        dataclass_config("_Unlisted", _LibrarySettings, ["width"], values={"name": "y"}, why="a run's value")
    with pytest.raises(ValueError, match="say why"):
        dataclass_config("_NoReason", _LibrarySettings, ["width"], values={"width": 1})
    silent = dataclass_config("_Silent", _LibrarySettings, ["width"], overrides={"width": Override(int, 0, " ")})
    assert problems(config_settings(silent), {}, declared) == [
        f"_Silent.width overrides {__name__}:_LibrarySettings.width without a reason"
    ]


def test_a_stale_allowlist_entry_is_caught(declared):
    found = problems(cli_settings(_fake_parser()), {"marin fake --gone": "was a flag once"}, declared)
    assert found == ["ALLOWLIST names marin fake --gone, which has no default of its own (any more): remove it"]


def test_a_tag_of_an_ambiguous_owner_is_caught():
    declared = {"Twice": {"marin_assets.a": {"x"}, "marin_assets.b": {"x"}}}
    info, why = resolve_knob("Twice.x", declared)
    assert info is None and "2 library classes named Twice" in why


def test_switches_and_empty_repeatable_flags_have_no_default_of_their_own():
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--eval", action="append", default=[])
    parser.add_argument("--name", default=None)
    parser.add_argument("--format", default="csv")
    assert {s.where: s.own_default for s in cli_settings(parser)} == {
        "p --json": False,
        "p --eval": False,
        "p --name": False,
        "p --format": True,
    }
