"""Kubernetes names and images: refused before any object is built, one line naming the field and the rule."""

from __future__ import annotations

import string
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from marin_assets.cli import main
from marin_assets.cluster.fleet import Pool
from marin_assets.cluster.manifests import check_image, check_k8s_name, cpu_pod, multihost_jax_manifests
from marin_assets.cluster.simulate import jobs_from_dict

FLEET = str(Path(__file__).parents[2] / "examples" / "fleet.yaml")
V5E = Pool("v5e-256", "tpu-v5e", "us-west4", 1, topology="16x16")  # one slice of 64 hosts
GB200 = Pool("gb200", "gb200-nvl72", "us-central1", 11)  # racks of 18 hosts


def _is_label(value: str, *, letter_first: bool) -> bool:
    """The DNS label rules spelled out character by character (RFC 1035 / RFC 1123 as Kubernetes applies them)."""
    allowed = set(string.ascii_lowercase + string.digits + "-")
    first_ok = string.ascii_lowercase if letter_first else string.ascii_lowercase + string.digits
    return (
        0 < len(value) <= 63
        and set(value) <= allowed
        and value[0] in first_ok
        and value[-1] in string.ascii_lowercase + string.digits
    )


_name_text = st.text(alphabet=string.ascii_lowercase[:4] + "09-A_.\n é", max_size=70)
_long_names = st.integers(min_value=55, max_value=70).map(lambda n: "a" * n)


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(_name_text, _long_names), rule=st.sampled_from(["DNS-1035 label", "DNS-1123 label"]))
def test_name_validator_matches_the_dns_label_rules(value, rule):
    expected = _is_label(value, letter_first=rule == "DNS-1035 label")
    try:
        assert check_k8s_name("job name", value, rule) == value
    except ValueError as err:
        assert not expected, f"{value!r} is a {rule} but was refused"
        message = str(err)
        assert message.startswith("job name ") and f"is not a {rule}" in message and "\n" not in message
        return
    assert expected, f"{value!r} is not a {rule} but was accepted"


def _validate_strict(obj) -> None:
    d = k8s.ApiClient().sanitize_for_serialization(obj)
    assert kubernetes_validate.validate(d, "1.32", strict=True) == "1.32"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.one_of(_name_text, _long_names), domains=st.integers(min_value=1, max_value=11))
def test_every_generated_name_keeps_its_rule_or_the_name_is_refused(name, domains):
    """Service: DNS-1035 label; Jobs and pod hostnames <job>-<index>: DNS-1123 labels of <= 63 characters."""
    try:
        objs = multihost_jax_manifests(name, GB200, image="marin:1", command=["python"], domains=domains)
    except ValueError as err:
        assert str(err).startswith("job name ") and "\n" not in str(err)
        assert not _is_label(name, letter_first=True) or len(f"{name}-r{domains - 1}-17") > 63
        return
    assert _is_label(name, letter_first=True)
    service = next(o for o in objs if getattr(o, "kind", None) == "Service")
    jobs = [o for o in objs if getattr(o, "kind", None) == "Job"]
    assert _is_label(service.metadata.name, letter_first=True)
    for job in jobs:
        assert _is_label(job.metadata.name, letter_first=False)
        assert all(_is_label(f"{job.metadata.name}-{i}", letter_first=False) for i in range(job.spec.completions))
        _validate_strict(job)
    _validate_strict(service)


