"""A tiny code location for the launcher tests (loaded by path into a gRPC code server)."""

from dagster import Definitions, job, op


@op
def add_one() -> int:
    return 1 + 1


@job
def tiny_job():
    add_one()


defs = Definitions(jobs=[tiny_job])
