"""marin-assets: a reproducible language-model training lab as one Dagster asset graph.

The library is plain Python; Dagster appears only in ``marin_assets.orchestration``.
"""

__version__ = "0.1.0"
