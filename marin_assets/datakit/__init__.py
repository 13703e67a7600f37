"""DataKit: the data pipeline as pure library functions (no Dagster here).

Each stage takes input paths (any fsspec URL), an out_dir and a config dataclass, writes
files there and returns a dict of counts:

    sources.materialize_source(name, out_dir, cache_dir)          raw JSONL shards
    normalize.normalize(input_paths, out_dir, NormalizeConfig)     Parquet contract shards
    quality.train_quality_model(high, low, out_dir, config)        classifier artifact
    quality.score_quality(shards, model_dir, out_dir, config)      attribute shards
    dedup_exact.exact_dedup(datasets, out_dir, config)             attribute shards
    fuzzy_dedup.fuzzy_dedup(shards, out_dir, config)               attribute shards
    decontaminate.decontaminate(shards, index, out_dir, config)    attribute shards
    tokenize.train_tokenizer / tokenize                            tokenizer.json, Levanter cache
    pipeline.run_pipeline(inputs, evals, prefix, config)           all of it (`marin datakit run`)

Modules import their heavy dependencies inside functions so importing the package is cheap.
"""
