"""From finished runs to the screen's verdict: speedups, controls, criterion, report.

``analyze(record, rows)`` -> a JSON-able dict (the analysis asset's content and the CLI's
source); ``render_report(record, analysis)`` -> (Markdown, {file name: PNG bytes}).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import numpy as np

from marin_assets.experiments.lock import check_run_rows
from marin_assets.experiments.record import BASELINE, ExperimentRecord
from marin_assets.experiments.runs import run_loss
from marin_assets.experiments.speedup import ArmSpeedup, _json_float, screen


def _check_result(check, result: ArmSpeedup | None) -> dict:
    out = {"check": check.describe(), "arm": check.arm, "kind": check.kind, "value": check.value}
    if result is None:  # the baseline against itself is 1 by construction
        out["held"] = check.holds(1.0, 1.0, 1.0)
    else:
        out["held"] = bool(check.holds(result.effective_speedup, result.ci_low, result.ci_high))
    return out


def analyze(record: ExperimentRecord, rows: Sequence[Mapping], bootstrap_seed: int = 0) -> dict:
    """Every run row of the record -> speedups per arm, noise floor, controls, criterion.

    RecordChangedError if a row's stamp says it ran under other frozen fields: old results
    are never reported under an edited hypothesis or criterion.
    """
    check_run_rows(record, rows)
    expected = {(a.name, b, s) for a in record.all_arms() for b in record.budgets for s in a.seeds}
    got = {(r["arm"], float(r["budget"]), int(r["seed"])) for r in rows}
    missing = sorted(expected - got)
    if missing:
        raise ValueError(f"{record.name}: {len(missing)} run(s) missing, e.g. {missing[:3]}")
    losses = [run_loss(r) for r in rows if (r["arm"], float(r["budget"]), int(r["seed"])) in expected]
    envelope, arms, floor = screen(losses, BASELINE, record.bootstrap, bootstrap_seed)
    order = [a.name for a in record.arms]
    results = [arms[name] for name in order]
    controls = [_check_result(c, arms.get(c.arm)) for a in record.arms for c in a.expect]
    checks = [_check_result(c, arms.get(c.arm)) for c in record.criterion.checks]
    noise = floor["factor"]
    arm_rows = []
    for r in results:
        row = r.as_json()
        row["per_budget"] = {f"{b:g}": _json_float(s) for b, s in r.per_budget.items()}
        row["beyond_noise"] = bool(noise is not None and (r.ci_low > noise or r.ci_high < 1.0 / noise))
        arm_rows.append(row)
    return {
        "experiment": record.name,
        "baseline_fit": {"E": envelope.E, "A": envelope.A, "alpha": envelope.alpha},
        "noise_floor": floor,
        "arms": arm_rows,
        "controls": controls,
        "controls_held": all(c["held"] for c in controls),
        "criterion": {"statement": record.criterion.statement, "checks": checks, "held": all(c["held"] for c in checks)},
        "bootstrap": {"n": record.bootstrap, "level": 0.95, "unit": "seed"},
        "runs": [{k: r[k] for k in ("arm", "budget", "seed", "flops", "steps", "validation_loss", "seconds")} for r in rows],
        # The dataset(s) the runs read (runs.execute_run's ``corpus``); rows made before it say none.
        "corpus_versions": sorted({r["corpus"]["version"] for r in rows if "corpus" in r}),
    }


# ---------------------------------------------------------------- the report


def _png(fig, plt) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plot_loss_vs_compute(analysis: Mapping) -> bytes:
    """Validation loss against FLOPs, one colour per arm (seed means joined), plus the
    baseline's fitted L(C)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    runs = analysis["runs"]
    arms = [BASELINE] + [a["arm"] for a in analysis["arms"]]
    colors = plt.cm.tab10(np.linspace(0, 1, 10))
    for i, arm in enumerate(arms):
        mine = [r for r in runs if r["arm"] == arm]
        budgets = sorted({r["budget"] for r in mine})
        xs = [np.mean([r["flops"] for r in mine if r["budget"] == b]) for b in budgets]
        ys = [np.mean([r["validation_loss"] for r in mine if r["budget"] == b]) for b in budgets]
        style = {"lw": 2.5, "color": "black"} if arm == BASELINE else {"lw": 1, "color": colors[i % 10]}
        ax.plot(xs, ys, marker="o", ms=3, label=arm, **style)
    fit = analysis["baseline_fit"]
    flops = [r["flops"] for r in runs]
    grid = np.geomspace(min(flops), max(flops), 100)
    ax.plot(
        grid,
        fit["E"] + fit["A"] * grid ** (-fit["alpha"]),
        ls="--",
        color="gray",
        label=f"baseline fit {fit['E']:.3g} + {fit['A']:.3g} C^-{fit['alpha']:.3g}",
    )
    ax.set_xscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title(f"{analysis['experiment']}: loss vs compute (seed means)")
    ax.legend(fontsize=7, ncol=2)
    return _png(fig, plt)


