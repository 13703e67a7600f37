"""Watch a directory of users' data and register each new (or changed) file as a partition.

The cursor records {file name: sha256} already requested, and every run request carries
a run_key of name + hash, so replaying a tick requests nothing twice.
"""

from __future__ import annotations

import json
import os

import dagster as dg

from assets.user_data import normalized_user, user_files
from marin_assets.store.fsutil import sha256_file
from marin_assets.store import validate_segment

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".txt")
WATCH_ENV = "MARIN_USER_DATA_DIR"


def scan(directory: str) -> tuple[dict[str, str], dict[str, str]]:
    """({file: sha256} of usable files, {file: why skipped}) in ``directory``."""
    usable, skipped = {}, {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or name.startswith("."):
            continue
        if not name.endswith(SUFFIXES):
            skipped[name] = f"unsupported extension (want one of {', '.join(SUFFIXES)})"
            continue
        try:
            validate_segment(name, "file name")
        except ValueError as err:
            skipped[name] = str(err)
            continue
        usable[name] = sha256_file(path)
    return usable, skipped


@dg.sensor(name="new_user_files", target=[normalized_user], minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.STOPPED)
def new_user_files(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    directory = os.environ.get(WATCH_ENV)
    if not directory or not os.path.isdir(directory):
        return dg.SkipReason(f"set {WATCH_ENV} to a directory of .jsonl/.parquet/.txt files to watch")
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    usable, skipped = scan(directory)
    for name, why in skipped.items():
        context.log.warning(f"not ingesting {name}: {why}")
    new = {name: digest for name, digest in usable.items() if seen.get(name) != digest}
    if not new:
        return dg.SkipReason(f"no new files in {directory} ({len(usable)} known, {len(skipped)} skipped)")
    requests = [
        dg.RunRequest(
            run_key=f"{name}@{digest[:16]}",
            partition_key=name,
            run_config={"ops": {"normalized__user": {"config": {"directory": directory, "sha256": digest}}}},
        )
        for name, digest in sorted(new.items())
    ]
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[user_files.build_add_request(sorted(set(new) - set(seen)))],
        cursor=json.dumps({**seen, **new}, sort_keys=True),
    )
