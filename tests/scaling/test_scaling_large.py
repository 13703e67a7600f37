"""Scaling fits on large inputs: bounded memory, a deterministic subsample above a cap, and the
subsample said (stderr and the report's "rows"), never silent."""

from __future__ import annotations

import csv
import io
import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.cli import main
from marin_assets.scaling import data as scaling_data
from marin_assets.scaling import parametric
from marin_assets.scaling.bootstrap import BootstrapConfig
from marin_assets.scaling.data import bucket_flops, deterministic_subsample, load_runs_csv, validate_runs
from marin_assets.scaling.fits import IsoFlopConfig, fit_isoflop, group_by_budget
from marin_assets.scaling.parametric import ParametricFitConfig, fit_parametric, fit_parametric_with_ci
from tests.scaling.scaling_synth import TRUE_D_EXPONENT, TRUE_LAW, TRUE_N_EXPONENT, isoflop_sweep

ROOT = Path(__file__).resolve().parents[2]
COARSE = dict(
    grid={"a": (0.0, 10.0, 20.0), "b": (0.0, 10.0, 20.0), "e": (-1.0, 0.0, 1.0), "alpha": (0.5, 1.5), "beta": (0.5, 1.5)}
)


def _million_runs(seed: int = 0):
    """isoflop_sweep's design, vectorised: 10 budgets x 100,000 model sizes, 0.2% noise."""
    rng = np.random.default_rng(seed)
    budgets = np.geomspace(1e17, 1e19, 10)
    n = (TRUE_LAW.optimal_allocation(budgets)[0][:, None] * np.geomspace(1 / 8, 8, 100_000)[None, :]).ravel()
    c = np.repeat(budgets, 100_000)
    d = c / (6.0 * n)
    return validate_runs(params=n, tokens=d, flops=c, loss=TRUE_LAW.predict(n, d) * (1 + 0.002 * rng.normal(size=n.size)))


def _fit_a_million() -> dict:
    """Both fits of a million runs, with the process's peak RSS: run in a child process (below)."""
    runs = _million_runs()
    report = fit_parametric_with_ci(runs, ParametricFitConfig(**COARSE), BootstrapConfig(n=2, seed=0))
    iso = fit_isoflop(runs, IsoFlopConfig(bootstrap_n=2)).as_dict()
    return {"parametric": report, "isoflop": iso, "peak_rss": _own_peak_rss()}


