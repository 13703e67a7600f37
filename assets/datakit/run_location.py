"""The code location of one `marin datakit run`: its graph over its inputs and its store, so
the Dagster UI can draw the lineage of what the run materialised.

    MARIN_DATAKIT_PREFIX=P DAGSTER_HOME=H dagster dev -m assets.datakit.run_location

A run made with DAGSTER_HOME=H set records its runs and materializations in H's instance
(assets/datakit/run.py); this module gives the UI the asset definitions they belong to,
rebuilt from PREFIX/run.json (the run's spec), from the user's files to the dataset index.
The run's shard partitions are its own (user_inputs.shard_partitions), so a run recorded in
the demo's instance leaves the code location's datakit_shards alone.
"""

from __future__ import annotations

import dagster as dg

from assets.datakit.user_inputs import user_graph
from marin_assets.datakit.run_spec import RUN_FILE, STORE_ENTRY, RunSpec
from marin_assets.datakit.shards import join
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.settings import setting
from marin_assets.store.fsutil import filesystem

PREFIX_ENV = "MARIN_DATAKIT_PREFIX"


def definitions_for(prefix: str) -> dg.Definitions:
    """The Definitions of the run whose --prefix was ``prefix``."""

    fs, path = filesystem(join(prefix, RUN_FILE))
    try:
        with fs.open(path, "rb") as f:
            data = f.read()
        spec = RunSpec.from_json(data.decode("utf-8") if isinstance(data, bytes) else data)
    except FileNotFoundError:
        raise FileNotFoundError(f"{join(prefix, RUN_FILE)}: no `marin datakit run` has finished into {prefix}") from None
    assets, checks, _ = user_graph(spec)
    store = ArtifactStoreResource(prefix=join(prefix, STORE_ENTRY))
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )


_prefix = setting(PREFIX_ENV)
defs = definitions_for(_prefix) if _prefix else dg.Definitions()
