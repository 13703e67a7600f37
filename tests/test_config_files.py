"""load_structured: repeated keys and alias bombs are refused with one line naming file:line:column;
merge keys and ordinary anchors still load, with the precedence the merge-key spec gives."""

from __future__ import annotations

import json
import re
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.config_files import MAX_ALIASED_NODES, load_structured
from marin_assets.experiments.record_files import load_record
from marin_assets.train.budget import load_budget

SCREEN = Path(__file__).resolve().parents[1] / "experiments" / "screen_tiny_moe.yaml"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ValueError) as err:
        load_structured(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}:")
    return message


@pytest.mark.parametrize(
    "text, at, key",
    [
        ("budget_tokens: 100\nhardware_available: []\nbudget_tokens: 200\n", "3:1", "'budget_tokens'"),
        ("arms:\n  muon:\n    change: {}\n  top1:\n    change: {}\n  muon:\n    seeds: [0]\n", "6:3", "'muon'"),
        ("jobs:\n  - name: a\n    pool: cpu\n    name: b\n", "4:5", "'name'"),
        ("x: {a: 1, b: {c: 2, c: 3}}\n", "1:21", "'c'"),
        ("1: one\n0x1: also one\n", "2:1", "1"),  # equal once read: PyYAML would keep 'also one' only
        ("on: true\nyes: false\n", "2:1", "True"),
    ],
)
def test_a_repeated_yaml_key_is_refused_at_every_level(tmp_path, text, at, key):
    assert len(yaml.safe_load(text)) >= 1  # what plain PyYAML does: keeps the last value, no error
    message = _refusal(_write(tmp_path, "c.yaml", text))
    assert message.startswith(f"{tmp_path / 'c.yaml'}:{at}: invalid YAML: duplicate key {key} (first at line ")


@pytest.mark.parametrize(
    "text, at, key",
    [
        ('{"budget_tokens": 1, "budget_tokens": 2}', "1:22", "'budget_tokens'"),
        ('{"a": [1, {"b": {}, "c": 2, "b": 3}]}', "1:29", "'b'"),
        ('[{}, {"k": 1}, {"k": 1, "\\u006b": 2}]', "1:25", "'k'"),  # the same key, written with an escape
        ('{\n  "a": {"x": 1},\n  "b": 2,\n  "a": {"y": 1}\n}\n', "4:3", "'a'"),
    ],
)
def test_a_repeated_json_key_is_refused_where_it_repeats(tmp_path, text, at, key):
    message = _refusal(_write(tmp_path, "c.json", text))
    assert message.startswith(f"{tmp_path / 'c.json'}:{at}: invalid JSON: duplicate key {key}")