def _own_peak_rss() -> int:
    """This process's peak RSS in bytes: /proc's VmHWM, the high-water mark of its own memory.
    Not ru_maxrss: Linux carries that across exec from the parent (a pytest worker that has
    grown to ~3 GiB over the suite), so a small child reported its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


# Capped address space: a regression fails fast with MemoryError instead of swapping a shared machine.
# Run from the repository root (``-c`` puts the working directory on sys.path), so this module imports
# as tests.scaling.test_scaling_large.
_CHILD = """
import json, resource
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
from tests.scaling.test_scaling_large import _fit_a_million
print(json.dumps(_fit_a_million(), default=float))
"""


def test_a_million_runs_fit_in_bounded_memory_and_the_subsample_is_reported():
    # Before: the parametric grid's temporaries were (starts, runs) float64 arrays (33.5 GiB each
    # with the published grid at 1e6 runs; 0.8 GiB each with this coarse one). A fresh process, so
    # its peak RSS is this fit's alone.
    child = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-2000:]
    out = json.loads(child.stdout)
    assert out["peak_rss"] < 1.5 * 2**30, f"peak RSS {out['peak_rss'] / 2**20:.0f} MiB"
    report, iso = out["parametric"], out["isoflop"]
    assert report["rows"]["given"] == 1_000_000 and report["rows"]["used"] == report["n"] == 10_000
    assert report["rows"]["grid_search"] == 256 and len(report["rows"]["why"]) == 2
    assert "1000000 runs is more than max_rows=10000" in report["rows"]["why"][0]
    assert abs(report["alpha"] - TRUE_LAW.alpha) < 0.01 and abs(report["beta"] - TRUE_LAW.beta) < 0.01, report
    assert iso["rows"]["given"] == 1_000_000 and iso["rows"]["used"] == iso["n"] == 10 * 2000
    assert "10 budget(s) have more than max_runs_per_budget=2000 runs (up to 100000)" in iso["rows"]["why"][0]
    assert abs(iso["n_opt_exponent"] - TRUE_N_EXPONENT) < 0.01 and abs(iso["d_opt_exponent"] - TRUE_D_EXPONENT) < 0.01


def test_the_grid_search_on_a_subsample_finds_the_same_optimum():
    rng = np.random.default_rng(1)
    nn, dd = (a.ravel() for a in np.meshgrid(np.geomspace(1e7, 3e9, 12), np.geomspace(2e8, 2e11, 12)))
    loss = TRUE_LAW.predict(nn, dd) * np.exp(0.005 * rng.normal(size=nn.size))
    full = fit_parametric(nn, dd, loss, ParametricFitConfig(**COARSE))
    sub = fit_parametric(nn, dd, loss, ParametricFitConfig(**COARSE, grid_rows=40))
    assert full.n == sub.n == 144
    for name in ("E", "A", "B", "alpha", "beta", "objective"):
        assert getattr(sub, name) == pytest.approx(getattr(full, name), rel=1e-5), name


def _csv(tmp_path, rows):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([("params", "tokens", "flops", "loss"), *rows])
    return str(path)


def test_cli_fit_parametric_says_when_it_fits_a_subsample(tmp_path, capsys, monkeypatch):
    # The CLI's report plumbing is under test, not the fit: the coarse grid instead of the published one.
    monkeypatch.setattr(parametric, "PUBLISHED_GRID", COARSE["grid"])
    p, t, c, loss = isoflop_sweep([1e17, 3e17, 1e18, 3e18, 1e19], noise=0.002, sizes=12)
    path = _csv(tmp_path, zip(p, t, c, loss, strict=True))
    assert main(["scaling", "fit-parametric", "--csv", path, "--json", "--bootstrap", "0", "--max-rows", "40"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)["rows"]
    assert rows == {"given": 60, "used": 40, "grid_search": 40, "why": rows["why"]} and len(rows["why"]) == 1
    assert err == f"marin scaling fit-parametric: {rows['why'][0]}\n" and "subsample of 40 (seed 0)" in err
    assert main(["scaling", "fit-parametric", "--csv", path, "--json", "--bootstrap", "0"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["rows"] == {"given": 60, "used": 60, "grid_search": 60, "why": []} and err == ""


def test_cli_fit_isoflop_says_when_it_fits_a_subsample(tmp_path, capsys):
    p, t, c, loss = isoflop_sweep([1e17, 3e17, 1e18, 3e18, 1e19], noise=0.002, sizes=9)
    path = _csv(tmp_path, zip(p, t, c, loss, strict=True))
    argv = ["scaling", "fit-isoflop", "--csv", path, "--json", "--bootstrap", "2"]
    assert main([*argv, "--max-runs-per-budget", "6"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["rows"]["given"] == 45 and report["rows"]["used"] == report["n"] == 30
    assert [o["n_runs"] for o in report["optima"]] == [6] * 5
    assert err.startswith("marin scaling fit-isoflop: 5 budget(s) have more than max_runs_per_budget=6 runs (up to 9)")
    assert main([*argv, "--max-runs-per-budget", "2"]) == 2
    assert "max_runs_per_budget must be" in capsys.readouterr().err


def test_deterministic_subsample_is_a_fixed_uniform_draw():
    first = deterministic_subsample(1_000_000, 1000)
    assert np.array_equal(first, deterministic_subsample(1_000_000, 1000))
    assert first.size == np.unique(first).size == 1000 and np.all(np.diff(first) > 0)
    assert 0.4 < first.mean() / 1_000_000 < 0.6  # spread over the rows, not the first thousand
    assert np.array_equal(deterministic_subsample(7, 10), np.arange(7))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1e17, 1.02e17, 1.3e17, 3e18, 2.9e18, 5e20]), max_size=40), st.sampled_from([1.1, 2.0]))
def test_grouping_by_budget_is_bucketing_each_run(flops, base):
    keys = [bucket_flops(f, base) for f in flops]
    groups = group_by_budget(np.array(flops), base)
    assert list(groups) == sorted(set(keys))
    for budget, idx in groups.items():
        assert idx.tolist() == [i for i, k in enumerate(keys) if k == budget]


_cell = st.sampled_from(["1e9", "2e10", " 3.5 ", "", "nan", "-1", "x", "1_0", "4"])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(_cell, max_size=6), max_size=12),
    st.sampled_from([["params", "tokens", "loss"], ["params", "flops", "loss", "loss"], ["loss", "params", "tokens", "flops"]]),
)
def test_the_block_reader_reads_what_csv_dictreader_reads(tmp_path_factory, rows, header):
    # Blank lines, short and long rows, a repeated column name; blocks of 3 rows so rows cross blocks.
    text = io.StringIO()
    csv.writer(text).writerows([header, *rows])
    path = tmp_path_factory.mktemp("block") / "runs.csv"
    path.write_text(text.getvalue())
    with path.open(newline="") as f:
        records = list(csv.DictReader(f))
    columns = {name: [r.get(name) for r in records] if name in header else None for name in ("params", "tokens", "flops", "loss")}
    expected = validate_runs(**columns, source=str(path))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scaling_data, "_CSV_BLOCK_ROWS", 3)
        got = load_runs_csv(path)
    assert got.excluded == expected.excluded
    for name in ("params", "tokens", "flops", "loss", "rows"):
        assert np.array_equal(getattr(got, name), getattr(expected, name)), name
