"""The ``kubernetes`` client models, imported on first use, and the conversions between a model
and the JSON the API server takes (``round_trip``, ``to_dicts``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast


class _KubernetesClient:
    """``kubernetes.client``, imported on first use: the ``marin`` command reads the manifest
    knobs (ManifestConfig) for its flags on every start, and the client took 0.7 s to import."""

    def __getattr__(self, name: str) -> Any:
        from kubernetes import client

        return getattr(client, name)


if TYPE_CHECKING:
    from kubernetes import client as k8s
else:
    k8s = _KubernetesClient()


class _Response:
    def __init__(self, data: str) -> None:
        self.data = data


def round_trip(obj: Any) -> Any:
    """Serialize a model to its API JSON and parse it back into the same model class.

    This is what the API server would receive; a wrong field name or type is lost or
    raises here, so equality with the original proves the manifest is well formed.
    """
    api = k8s.ApiClient()
    data = api.sanitize_for_serialization(obj)
    return api.deserialize(_Response(json.dumps(data)), type(obj).__name__)


def to_dicts(objects: Sequence[Any]) -> list[dict[str, Any]]:
    api = k8s.ApiClient()
    """Each model object as the JSON object (a dict) the API server takes."""
    return [cast(dict[str, Any], api.sanitize_for_serialization(o)) for o in objects]  # a model serializes to an object
