"""Watch a directory of users' data and register each new (or changed) file as a partition.

The cursor records {file name: sha256} already requested, and every run request carries
a run_key of name + hash, so replaying a tick requests nothing twice. An entry whose real
path leaves the directory (a symlink to /etc/passwd, say) is skipped with the reason.

``new_files_sensor(asset)`` builds one for any asset partitioned by a dynamic partition
set of file names whose config takes ``directory`` and ``sha256``; definitions.py builds
the one for normalized/user.
"""

from __future__ import annotations

import json
import os

import dagster as dg

from marin_assets.datakit.watched_dir import SUFFIXES, WATCH_ENV, directory_digest, scan

__all__ = ["SUFFIXES", "WATCH_ENV", "directory_digest", "new_files_sensor", "scan"]

def new_files_sensor(asset: dg.AssetsDefinition, *, name: str = "new_user_files", watch_env: str = WATCH_ENV,
                     minimum_interval_seconds: int = 30) -> dg.SensorDefinition:
    """A sensor that adds each new or changed file in ``$watch_env`` as a partition of ``asset``
    and requests its run with {"directory", "sha256"} as the asset's config."""
    partitions = asset.partitions_def
    if not isinstance(partitions, dg.DynamicPartitionsDefinition):
        raise ValueError(f"new_files_sensor: {asset.key.to_user_string()} must have dynamic partitions (one per file)")
    op_name = asset.op.name

    @dg.sensor(name=name, target=[asset], minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.STOPPED, description=f"New files in ${watch_env} -> {asset.key.to_user_string()}")
    def _new_files(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        directory = os.environ.get(watch_env)
        if not directory or not os.path.isdir(directory):
            return dg.SkipReason(f"set {watch_env} to a directory of .jsonl/.parquet/.txt files to watch")
        seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        usable, skipped = scan(directory)
        for file, why in skipped.items():
            context.log.warning(f"not ingesting {file}: {why}")
        new = {file: digest for file, digest in usable.items() if seen.get(file) != digest}
        if not new:
            return dg.SkipReason(f"no new files in {directory} ({len(usable)} known, {len(skipped)} skipped)")
        requests = [
            dg.RunRequest(run_key=f"{file}@{digest[:16]}", partition_key=file,
                          run_config={"ops": {op_name: {"config": {"directory": directory, "sha256": digest}}}})
            for file, digest in sorted(new.items())
        ]
        return dg.SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=[partitions.build_add_request(sorted(set(new) - set(seen)))],
            cursor=json.dumps({**seen, **new}, sort_keys=True),
        )

    return _new_files
