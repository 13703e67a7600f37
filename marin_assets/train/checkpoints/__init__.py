"""A phase's checkpoints: the atomic whole-state format and its commit rule (checkpoint.py), the sharded
asynchronous one (sharded_checkpoint.py), when they are written (checkpointing.py), which may go (retention.py),
the one-writer lease on a work dir (work_dir.py), and the tools that rewrite one: necromancy.py (a rebuilt
optimizer state) and transplant.py (parameters carried into another architecture)."""
