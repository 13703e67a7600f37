"""Scaling laws ("Delphi"): IsoFLOP sweeps, robust fits, power laws, extrapolation, plots.

Public API (no dagster here; the orchestration layer wraps these as assets)
----------
data.validate_runs(params, tokens=None, flops=None, loss, source) -> Runs   (C = 6 N D fills the gap)
data.load_runs_csv(path) -> Runs          columns params|Model Size, tokens|flops|Training FLOP, loss
data.drop_highest_loss(runs, k) -> Runs   Runs.excluded: [{"row", "reason"}]
data.bucket_flops(flops, base=1.1)        Marin's log-spaced budget buckets
recipes.V1 / V2 / get_recipe(name) -> Recipe: optimizer, init and peak LR over (width, steps), as data
planner.plan_sweep(budgets, ModelFamily(..., recipe=V2), tolerance=0.04) -> SweepPlan(candidates, skipped)
ladder.Ladder(name, budgets, widths, targets, family, seeds); fit_ladder
lr_sweep.run_lr_sweep / resolve_recipe: the reference LR of a recipe tuned by sweep (v2)
ladder_predict.predict_target / frozen_candidate: a target's run and its loss, as frozen (files: store.artifact_files)
extrapolation.register_prediction / require_frozen / check_stamp (the experiment-record lock), compare
fits.fit_isoflop(runs, IsoFlopConfig(...)) -> IsoFlopResult (.as_dict() is the CLI JSON)
parametric.fit_parametric(params, tokens, loss, ParametricFitConfig()) -> ParametricFit
parametric.fit_parametric_with_ci(runs, config, BootstrapConfig(n, seed)) -> dict
predict.predict_optimum(isoflop_result, budget) -> Prediction(budget, params_opt, tokens_opt, loss)
predict.predict_parametric(fit, budget), predict.relative_error(predicted, actual)
plots.plot_isoflop_curves / plot_power_laws / plot_predicted_vs_actual / plot_extrapolation -> PNG bytes
"""