def plot_speedups(analysis: Mapping) -> bytes:
    """Effective speedup per arm with its interval, log scale, the noise floor shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = analysis["arms"]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(arms) + 1.5))
    cap = 100.0  # an unbounded (null) end is drawn at the plot's edge
    for y, a in enumerate(arms):
        mid = a["effective_speedup"] if a["effective_speedup"] is not None else cap
        lo = a["ci_low"] if a["ci_low"] is not None else cap
        hi = a["ci_high"] if a["ci_high"] is not None else cap
        ax.errorbar(
            [mid],
            [y],
            xerr=[[max(mid - lo, 0)], [max(hi - mid, 0)]],
            fmt="o",
            capsize=3,
            color="C3" if a["beyond_noise"] else "C0",
        )
    floor = analysis["noise_floor"]["factor"]
    if floor is not None:
        ax.axvspan(1.0 / floor, floor, color="gray", alpha=0.2, label=f"noise floor x{floor:.2f}")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(range(len(arms)), [a["arm"] for a in arms])
    ax.set_xscale("log")
    ax.set_xlabel("effective speedup (baseline compute to reach the arm's loss / the arm's compute)")
    ax.legend(fontsize=7)
    return _png(fig, plt)


def _fmt(x) -> str:
    return "unbounded" if x is None else f"{x:.3f}"


def report_images(analysis: Mapping) -> dict[str, bytes]:
    return {"loss_vs_compute.png": plot_loss_vs_compute(analysis), "speedups.png": plot_speedups(analysis)}


def render_report(record: ExperimentRecord, analysis: Mapping) -> tuple[str, dict[str, bytes]]:
    """Markdown (images referenced by file name) and its PNGs."""
    images = report_images(analysis)
    return report_markdown(record, analysis), images


def report_markdown(record: ExperimentRecord, analysis: Mapping, image_links: Mapping[str, str] | None = None) -> str:
    """The report; images are linked as ``image_links[name]`` (default: the file name)."""
    link = dict(image_links or {})
    crit = analysis["criterion"]
    floor = analysis["noise_floor"]["factor"]
    lines = [
        f"# Experiment `{record.name}`",
        "",
        f"**Hypothesis** (written before any run): {record.hypothesis.strip()}",
        "",
        f"**Criterion**: {crit['statement'].strip()}",
        "",
        f"**Criterion held: {'yes' if crit['held'] else 'no'}**"
        + "".join(f"\n- {c['check']}: {'held' if c['held'] else 'did not hold'}" for c in crit["checks"]),
        "",
        f"**Controls held: {'yes' if analysis['controls_held'] else 'NO, the screen cannot be trusted'}**"
        + "".join(f"\n- {c['check']}: {'held' if c['held'] else 'did not hold'}" for c in analysis["controls"]),
        "",
        "## Effective speedup",
        "",
        f"Baseline fit L(C) = {analysis['baseline_fit']['E']:.4g} + {analysis['baseline_fit']['A']:.4g} "
        f"C^-{analysis['baseline_fit']['alpha']:.4g}; noise floor (leave one baseline seed out): "
        f"x{_fmt(floor)}; {analysis['bootstrap']['n']} bootstrap resamples over seeds, 95% intervals."
        + "".join(
            f" Data: the DataKit dataset of the first {record.data_files} standard-library files, version {v[:16]}."
            for v in analysis.get("corpus_versions", [])
        ),
        "",
        "| arm | effective speedup | 95% interval | runs | beyond noise |",
        "|---|---|---|---|---|",
    ]
    for a in analysis["arms"]:
        lines.append(
            f"| {a['arm']} | {_fmt(a['effective_speedup'])} | [{_fmt(a['ci_low'])}, {_fmt(a['ci_high'])}] "
            f"| {a['runs']} | {'yes' if a['beyond_noise'] else 'no'} |"
        )
    lines += [
        "",
        f"![loss vs compute]({link.get('loss_vs_compute.png', 'loss_vs_compute.png')})",
        "",
        f"![speedups]({link.get('speedups.png', 'speedups.png')})",
        "",
    ]
    if record.amendments:  # edits made after a run, so the record's history stays visible
        lines += ["## Amendments", ""] + [f"- {a.date}: {' '.join(a.reason.split())}" for a in record.amendments] + [""]
    links = ", ".join(f"{k}: {v}" for k, v in record.links.items())
    if links:
        lines += [f"Links: {links}", ""]
    return "\n".join(lines)
