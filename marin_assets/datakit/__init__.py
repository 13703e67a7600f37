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

The dedup stages are also exposed as the partitioned steps per-shard assets call (each
reads only its slice of the others' output; results are per-shard removal lists whose
digest versions what follows, see removals.py):

    dedup_exact.exact_map(key, shard, map_root)      per shard
    dedup_exact.exact_reduce(bucket, map_roots, reduce_root)         per hash bucket
    dedup_exact.exact_removals(key, reduce_roots, out_path)          per shard -> list
    fuzzy_dedup.fuzzy_map(key, shard, map_root)      per shard (band keys)
    fuzzy_dedup.fuzzy_band_reduce(band, (r, R), map_roots, out_root) per band x key range
    fuzzy_dedup.fuzzy_verify(key, cand_roots, shard_paths, out_path) per shard (exact Jaccard)
      (the files between the band reduces and the verifies: fuzzy_candidates.py)
    fuzzy_dedup.fuzzy_resolve(edge_paths, removals_root)             once -> a list per shard
    removals.apply_removals(shard, lists, out_path)                  per shard (the filter)

Modules import their heavy dependencies inside functions so importing the package is cheap.
"""
