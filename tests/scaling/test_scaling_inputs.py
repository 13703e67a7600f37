"""Bad scaling inputs: partition keys, CSV values, CLI flags, data a fit cannot identify."""

import csv
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.cli import main
from marin_assets.scaling.bootstrap import BootstrapConfig
from marin_assets.scaling.data import drop_highest_loss, load_runs_csv, validate_runs
from marin_assets.scaling.fits import IsoFlopConfig
from marin_assets.scaling.parametric import ParametricFitConfig, fit_parametric
from marin_assets.scaling.planner import ModelFamily, plan_sweep
from marin_assets.scaling.recipes import V2
from marin_assets.scaling.sweep import parse_partition_key, partition_key
from tests.scaling.scaling_synth import TRUE_LAW


@pytest.mark.parametrize(
    "key", ["C2e11-d48\n", "C2e11-d48\r", "C2e11-d1_0", "C2e11-d 48", " C2e11-d48", "Cnan-d4", "Cinf-d4", "C2e11-d0", "C2e11-d-4"]
)
def test_partition_key_must_match_in_full(key):
    with pytest.raises(ValueError, match="sweep partition key"):
        parse_partition_key(key)


@pytest.mark.parametrize("budget, width", [(2e11, 48), (2.5e11, 3), (5e-05, 7), (1e21, 4096)])
def test_partition_keys_round_trip(budget, width):
    key = partition_key(budget, width)
    assert parse_partition_key(key) == (float(f"{budget:.2g}"), width)


# ---- item 17: fits the data cannot identify are refused ------------------------------------

SMALL_GRID = ParametricFitConfig(grid={"a": (0.0, 10.0), "b": (0.0, 10.0), "e": (0.0,), "alpha": (0.5,), "beta": (0.5,)})


def _write_csv(path, rows, header=("params", "tokens", "loss")):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.mark.parametrize(
    "params, tokens, needle",
    [
        ([1e8] * 10, [2e9] * 10, "1 distinct model size(s) and 1 distinct token count(s)"),
        ([1e8] * 6, [1e9, 2e9, 3e9, 4e9, 5e9, 6e9], "1 distinct model size(s) and 6 distinct token count(s)"),
        ([1e7, 2e7, 4e7, 8e7, 1.6e8, 3.2e8], [5e9] * 6, "6 distinct model size(s) and 1 distinct token count(s)"),
        ([1e8, 1e8 * (1 + 1e-12)] * 3, [1e9, 2e9, 3e9] * 2, "1 distinct model size(s)"),  # a CSV round-off is no new size
    ],
)
def test_parametric_fit_refuses_data_it_cannot_identify(params, tokens, needle):
    loss = TRUE_LAW.predict(np.array(params), np.array(tokens))
    with pytest.raises(ValueError, match=re.escape(needle) + ".*need >= 2 of each"):
        fit_parametric(params, tokens, loss, SMALL_GRID)


def test_two_sizes_and_two_token_counts_are_enough():
    nn, dd = (a.ravel() for a in np.meshgrid([1e8, 4e8], [2e9, 8e9, 3e10]))
    fit = fit_parametric(nn, dd, TRUE_LAW.predict(nn, dd), SMALL_GRID)
    assert fit.n == 6 and math.isfinite(fit.alpha) and math.isfinite(fit.beta)


