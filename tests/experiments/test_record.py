"""Experiment records: the shipped screen parses; bad records fail naming file and field."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.experiments.record import validate_name
from marin_assets.experiments.record_files import load_record, record_from_dict
from marin_assets.experiments.runs import parse_partition_key, partition_key, plan_runs, run_spec
from tests.support.byte_tokens import VOCAB_SIZE
from tests.support.configs import SCREEN_MODEL

ROOT = Path(__file__).resolve().parents[2]
SCREEN = ROOT / "experiments" / "screen_tiny_moe.yaml"

RECORD = {
    "name": "tiny",
    "hypothesis": "a change does nothing",
    "links": {"issue": 14},
    "baseline": {
        "config": {
            "model": SCREEN_MODEL,
            "seq_len": 16,
            "batch_size": 4,
            "schedule": {"kind": "constant", "warmup_steps": 2, "peak_lr": 0.003},
        }
    },
    "budgets": [1e7, 2e7, 4e7],
    "seeds": [0, 1],
    "arms": {"wider_lr": {"change": {"schedule": {"peak_lr": 0.006}}, "expect": {"ci_contains": 1.0}}},
    "criterion": {"statement": "wider_lr is within noise", "checks": [{"arm": "wider_lr", "ci_contains": 1.0}]},
}


def test_the_screen_record_has_six_ideas_and_two_controls():
    record = load_record(SCREEN)
    names = [a.name for a in record.arms]
    assert names == [
        "partial_rope",
        "no_qk_norm",
        "no_shared_expert",
        "top1",
        "muon",
        "zloss_high",
        "control_seed",
        "control_harm",
    ]
    control_seed, control_harm = record.arm("control_seed"), record.arm("control_harm")
    assert control_seed.change == {} and set(control_seed.seeds).isdisjoint(record.seeds)
    assert [(c.kind, c.value) for c in control_seed.expect] == [("ci_contains", 1.0)]
    assert [(c.kind, c.value) for c in control_harm.expect] == [("ci_high_below", 1.0)]
    # 30x the baseline's learning rate, and the ideas' changes reach the TrainConfig.
    assert record.train_config("control_harm").schedule.peak_lr == pytest.approx(
        30 * record.train_config("baseline").schedule.peak_lr
    )
    assert record.train_config("partial_rope").model.rope_fraction == 0.5
    assert record.train_config("no_qk_norm").model.qk_norm is False
    assert record.train_config("top1").model.top_k == 1
    assert record.train_config("muon").optimizer.name == "muon"
    assert record.links == {"issue": 14, "wandb_project": "marin-assets-screens"}
    # Amended after the first run (2 seeds left control_harm inconclusive): 3 seeds, dated.
    assert control_harm.seeds == (0, 1, 2)
    assert [a.date for a in record.amendments] == ["2026-11-30", "2026-12-01"]
    assert "control_harm with 2 seeds was inconclusive, ci_high 1.049" in record.amendments[0].reason
    # Amended when the corpus became the DataKit dataset (issue 22): the vocabulary is the dataset's.
    assert "the corpus is now the DataKit dataset" in record.amendments[1].reason
    assert "vocab_size" not in record.baseline["model"] and "vocab_size" not in record.frozen()["baseline"]["model"]
    runs = plan_runs(record, VOCAB_SIZE)
    assert {r.config.model.vocab_size for r in runs} == {VOCAB_SIZE}
    assert len(runs) == 3 * (3 + 3 + 3 + 2 * 6) and len({r.key for r in runs}) == len(runs)
    # top-1 is cheaper per token, so the same budget buys it more steps.
    steps = {(r.arm, r.budget): r.config.num_steps for r in runs}
    assert steps[("top1", 7.5e9)] > steps[("baseline", 7.5e9)]
    assert all(abs(r.flops - r.budget) / r.budget < 0.02 for r in runs)


def test_the_vocabulary_is_the_corpus_s_unless_the_record_sets_it():
    unset = copy.deepcopy(RECORD)
    del unset["baseline"]["config"]["model"]["vocab_size"]
    record = record_from_dict(unset)
    assert "vocab_size" not in record.frozen()["baseline"]["model"]  # the lock freezes "the corpus's", not a number
    assert run_spec(record, "baseline", 4e7, 0, 300).config.model.vocab_size == 300
    explicit = record_from_dict(RECORD)  # SCREEN_MODEL names 257
    assert explicit.frozen()["baseline"]["model"]["vocab_size"] == VOCAB_SIZE
    assert run_spec(explicit, "baseline", 4e7, 0, 200).config.model.vocab_size == VOCAB_SIZE  # a larger model is fine
    with pytest.raises(ValueError, match=r"tiny.yaml: arm 'baseline': model.vocab_size 257 is below the corpus's vocabulary 300"):
        run_spec(record_from_dict(RECORD, source="tiny.yaml"), "baseline", 4e7, 0, 300)


def test_a_minimal_record_round_trips():
    record = record_from_dict(RECORD)
    assert record.budgets == (1e7, 2e7, 4e7) and record.seeds == (0, 1)
    assert [a.name for a in record.all_arms()] == ["baseline", "wider_lr"]
    assert record.train_config("wider_lr").schedule.peak_lr == 0.006


def _with(path: str, value, base=RECORD) -> dict:
    data = copy.deepcopy(base)
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[k]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("budgets", [1e7, float("nan"), 4e7], r"budgets\[1\] must be finite"),
        ("budgets", [1e7, 2e7], ">= 3 budgets"),
        ("budgets", [2e7, 1e7, 4e7], "distinct and increasing"),
        ("budgets", "1e7", "budgets must be a list"),
        ("seeds", [0], ">= 2 baseline seeds"),
        ("seeds", [0, 0], "seeds repeat"),
        ("seeds", [0, -1], "seed -1 is not an int >= 0"),
        ("hypothesis", "  ", "hypothesis must be a non-empty string"),
        ("hypothesis", _DELETE, "missing required field 'hypothesis'"),
        ("name", "../etc", "name '../etc' must match"),
        ("name", "Screen-1", "must match"),
        ("name", "ok\n", "must match"),
        ("arms.bad-name", {"change": {}}, "arm name 'bad-name' must match"),
        ("arms.baseline", {"change": {}}, "reserved for the baseline"),
        ("arms.a", {"change": {"num_steps": 5}}, r"arms.a.change: \['num_steps'\] are set per run"),
        ("arms.a", {"change": {"schedule": {"warmup_steps": 5}}}, r"schedule.warmup_steps"),
        ("arms.a", {"change": {"model": {"top_k": 9}}}, "arm 'a': invalid config: .*top_k"),
        ("arms.a", {"change": {"model": {"rope_fraction": 1.5}}}, "rope_fraction must be in"),
        ("arms.a", {"chnage": {}}, r"arms.a: unknown field\(s\) \['chnage'\]"),
        ("arms.a", {"expect": {"ci_above": 1.0}}, r"unknown check\(s\) \['ci_above'\]"),
        ("arms.a", {"expect": {"ci_contains": float("inf")}}, "ci_contains must be finite"),
        ("criterion.checks", [{"arm": "nope", "ci_contains": 1.0}], "names unknown arm 'nope'"),
        ("criterion.statement", "", "criterion.statement must be a non-empty string"),
        ("bootstrap", 5, "bootstrap >= 10"),
        ("extra", 1, r"unknown field\(s\) \['extra'\]"),
        ("amendments", {"date": "2026-11-30", "reason": "x"}, "amendments must be a list"),
        ("amendments", [{"date": "2026-11-30"}], r"amendments\[0\]: needs exactly the fields \['date', 'reason'\]"),
        ("amendments", [{"date": "2026-11-30", "reason": "x", "by": "me"}], r"amendments\[0\]: needs exactly"),
        ("amendments", [{"date": "30.11.2026", "reason": "x"}], r"amendments\[0\]: .*ISO date YYYY-MM-DD"),
        ("amendments", [{"date": "2026-02-30", "reason": "x"}], r"amendments\[0\]: .*not a calendar date"),
        ("amendments", [{"date": "2026-11-30", "reason": "  "}], r"amendments\[0\]: .*reason must be a non-empty"),
        ("amendments", [{"date": "2026-11-30\n", "reason": "x"}], r"ISO date"),
    ],
)
def test_bad_records_name_the_field(path, value, message):
    with pytest.raises(ValueError, match=message):
        record_from_dict(_with(path, value), source="exp.yaml")


def test_bad_baseline_files_are_named(tmp_path):
    data = _with("baseline", {"config": "missing.yaml"})
    with pytest.raises(ValueError, match="exp.yaml: baseline.config 'missing.yaml': no such file"):
        record_from_dict(data, base_dir=tmp_path, source="exp.yaml")
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(_with("name", "other")))
    with pytest.raises(ValueError, match="name 'other' must equal the file name 'tiny'"):
        load_record(tmp_path / "tiny.yaml")
    (tmp_path / "broken.yaml").write_text("name: [unclosed")
    with pytest.raises(ValueError, match=r"broken\.yaml:1:16: invalid YAML: ") as err:
        load_record(tmp_path / "broken.yaml")
    assert "\n" not in str(err.value)


def test_amendments_are_read_from_yaml_dates_or_strings(tmp_path):
    data = _with("amendments", [{"date": "2026-11-30", "reason": "more seeds for a control"}])
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data).replace("'2026-11-30'", "2026-11-30"))
    assert "date: 2026-11-30\n" in (tmp_path / "tiny.yaml").read_text()  # unquoted: YAML reads a date
    record = load_record(tmp_path / "tiny.yaml")
    assert [(a.date, a.reason) for a in record.amendments] == [("2026-11-30", "more seeds for a control")]
    assert record_from_dict(RECORD).amendments == ()


def test_yaml_exponents_without_sign_are_numbers(tmp_path):
    text = yaml.safe_dump(RECORD).replace("10000000.0", "1e7").replace("20000000.0", "2e7").replace("40000000.0", "4e7")
    assert "1e7" in text
    (tmp_path / "tiny.yaml").write_text(text)
    assert load_record(tmp_path / "tiny.yaml").budgets == (1e7, 2e7, 4e7)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_names_are_safe_identifiers_or_refused(text):
    try:
        name = validate_name(text, "arm name")
    except ValueError as e:
        assert "must match" in str(e) or "invalid arm name" in str(e)
        return
    assert name == text and "/" not in name and "-" not in name and ".." not in name and "\n" not in name
    assert name[0].isalpha() and name.islower() or name[0].isalpha()


@settings(max_examples=200, deadline=None)
@given(
    st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
    st.floats(min_value=1e3, max_value=1e25, allow_nan=False),
    st.integers(0, 10**6),
)
def test_partition_keys_round_trip(arm, budget, seed):
    key = partition_key(arm, budget, seed)
    parsed_arm, parsed_budget, parsed_seed = parse_partition_key(key)
    assert (parsed_arm, parsed_seed) == (arm, seed)
    assert math.isclose(parsed_budget, budget, rel_tol=0.06)  # two significant digits
    assert not any(c in key for c in "|,[]") and "..." not in key


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(), st.integers(-5, 10**12), st.text(max_size=8), st.none()), max_size=5))
def test_any_budget_list_is_accepted_only_when_valid(budgets):
    try:
        record = record_from_dict(_with("budgets", budgets))
    except ValueError:
        return
    assert len(record.budgets) >= 3 and all(math.isfinite(b) and b > 0 for b in record.budgets)
    assert list(record.budgets) == sorted(set(record.budgets))


def test_partition_key_errors():
    for bad in ("muon", "muon-C1e10", "muon-X1e10-s1", "Muon-C1e10-s1", "muon-C1e10-sx"):
        with pytest.raises(ValueError, match="is not of the form <arm>-C<budget>-s<seed>"):
            parse_partition_key(bad)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "date": st.one_of(st.dates().map(str), st.text(max_size=12), st.dates(), st.none()),
                "reason": st.one_of(st.text(max_size=20), st.integers()),
            }
        ),
        max_size=3,
    )
)
def test_any_amendment_list_is_accepted_only_when_valid(amendments):
    import datetime

    try:
        record = record_from_dict(_with("amendments", amendments))
    except ValueError as e:
        assert "amendments[" in str(e)
        return
    assert len(record.amendments) == len(amendments)
    for a in record.amendments:
        assert datetime.date.fromisoformat(a.date).isoformat() == a.date and a.reason.strip()
