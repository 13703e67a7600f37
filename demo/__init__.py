"""What `make demo` runs, from the definition layer: ``python -m demo`` (via `marin demo`).

It imports ``defs`` from definitions.py like any user code would, runs the data job, then
drives the phase controller through the Tootsie run (demo/phases.py) and materialises the
scaling ladder (demo/scaling.py), printing one line per asset as it finishes
(demo/progress.py) while Dagster's event stream goes to a log file under $DAGSTER_HOME.
"""
