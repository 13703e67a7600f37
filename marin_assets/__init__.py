"""marin-assets: a reproducible language-model training lab as one Dagster asset graph.

The library is plain Python; Dagster appears only in ``marin_assets.orchestration``.
"""

# Imported by every process that imports the library: turns off gcsfs's listings cache for
# gs:// (otherwise another process's new file stays invisible and a rewritten one reads back
# truncated; tests/gcs). About 0.15 s, fsspec's import, which every process pays anyway.
import marin_assets.store.fsutil  # noqa: E402,F401

__version__ = "0.1.0"
