"""Experiments: written hypotheses, screening runs, effective speedup (no Dagster here).

record_files.load_record(path) -> ExperimentRecord experiments/<name>.yaml, validated (record.py: its types)
lock.check_lock(store, record) / lock_arm(...)     started experiments are immutable
data.materialize_corpus(store, n_files) -> Corpus  the DataKit dataset of n standard-library files
runs.plan_runs(record, vocab_size) -> [RunSpec]    one per (arm, budget, seed)
runs.materialize_run(store, record, spec, corpus)  content-cached training run + validation loss
speedup.screen(run_losses) -> (fit, {arm: ArmSpeedup}, noise floor)
analysis.analyze(record, rows) / render_report(record, analysis)
screen.run_screen(record, store) -> analysis dict  everything above, in process
"""
