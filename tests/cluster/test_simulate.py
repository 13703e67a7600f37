"""The fleet simulation: audits, preemption/resume, failures, the generator and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from marin_assets.cli import main
from marin_assets.cluster.fleet import Fleet, Pool
from marin_assets.cluster.simulate import JobStreamConfig, _Run, audit, generate_jobs, jobs_from_dict, simulate

EXAMPLES = Path(__file__).parents[2] / "examples"


def small_fleet():
    return Fleet(
        (
            Pool("gb200", "gb200-nvl72", "us-central1", 3, ep_domain_chips=64),
            Pool("v5e", "tpu-v5e", "us-west4", 1, topology="4x4"),
            Pool("cpu", "cpu", "us-central1", 2, domain_chips=16),
        )
    )


def test_generated_stream_replays_with_zero_overallocation_and_no_splits():
    fleet = small_fleet()
    data = generate_jobs(fleet, JobStreamConfig(n=150, seed=3, load=0.8, n_failures=3))
    jobs, failures = jobs_from_dict(data)
    report = simulate(fleet, jobs, failures)
    assert report["overallocations"] == 0 and report["split_jobs"] == 0
    assert report["completed"] == report["placed"] == 150 and report["queued"] == 0
    assert report["preempted"] > 0  # the stream is busy enough to exercise preemption
    assert set(report["utilization"]) == {"gb200", "v5e", "cpu"}
    assert all(0 < u <= 1 for u in report["utilization"].values())
    assert report["queue_wait_s"]["p50"] <= report["queue_wait_s"]["p95"]


def test_the_audit_is_not_vacuous_without_the_ledger():
    fleet = small_fleet()
    jobs, failures = jobs_from_dict(generate_jobs(fleet, JobStreamConfig(n=150, seed=3, load=0.8, n_failures=0)))
    report = simulate(fleet, jobs, failures, _use_ledger=False)
    assert report["overallocations"] > 0


def test_audit_counts_overallocation_and_splits_directly():
    fleet = small_fleet()
    jobs = {
        j.id: j
        for j in jobs_from_dict(
            {
                "jobs": [
                    {"id": "a", "submit_s": 0, "duration_s": 10, "accelerator": "gb200-nvl72", "chips": 40},
                    {"id": "b", "submit_s": 0, "duration_s": 10, "accelerator": "gb200-nvl72", "chips": 40},
                    {"id": "c", "submit_s": 0, "duration_s": 10, "accelerator": "gb200-nvl72", "chips": 8},
                ]
            }
        )[0]
    }
    up = {p.name: [True] * p.domains for p in fleet.pools}
    running = {"a": _Run("gb200", (0,), (40,), 0, 0), "b": _Run("gb200", (0,), (40,), 0, 0)}
    assert audit(fleet, running, jobs, up) == (1, 0)
    split = {"c": _Run("gb200", (0, 1), (4, 4), 0, 0)}  # an 8-GPU job as 4+4
    assert audit(fleet, split, jobs, up) == (0, 1)
    wrong_pool = {"c": _Run("cpu", (0,), (8,), 0, 0)}
    assert audit(fleet, wrong_pool, jobs, up) == (0, 1)


def test_preempted_job_resumes_from_its_newest_checkpoint():
    fleet = Fleet((Pool("gb200", "gb200-nvl72", "us-central1", 1),))
    jobs, _ = jobs_from_dict(
        {
            "jobs": [
                {
                    "id": "batch",
                    "submit_s": 0,
                    "duration_s": 3600,
                    "accelerator": "gb200-nvl72",
                    "chips": 72,
                    "checkpoint_interval_s": 600,
                },
                {
                    "id": "prod",
                    "submit_s": 1000,
                    "duration_s": 500,
                    "accelerator": "gb200-nvl72",
                    "chips": 72,
                    "priority": "production",
                },
            ]
        }
    )
    report = simulate(fleet, jobs)
    assert report["preempted"] == 1 and report["completed"] == 2
    # batch starts at t=10 (first tick after pool 0's heartbeat at 0), is evicted at t=1000 with
    # 990 s done -> checkpoint 600. prod runs 1000..1500; batch restarts when the 1500 heartbeat
    # shows the rack free (placed at 1500+) and needs 3000 s more: it ends after 4500, not 3610.
    assert report["sim_end_s"] > 4500
    no_ckpt = jobs_from_dict(
        {
            "jobs": [
                {"id": "batch", "submit_s": 0, "duration_s": 3600, "accelerator": "gb200-nvl72", "chips": 72},
                {
                    "id": "prod",
                    "submit_s": 1000,
                    "duration_s": 500,
                    "accelerator": "gb200-nvl72",
                    "chips": 72,
                    "priority": "production",
                },
            ]
        }
    )[0]
    assert simulate(fleet, no_ckpt)["sim_end_s"] - report["sim_end_s"] == pytest.approx(600, abs=30)


def test_domain_failure_resubmits_and_still_completes():
    fleet = Fleet((Pool("gb200", "gb200-nvl72", "us-central1", 2),))
    jobs, failures = jobs_from_dict(
        {
            "jobs": [
                {
                    "id": "a",
                    "submit_s": 0,
                    "duration_s": 2000,
                    "accelerator": "gb200-nvl72",
                    "chips": 72,
                    "checkpoint_interval_s": 300,
                }
            ],
            "failures": [{"at_s": 700, "pool": "gb200", "domain": 0, "down_s": 600}],
        }
    )
    report = simulate(fleet, jobs, failures)
    assert report["resubmitted_after_failure"] == 1 and report["completed"] == 1
    assert report["overallocations"] == 0


def test_generator_is_deterministic():
    fleet = small_fleet()
    assert generate_jobs(fleet, JobStreamConfig(n=50, seed=1)) == generate_jobs(fleet, JobStreamConfig(n=50, seed=1))
    assert generate_jobs(fleet, JobStreamConfig(n=50, seed=1)) != generate_jobs(fleet, JobStreamConfig(n=50, seed=2))


def test_shipped_jobs_file_is_the_generator_output():
    from marin_assets.cluster.fleet import load_fleet

    shipped = yaml.safe_load((EXAMPLES / "jobs.yaml").read_text())
    assert len(shipped["jobs"]) == 1000
    assert shipped == generate_jobs(load_fleet(EXAMPLES / "fleet.yaml"), JobStreamConfig(n=1000, seed=0))


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_cli_simulate_json_and_refusals(tmp_path, capsys):
    fleet = _write(
        tmp_path,
        "fleet.yaml",
        {"pools": [{"name": "gb200", "accelerator": "gb200-nvl72", "region": "us-central1", "domains": 2}]},
    )
    jobs = _write(
        tmp_path,
        "jobs.yaml",
        {
            "jobs": [
                {"id": "ok", "submit_s": 0, "duration_s": 100, "accelerator": "gb200-nvl72", "chips": 8},
                {"id": "too-big", "submit_s": 0, "duration_s": 100, "accelerator": "gb200-nvl72", "chips": 145},
            ]
        },
    )
    assert main(["cluster", "simulate", "--fleet", fleet, "--jobs", jobs, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] == 1 and report["refused"] == 1
    assert "too-big" in report["refusals"][0] and "largest matching pool has 144" in report["refusals"][0]


@pytest.mark.parametrize(
    "job, needle",
    [
        ({"accelerator": "tpu-v9"}, "unknown accelerator"),
        ({"chips": "8;rm -rf /"}, "marin/chips"),
        ({"region": "$(id)"}, "marin/region"),
    ],
)
def test_cli_bad_jobs_file_is_a_clear_refusal(tmp_path, capsys, job, needle):
    fleet = _write(
        tmp_path,
        "fleet.yaml",
        {"pools": [{"name": "gb200", "accelerator": "gb200-nvl72", "region": "us-central1", "domains": 2}]},
    )
    jobs = _write(
        tmp_path, "jobs.yaml", {"jobs": [{"id": "j1", "submit_s": 0, "duration_s": 100, "accelerator": "gb200-nvl72", **job}]}
    )
    assert main(["cluster", "simulate", "--fleet", fleet, "--jobs", jobs]) == 2
    err = capsys.readouterr().err
    assert "jobs[0]" in err and needle in err


def test_cli_missing_file(capsys, tmp_path):
    assert main(["cluster", "simulate", "--fleet", str(tmp_path / "nope.yaml"), "--jobs", "x"]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_cli_manifest_prints_yaml(capsys):
    assert (
        main(
            [
                "cluster",
                "manifest",
                "--fleet",
                str(EXAMPLES / "fleet.yaml"),
                "--pool",
                "v5e-256",
                "--name",
                "llama",
                "--image",
                "marin:1",
                "python",
                "-m",
                "train",
            ]
        )
        == 0
    )
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Service", "Job"]
