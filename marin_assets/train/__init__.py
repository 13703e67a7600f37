"""Training: one phase of a run on Levanter token caches, with guards and atomic checkpoints.

Public API
----------
train(config, cache_dirs, out_dir, resume=True, warm_start=None, log_fn=None, model=None,
      stop_at_step=None, mesh=None, checkpoint_dir=None, hooks=None) -> TrainResult (loop.py)
      on a ("data", "sequence", "expert") device mesh (distributed/mesh.py; default every global device),
      out_dir (checkpoints, metrics.jsonl, loss curve, train_result.json) a local dir
      or any fsspec URL (checkpoints/checkpoint.py, metrics.py)
train_spec(spec, **options) -> TrainResult: train() on a TrainSpec, what backends and workers call (loop.py)
Hooks().add_hook(fn, every=N, at_end=False): fn(StepInfo) after every Nth global step
      (hooks.py); checkpoints, metrics, stop signals and held-out loss are hooks too
TooManySkippedSteps(RuntimeError): .result, .skipped, .steps                (result.py)
resolve_checkpoint(path) -> checkpoint folder (a folder, an out dir, or checkpoints/) (restore.py)
load_model_from_checkpoint(path) -> (params, ModelConfig, router_bias, meta)      (restore.py)
TrainState(params, opt_state, guard, router_bias, step, rng): a registered pytree (state.py)
Model(init_params, loss_fn, init_router_bias, next_router_bias); moe_model()  (state.py)
TrainConfig, ConfigError, config_from_dict, config_to_dict, load_config, replace (config.py)
TrainSpec, load_spec: one phase's job as backends send it and workers read it   (spec.py)
The data mixture type is marin_assets.datakit.mixture.Mixture.
"""
