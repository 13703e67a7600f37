"""The worker ``marin train --processes`` launches: ``marin_assets.train.distributed.worker`` without reports, able to
warm start from an HF model folder (``hf:PATH``).

    python -m marin_assets.cli._train_worker --spec SPEC.json

``train`` knows ``hf:PATH`` only as a string: hf sits above it (docs/layers.md), so the entry point hands
the worker ``marin_assets.hf.warm_start_weights``, as the backends' ``pipes_worker`` does. Not a
subcommand (the leading underscore keeps it out of ``marin``'s command list).
"""

from __future__ import annotations

from marin_assets.hf import warm_start_weights
from marin_assets.train.distributed import worker


def main(argv: list[str] | None = None) -> int:
    return worker.main(argv, prog=f"python -m {__name__}", read_weights=warm_start_weights)


if __name__ == "__main__":
    raise SystemExit(main())