_keys = st.lists(st.sampled_from(["a", "b", "lr", "name", "x y", "é"]), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(keys=_keys, values=st.lists(st.integers(-5, 5), min_size=6, max_size=6), suffix=st.sampled_from([".yaml", ".json"]))
def test_any_mapping_loads_exactly_iff_its_keys_are_distinct(tmp_path_factory, keys, values, suffix):
    # One key per line, so the first repeated key's line is known: YAML block style, or JSON.
    lines = [f"{json.dumps(k)}: {v}" for k, v in zip(keys, values, strict=False)]
    text = "\n".join(lines) + "\n" if suffix == ".yaml" else "{\n" + ",\n".join(lines) + "\n}\n"
    path = _write(tmp_path_factory.mktemp("keys"), "c" + suffix, text)
    repeats = [i for i, k in enumerate(keys) if k in keys[:i]]
    if not repeats:
        assert load_structured(path) == dict(zip(keys, values, strict=False))
        return
    line = repeats[0] + (1 if suffix == ".yaml" else 2)
    assert f"{path}:{line}:1: invalid " in _refusal(path) and repr(keys[repeats[0]]) in _refusal(path)


def _laughs(levels: int, fan: int = 9) -> str:
    """The classic billion laughs: level i is ``fan`` aliases of level i-1, so fan**levels leaves."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * fan) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _merges(levels: int) -> str:
    """The merge-key variant: each level merges the one below twice."""
    lines = ["m0: &m0 {" + ", ".join(f"k{j}: {j}" for j in range(9)) + "}"]
    lines += [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], own{i}: {i}}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [_laughs(10), _merges(40)], ids=["billion_laughs", "merge_keys"])
def test_an_alias_bomb_is_refused_quickly_in_bounded_memory(tmp_path, text):
    path = _write(tmp_path, "bomb.yaml", text)
    assert path.stat().st_size < 2048
    tracemalloc.start()
    start = time.perf_counter()
    try:
        message = _refusal(path)
        seconds, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"aliases expand to more than {MAX_ALIASED_NODES} nodes" in message
    assert seconds < 2.0 and peak < 20 << 20, (seconds, peak)


def test_a_self_containing_alias_is_refused(tmp_path):
    assert "alias *a refers to a node that contains it" in _refusal(_write(tmp_path, "r.yaml", "a: &a [1, {b: *a}]\n"))


def test_ordinary_anchors_and_aliases_still_load(tmp_path):
    # 1000 jobs sharing one defaults block: far more aliases than a real file needs, well under the budget.
    jobs = "".join(f"  - {{<<: *defaults, name: job{i}}}\n" for i in range(1000))
    path = _write(
        tmp_path,
        "jobs.yaml",
        "defaults: &defaults {pool: cpu, chips: 4, hours: 1.5}\nsizes: &sizes [1, 2, 4]\nagain: *sizes\njobs:\n" + jobs,
    )
    data = load_structured(path)
    assert data["again"] == [1, 2, 4] and len(data["jobs"]) == 1000
    assert data["jobs"][999] == {"pool": "cpu", "chips": 4, "hours": 1.5, "name": "job999"}
    assert _laughs(4).count("*") < 30 and len(load_structured(_write(tmp_path, "small.yaml", _laughs(4)))["a3"]) == 9


def test_merge_keys_follow_the_spec_not_pyyaml_6_0_4(tmp_path):
    text = (
        "a: &a {key1: 1, k: 1}\nb: &b {key1: 2, k: 2}\nfirst_wins: {<<: [*a, *b]}\n"
        "base: &base {x: 1, lr: 1}\nmid: &mid {<<: *base, x: 3, lr: 3}\ntop: {<<: *mid}\n"
        # An override inside a merged mapping is not a repeated key, even when that mapping is merged again.
        "one:\n  <<: &defaults\n    <<: {source: staging}\n    source: production\ntwo: *defaults\n"
    )
    plain = yaml.safe_load(text)
    assert plain["first_wins"]["key1"] == 2 and plain["top"]["x"] == 1  # PyYAML 6.0.4 (yaml/pyyaml#953)
    data = load_structured(_write(tmp_path, "m.yaml", text))
    assert data["first_wins"] == {"key1": 1, "k": 1}  # "an earlier mapping in the sequence overrides a later one"
    assert data["top"] == {"x": 3, "lr": 3}
    assert data["one"] == data["two"] == {"source": "production"}


def test_the_budget_file_refuses_a_repeated_key_and_keeps_its_own_messages(tmp_path):
    path = _write(tmp_path, "budget.yaml", "budget_tokens: 100\nbudget_tokens: 200\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2:1: invalid YAML: duplicate key 'budget_tokens'"):
        load_budget(path)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:.*aliases expand"):
        load_budget(_write(tmp_path, "budget.yaml", _laughs(10) + "budget_tokens: 1\n"))
    with pytest.raises(FileNotFoundError, match="write budget_tokens: N into it"):
        load_budget(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="expected a mapping with budget_tokens"):
        load_budget(_write(tmp_path, "budget.yaml", "hardware_available: []\n"))
    assert load_budget(_write(tmp_path, "budget.yaml", "budget_tokens: 7\n")).budget_tokens == 7


def test_an_experiment_record_with_two_arms_of_one_name_is_refused(tmp_path):
    text = SCREEN.read_text()
    assert "\n  muon:\n" in text
    path = _write(tmp_path, "screen_tiny_moe.yaml", text.replace("\n  muon:\n", "\n  top1:\n", 1))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:\d+:3: invalid YAML: duplicate key 'top1'"):
        load_record(path)


def test_an_experiment_baseline_config_with_a_repeated_key_is_refused(tmp_path):
    (tmp_path / "base.yaml").write_text("seq_len: 16\nbatch_size: 4\nseq_len: 32\n")
    text = SCREEN.read_text().replace("config: ../examples/tiny_moe.yaml", "config: base.yaml")
    base = re.escape(str(tmp_path / "base.yaml"))
    with pytest.raises(ValueError, match=rf"^{base}:3:1: invalid YAML: duplicate key 'seq_len'"):
        load_record(_write(tmp_path, "screen_tiny_moe.yaml", text))