@pytest.mark.parametrize(
    "name, needle",
    [
        ("1job", "job name '1job' is not a DNS-1035 label"),  # a DNS-1123 label, but a Service name must start with a letter
        ("Job", "job name 'Job' is not a DNS-1035 label"),
        ("llama-", "job name 'llama-' is not a DNS-1035 label"),
        ("a" * 64, "is not a DNS-1035 label (at most 63 characters"),
        ("llama\n", "job name 'llama\\n' is not a DNS-1035 label"),
        ("", "job name '' is not a DNS-1035 label"),
        ("a" * 58, "pod hostname '" + "a" * 58 + "-r0-63' would be 64 characters"),  # 64 hosts: suffix -r0-63
    ],
)
def test_bad_job_names_are_refused_naming_the_rule(name, needle):
    with pytest.raises(ValueError) as err:
        multihost_jax_manifests(name, V5E, image="marin:1", command=["python"])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_longest_name_the_hostnames_allow_is_accepted_and_validates():
    objs = multihost_jax_manifests("a" * 57, V5E, image="marin:1", command=["python"])  # a...a-r0-63: 63 chars
    for obj in objs:
        _validate_strict(obj)
    assert objs[1].metadata.name == "a" * 57 + "-r0"


@pytest.mark.parametrize(
    "image", ["", " marin:1", "marin:1 ", "Marin:1", "marin:1\n", "a//b", "marin:", "marin:ä", "marin@sha256:abc", "a" * 256]
)
def test_bad_images_are_refused(image):
    with pytest.raises(ValueError, match=r"^image .* is not a container image reference"):
        multihost_jax_manifests("llama", V5E, image=image, command=["python"])
    with pytest.raises(ValueError, match=r"^image "):
        cpu_pod("step", image=image, command=["python"], cores=1, memory_gib=1)


@pytest.mark.parametrize(
    "image",
    [
        "marin:1",
        "us-docker.pkg.dev/proj/repo/marin:v1.2_x",
        "localhost:5000/a/b",
        "ghcr.io/o/marin@sha256:" + "0" * 64,
        "[::1]:5000/x:y",
        "a" * 255,
    ],
)
def test_image_references_are_accepted(image):
    assert check_image(image) == image
    [pod_container] = cpu_pod("step", image=image, command=["python"], cores=1, memory_gib=1).spec.containers
    assert pod_container.image == image


def test_cpu_pod_name_is_a_hostname():
    with pytest.raises(ValueError, match="pod name 'Step' is not a DNS-1123 label"):
        cpu_pod("Step", image="marin:1", command=["python"], cores=1, memory_gib=1)
    assert cpu_pod("1step", image="marin:1", command=["python"], cores=1, memory_gib=1).metadata.name == "1step"


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--name", "1job", "--image", "marin:1"], "job name '1job' is not a DNS-1035 label"),
        (["--name", "llama", "--image", ""], "image '' is not a container image reference"),
        (["--name", "llama", "--image", "marin:1", "--namespace", "Prod"], "namespace 'Prod' is not a DNS-1123 label"),
    ],
)
def test_manifest_cli_refuses_before_printing_anything(capsys, flags, needle):
    assert main(["cluster", "manifest", "--fleet", FLEET, "--pool", "v5e-256", *flags, "--", "python"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("marin cluster manifest: ") and needle in err and err.count("\n") == 1


def test_gen_jobs_out_makes_a_missing_folder(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "jobs.yaml"
    assert main(["cluster", "gen-jobs", "--fleet", FLEET, "-n", "5", "--out", str(out)]) == 0
    jobs, _ = jobs_from_dict(yaml.safe_load(out.read_text()), source=str(out))
    assert [j.id for j in jobs] == [f"job-{i:04d}" for i in range(5)]


@pytest.mark.parametrize(
    "layout, needle",
    [
        ("dir", "Is a directory"),  # --out names an existing folder
        ("file-parent", "File exists"),  # a file stands where the folder would go
    ],
)
def test_gen_jobs_out_that_cannot_be_written_is_one_line(tmp_path, capsys, layout, needle):
    (tmp_path / "f").write_text("x")
    out = tmp_path if layout == "dir" else tmp_path / "f" / "jobs.yaml"
    assert main(["cluster", "gen-jobs", "--fleet", FLEET, "-n", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"marin cluster gen-jobs: --out {out}: {needle}") and err.count("\n") == 1
