"""What the API server and the container runtime would refuse, checked before any Kubernetes
object is built: object names, pod hostnames, image references and commands. A bad value is a
one-line ValueError here, not a rejected object halfway through a launch."""

from __future__ import annotations

import re
from collections.abc import Sequence


def check_command(command: Sequence[str]) -> list[str]:
    """``command`` as a list, if it is a non-empty list of strings (never a shell string)."""
    if isinstance(command, str) or not command or not all(isinstance(a, str) for a in command):
        raise ValueError("command must be a non-empty list of strings (it is never run through a shell)")
    return list(command)


# Object-name rules, from https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
# (fullmatch; "$" would accept a trailing newline). Each value: (pattern, max length, what it says).
K8S_NAME_RULES = {
    # Service names; a Service name becomes a DNS label, so it must start with a letter.
    "DNS-1035 label": (
        re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?"),
        63,
        "lower-case letters, digits and '-', starting with a letter and ending with a letter or digit",
    ),
    # Namespaces and pod hostnames.
    "DNS-1123 label": (
        re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"),
        63,
        "lower-case letters, digits and '-', starting and ending with a letter or digit",
    ),
}


def check_k8s_name(field: str, value: str, rule: str) -> str:
    """``value`` if it is a valid ``rule`` name (a key of K8S_NAME_RULES), else a ValueError naming ``field``."""
    pattern, max_len, says = K8S_NAME_RULES[rule]
    if not isinstance(value, str) or not pattern.fullmatch(value) or len(value) > max_len:
        shown = repr(value[:80]) if isinstance(value, str) else repr(value)
        raise ValueError(f"{field} {shown} is not a {rule} (at most {max_len} characters: {says})")
    return value


# The image reference grammar of github.com/distribution/reference (reference.go), which the
# container runtime parses before a pull: [domain/]path[:tag][@digest], the name at most 255 characters.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"(?P<name>(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,  # the grammar's \w is [A-Za-z0-9_]; Python's would take any Unicode letter
)
IMAGE_NAME_MAX = 255


def check_image(image: str) -> str:
    """``image`` if it is a container image reference (``[registry/]path[:tag][@digest]``), else a ValueError."""
    match = _IMAGE_RE.fullmatch(image) if isinstance(image, str) else None
    if match is None or len(match.group("name")) > IMAGE_NAME_MAX:
        shown = repr(image[:80]) if isinstance(image, str) else repr(image)
        raise ValueError(
            f"image {shown} is not a container image reference like 'us-docker.pkg.dev/p/repo/marin:1' "
            f"([registry/]path[:tag][@digest], lower-case path, name at most {IMAGE_NAME_MAX} characters)"
        )
    return image


def check_job_name(name: str) -> str:
    """``name`` if it can name a multi-host job: it is also the headless Service's name, so a DNS-1035 label."""
    return check_k8s_name("job name", name, "DNS-1035 label")


def check_pod_hostnames(name: str, domains: int, hosts: int) -> None:
    """A ValueError when the longest pod hostname of job ``name`` would not fit a DNS-1123 label."""
    # Indexed Job pods are named and hostnamed <job>-<index> with <job> = <name>-r<domain>. The Job docs
    # (kubernetes.io/docs/concepts/workloads/controllers/job/) ask for DNS-label Job names of at most
    # 63 characters, and a pod hostname is a DNS-1123 label: the longest of them decides.
    longest = f"{name}-r{domains - 1}-{hosts - 1}"
    if len(longest) > 63:
        raise ValueError(
            f"job name {name!r} is too long for {domains} domain(s) of {hosts} host(s): "
            f"pod hostname {longest!r} would be {len(longest)} characters, and a pod hostname "
            f"is a DNS-1123 label of at most 63 (shorten the name by {len(longest) - 63})"
        )
