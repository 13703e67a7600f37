"""Every benchmark script runs against the current code: each one, at its smallest size, in a
fresh interpreter, prints the figures it promises as JSON lines with the convention's keys
(benchmarks/_common.py emit: name, unit, ours, reference, ratio; ratio > 1 = we are better).

Their numbers at these sizes are noise; only that they are finite, positive and consistent
with the ratio is checked. Left out, each far over this file's minute: datakit_graph.py
(two fresh Dagster passes over the whole graph, ~70 s at its --quick size), train_throughput.py,
moe_step.py, precision.py, fsdp_memory.py, pooled_wave_memory.py, telemetry_overhead.py, checkpoint_save.py,
attention.py (~40 s at --quick) and device_check_attention.py (JAX compilation, minutes on 2 cores), moe_context.py and ladder.py (real training: ~14 and ~30 minutes).
datakit_fuzzy.py runs inside datakit.py --quick; train_step_variants.py and device_check.sh have tests of their own below.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

# script, its smallest arguments, the figures it must print
CASES = [
    ("store_overhead.py", ["--partitions", "10"], {"cache_hit"}),
    ("range_overhead.py", ["--partitions", "4", "--single", "1", "--workers", "2"], {"range_overhead_computed_pool"}),
    ("telemetry.py", ["--rows", "50050", "--repeats", "1"], None),
    (
        "partition_planning.py",
        ["--quick"],
        {
            "partition_planning/add_dynamic_partitions",
            "partition_planning/load",
            "partition_planning/plan_single_run",
            "partition_planning/plan_multi_run_64",
        },
    ),
    ("datakit.py", ["--quick"], {"tokenize", "normalize_exact_dedup", "fuzzy_dedup", "fuzzy_dedup_recall"}),
    ("datakit_pii.py", ["--docs", "200", "--repeats", "1"], {"pii_mask_shard"}),
    (
        "datakit_scale.py",
        ["--quick"],
        {
            *(
                f"stage_throughput/{s}"
                for s in ("normalize", "quality", "exact_dedup", "fuzzy_dedup", "decontaminate", "tokenize")
            ),
            "fuzzy_band_reduce_peak_heap",
            "fuzzy_band_reduce_peak_rss",
        },
    ),
    (
        "datakit_web.py",
        ["--quick"],
        {"warc_to_text_vs_resiliparse", "warc_to_text_vs_trafilatura", "datakit_run_warc", "datakit_run_jsonl"},
    ),
    ("train_input.py", ["--quick"], {"train_input"}),
    ("decode.py", ["--quick"], {"decode_cached"}),
]
KEYS = ("name", "unit", "ours", "reference", "ratio")


def _figures(script: str, args: list[str]) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [line for line in lines if "name" in line]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "expected"), CASES, ids=[case[0] for case in CASES])
def test_a_benchmark_prints_its_figures(script, args, expected):
    figures = _figures(script, args)
    assert figures, f"{script} printed no figure"
    for figure in figures:
        missing = [k for k in KEYS if k not in figure]
        assert not missing, f"{script}: {figure.get('name')} lacks {missing}"
        ours, reference, ratio = (figure[k] for k in ("ours", "reference", "ratio"))
        assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (ours, reference, ratio)), figure
        # ratio is ours/reference or reference/ours (whichever way is "better"), rounded to 3-4 places
        assert min(abs(ratio - ours / reference), abs(ratio - reference / ours)) <= 1e-3 * max(1.0, ratio), figure
    names = {f["name"] for f in figures}
    if expected is not None:
        assert expected <= names, f"{script}: missing figures {sorted(expected - names)}"
    if script in ("train_input.py", "decode.py"):
        assert figures[0]["identical"] is True


def test_the_device_check_passes_only_flags_its_scripts_take(tmp_path):
    """benchmarks/device_check.sh runs once on a lent GPU, with no second try: every flag it passes must be
    one its script's --help lists (the script stands in for python and records each step's argv)."""
    record = tmp_path / "argv.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    fake.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": str(fake)}
    subprocess.run(["bash", str(BENCHMARKS / "device_check.sh")], cwd=ROOT, env=env, check=True, capture_output=True, timeout=60)
    steps = [line.split() for line in record.read_text().splitlines() if line.startswith("benchmarks/")]
    scripts = [argv[0] for argv in steps]
    assert scripts == [
        "benchmarks/device_check_attention.py",
        "benchmarks/attention.py",
        "benchmarks/moe_step.py",
        "benchmarks/train_step_variants.py",
        "benchmarks/train_step_variants.py",
    ]
    for argv in steps:
        shown = subprocess.run([sys.executable, argv[0], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr[-2000:]
        listed = set(re.findall(r"(?<![\w-])--[\w-]+", shown.stdout))
        unknown = [flag for flag in argv if flag.startswith("--") and flag not in listed]
        assert not unknown, f"{argv[0]} does not take {unknown}"


@pytest.mark.slow
def test_the_step_variants_run_the_transports_and_name_why_offload_cannot_run_on_cpu():
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "train_step_variants.py"), "--quick", "--iters", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]  # a figure it could not measure: not a success
    assert "offload_train_step_memory: the cpu backend cannot compile it" in proc.stderr
    assert "annotate_device_placement" in proc.stderr
    (figure,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert figure["name"] == "ep_transport_step_time" and figure["mesh"] == {"data": 1, "sequence": 1, "expert": 1}
    assert all(math.isfinite(figure[k]) and figure[k] > 0 for k in ("ours", "reference", "ratio"))
