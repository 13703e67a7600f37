"""Plots are real PNGs and are written where asked."""

from __future__ import annotations

from marin_assets.scaling.fits import IsoFlopConfig, fit_isoflop
from marin_assets.scaling.plots import plot_isoflop_curves, plot_power_laws, plot_predicted_vs_actual
from tests.scaling.scaling_synth import sweep_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plots_are_png(tmp_path):
    runs = sweep_runs()
    result = fit_isoflop(runs, IsoFlopConfig(bootstrap_n=0))
    curves = plot_isoflop_curves(runs, result, path=tmp_path / "iso.png")
    laws = plot_power_laws(result, extrapolate_to=1e21)
    pva = plot_predicted_vs_actual([1e19, 1e20], [2.31, 2.12], [2.30, 2.15])
    for data in (curves, laws, pva):
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert (tmp_path / "iso.png").read_bytes() == curves