def test_cli_fit_parametric_refuses_ten_identical_runs(tmp_path, capsys):
    path = _write_csv(tmp_path / "same.csv", [(1e8, 2e9, 3.1)] * 10)
    assert main(["scaling", "fit-parametric", "--csv", path, "--bootstrap", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "same.csv: cannot identify the law from these runs: 1 distinct model size(s)" in captured.err


def test_cli_fit_parametric_names_excluded_rows_when_too_few_remain(tmp_path, capsys):
    path = _write_csv(tmp_path / "few.csv", [(1e8, 2e9, "nan"), (1e8, "inf", 3.0), (2e8, 2e9, 3.0)])
    assert main(["scaling", "fit-parametric", "--csv", path]) == 2
    err = capsys.readouterr().err
    assert "few.csv: 1 usable run(s), the parametric law needs >= 5 (2 excluded" in err
    assert "row 0: loss is missing or NaN" in err and "row 1: tokens is infinite" in err


# ---- item 4: NaN/inf in every scaling float, named ------------------------------------------


@pytest.mark.parametrize(
    "build, needle",
    [
        (lambda: ParametricFitConfig(huber_delta=math.nan), "huber_delta must be a finite number"),
        (lambda: ParametricFitConfig(gtol=math.inf), "gtol must be a finite number"),
        (
            lambda: ParametricFitConfig(grid={**SMALL_GRID.grid, "alpha": (0.5, math.nan)}),
            r"grid\['alpha'\]\[1\] must be a finite",
        ),
        (lambda: ParametricFitConfig(max_iter=1.5), "max_iter must be an integer"),
        (lambda: IsoFlopConfig(bucket_base=math.nan), "bucket_base must be a finite number"),
        (lambda: IsoFlopConfig(bucket_base=1.0), r"bucket_base must be in \(1, 10\], got 1"),
        (lambda: IsoFlopConfig(huber_delta=-math.inf), "huber_delta must be a finite number"),
        (lambda: IsoFlopConfig(min_points=2), r"min_points \(a quadratic has 3 coefficients\) must be in \[3,"),
        (lambda: BootstrapConfig(level=math.nan), "bootstrap level must be a finite number"),
        (lambda: BootstrapConfig(level=1.0), r"bootstrap level must be in \(0, 1\)"),
        (lambda: BootstrapConfig(n=10**9), r"bootstrap n must be in \[0, 100000\]"),
        (
            lambda: ModelFamily(widths=(64,), vocab_size=256, seq_len=64, aspect_ratio=math.nan),
            "ModelFamily.aspect_ratio must be a finite",
        ),
        (
            lambda: ModelFamily(widths=(64,), vocab_size=256, seq_len=64, recipe=V2.with_base(math.inf)),
            "recipe 'v2' lr_base must be a finite",
        ),
        (lambda: ModelFamily(widths=(64,), vocab_size=256, seq_len=64, ff_mult=-1.0), r"ModelFamily.ff_mult must be in \(0,"),
        (lambda: ModelFamily(widths=(64.0,), vocab_size=256, seq_len=64), r"ModelFamily.widths\[0\] must be an integer"),
        (
            lambda: plan_sweep([1e13], ModelFamily(widths=(64,), vocab_size=256, seq_len=64), tolerance=math.nan),
            "tolerance must be a finite",
        ),
        (lambda: plan_sweep([math.inf], ModelFamily(widths=(64,), vocab_size=256, seq_len=64)), "budget must be a finite"),
        (
            lambda: drop_highest_loss(validate_runs(params=[1], tokens=[1], loss=[1]), -1),
            "drop count must be a non-negative integer, got -1",
        ),
    ],
)
def test_scaling_configs_reject_non_finite_and_out_of_range_values_by_name(build, needle):
    with pytest.raises(ValueError, match=needle):
        build()


def test_in_range_configs_are_accepted():
    assert IsoFlopConfig(bucket_base=1.05, huber_delta=0.5, min_points=3).min_points == 3
    assert BootstrapConfig(n=0, level=0.5).n == 0
    assert ParametricFitConfig(huber_delta=10).huber_delta == 10


@pytest.mark.parametrize("flag, value", [("--bucket-base", "nan"), ("--huber-delta", "inf"), ("--predict", "nan")])
def test_cli_fit_isoflop_non_finite_flags(tmp_path, capsys, flag, value):
    path = _write_csv(tmp_path / "runs.csv", [(1e8, 2e9, 3.1)])
    with pytest.raises(SystemExit) as exit_info:
        main(["scaling", "fit-isoflop", "--csv", path, flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: '{value}' is not a finite number" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["fit-parametric", "--bootstrap", "-1"], "bootstrap n must be in [0, 100000], got -1"),
        (["fit-parametric", "--drop-highest", "-2"], "drop count must be a non-negative integer, got -2"),
        (["fit-isoflop", "--bucket-base", "1"], "bucket_base must be in (1, 10], got 1"),
    ],
)
def test_cli_out_of_range_flags_exit_2_naming_the_field(tmp_path, capsys, argv, needle):
    path = _write_csv(tmp_path / "runs.csv", [(1e8, 2e9, 3.1)] * 6)
    assert main(["scaling", argv[0], "--csv", path, *argv[1:]]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "cell, reason",
    [
        ("nan", "loss is missing or NaN"),
        ("inf", "loss is infinite"),
        ("-inf", "loss is infinite"),
        ("1e400", "loss is infinite"),
        ("", "loss is missing or NaN"),
        ("abc", "loss is missing or NaN"),
        ("-3", "loss is non-positive (-3)"),
        ("0", "loss is non-positive (0)"),
    ],
)
def test_csv_values_that_are_not_finite_positive_are_excluded_naming_the_column(tmp_path, cell, reason):
    path = _write_csv(tmp_path / "runs.csv", [(1e8, 2e9, 3.0), (1e8, 2e9, cell)])
    runs = load_runs_csv(path)
    assert len(runs) == 1 and runs.excluded == [{"row": 1, "reason": reason}]


@pytest.mark.parametrize(
    "blob, needle",
    [
        (b"params,tokens,loss\n1,2,\xff\n", "runs.csv: not UTF-8 text (byte 23)"),
        (
            b'params,tokens,loss\n1,2,"' + b"9" * 200_000 + b'"\n',
            "runs.csv: after line 1: unreadable CSV: field larger than field limit",
        ),
    ],
)
def test_unreadable_csv_is_one_line(tmp_path, capsys, blob, needle):
    path = tmp_path / "runs.csv"
    path.write_bytes(blob)
    assert main(["scaling", "fit-parametric", "--csv", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


# ---- property test: the CSV reader never raises anything but a clear error, and counts add up ----

_cells = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**60), max_value=10**60).map(str),
    st.sampled_from(["", "nan", "inf", "-inf", "1e400", "1e-400", " 5 ", "1_000", "0x10", "NaN", "∞"]),
    st.text(max_size=10),
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(_cells, _cells, _cells), max_size=12),
    header=st.sampled_from([("params", "tokens", "loss"), ("params", "flops", "loss"), ("Model Size", "Training FLOP", "loss")]),
)
def test_csv_reader_counts_every_row_and_keeps_only_finite_positive_values(tmp_path_factory, rows, header):
    path = _write_csv(tmp_path_factory.mktemp("csv") / "runs.csv", rows, header)
    try:
        runs = load_runs_csv(path)
    except ValueError as err:
        assert str(err).startswith(path) and "\n" not in str(err)
        return
    assert len(runs) + len(runs.excluded) == len(rows)
    for values in (runs.params, runs.tokens, runs.flops, runs.loss):
        assert values.shape == (len(runs),)
        assert np.all(np.isfinite(values)) and np.all(values > 0)
    for entry in runs.excluded:
        assert any(name in entry["reason"] for name in ("params", "tokens", "flops", "loss"))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([b"", b"params,tokens,loss\n", b"params,flops,loss\r\n1,6,2\r\n"]), st.binary(max_size=400))
def test_csv_reader_on_arbitrary_bytes_raises_only_clear_errors(tmp_path_factory, header, body):
    path = tmp_path_factory.mktemp("csvb") / "runs.csv"
    path.write_bytes(header + body)
    try:
        runs = load_runs_csv(path)
    except ValueError as err:
        assert str(err).startswith(str(path)) and "\n" not in str(err)
        return
    assert np.all(np.isfinite(runs.loss)) and np.all(runs.loss > 0)


def test_derived_tokens_that_overflow_are_excluded_not_kept_as_inf(tmp_path):
    path = _write_csv(tmp_path / "runs.csv", [(1e-300, 1e300, 3.0), (1e8, 1.2e18, 3.0)], ("params", "flops", "loss"))
    runs = load_runs_csv(path)
    assert runs.tokens.tolist() == [2e9]
    assert runs.excluded == [{"row": 0, "reason": "tokens is infinite (derived from C = 6 N D)"}]
