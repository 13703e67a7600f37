"""DataKit: the data pipeline as pure library functions (no Dagster here).

Every function is a step of the sharded asset graph (assets/datakit/): a shard is the unit
of work and of caching, the global steps are reduces over hash buckets and LSH bands, and
each reads only its slice of the others' output. Results are per-shard removal lists whose
digest versions what follows (removals.py), so a new shard recomputes its own chain and the
reduces, never the other shards' tokens.

    sources.materialize_source(name, out_dir, cache_dir)       pinned demo sources -> raw JSONL
    shard_index.split_source(name, raw_files, out_dir, bytes)   raw files -> shard files
    normalize.normalize(input_paths, out_dir, NormalizeConfig)  per shard: Parquet contract
    quality.train_on_labelled_sources / score_quality           classifier; per shard: scores
    quality_fasttext.import_fasttext_model(bin, label, out_dir) a user's fastText classifier as the model
    pii.mask_shard(shard, out)                                  per shard: e-mails, phones, IPs masked
    language.identify_languages(shards, out_dir, config)        per shard: language attributes
    dedup_exact.exact_map / exact_reduce / exact_removals       per shard / per bucket / per shard
    fuzzy_dedup.fuzzy_map / fuzzy_band_reduce / fuzzy_verify / fuzzy_resolve
                                                                per shard / per band / per shard / once
    decontaminate.decontaminate(shards, index, out_dir)         per shard: eval n-gram overlap
    removals.apply_removals(shard, lists, out_path)             per shard: the filters
    tokenize.tokenize(shards, tokenizer, out_dir)               per shard: a Levanter cache
    datasets.write_dataset / read_dataset                       a source's shard caches, indexed
    mixture.Mixture                                             weights over datasets

Modules import their heavy dependencies inside functions so importing the package is cheap.
"""
