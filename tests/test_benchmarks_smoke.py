"""Every benchmark script runs against the current code: each one, at its smallest size, in a
fresh interpreter, prints the figures it promises as JSON lines with the convention's keys
(benchmarks/_common.py emit: name, unit, ours, reference, ratio; ratio > 1 = we are better).

Their numbers at these sizes are noise; only that they are finite, positive and consistent
with the ratio is checked. Left out, each far over this file's minute: datakit_graph.py
(two fresh Dagster passes over the whole graph, ~70 s at its --quick size), train_throughput.py,
moe_step.py, precision.py, fsdp_memory.py, pooled_wave_memory.py, telemetry_overhead.py, checkpoint_save.py,
attention.py (~40 s at --quick) and device_check_attention.py (JAX compilation, minutes on 2 cores), moe_context.py and ladder.py (real training: ~14 and ~30 minutes).
datakit_fuzzy.py runs inside datakit.py --quick.
"""

from __future__ import annotations

import json
import math
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
