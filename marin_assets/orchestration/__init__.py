"""The Dagster glue: the versioned-asset factory, the artifact IO manager and resources.

This is the only part of the library that imports dagster.
"""

from marin_assets.orchestration.resources import ArtifactIOManager, ArtifactStoreResource, training_backend_from_env
from marin_assets.orchestration.versioned import StageConfig, StageContext, png_markdown, versioned, versioned_asset

__all__ = [
    "ArtifactIOManager",
    "ArtifactStoreResource",
    "StageConfig",
    "StageContext",
    "png_markdown",
    "training_backend_from_env",
    "versioned",
    "versioned_asset",
]
