"""Scaling laws as assets: an IsoFLOP ladder of tiny runs, the fit, the prediction, its check.

    final_documents -> scaling/tokenizer    (a capped document sample + a small-vocab BPE)
                    -> scaling/tokenized    (per-source caches of that sample)
    -> sweep[C<budget>-d<width>]            (one training run per partition)
              -> scaling_fit                (IsoFLOP fit on the smaller budgets only)
              -> prediction                 (optimal config and loss at the largest budget)
              -> check prediction_error     (vs the best sweep run actually at that budget)

Partitions: a ``MultiPartitionsDefinition`` would name a partition "C1e11|d32", and the
artifact store refuses "|" in a path segment, so the ladder is one static partition set
with keys ``C<budget>-d<width>`` (e.g. ``C2e11-d48``). That also lets each budget carry its
own widths, as in Marin's IsoFLOP sweeps, where the window of sizes moves up with compute.

``scaling_fit`` depends only on the partitions of the budgets it fits (a
``SpecificPartitionsPartitionMapping``), so the prediction can be made - and versioned -
before the largest budget's runs exist; the check reads those runs from the store once
they are there.

The ladder trains on its own small-vocabulary data: with the demo's 4096-token BPE the LM
head is most of a tiny model's FLOPs, so the narrowest model won every CPU-sized budget and
no budget had an interior optimum.

Everything after the data is built by ``build_scaling_assets(ladder)``; the module-level
``scaling_assets`` (data + ladder) / ``scaling_checks`` are the demo's CPU ladder
(``DEMO_LADDER``), ``scaling_job`` selects them all, and ``run_ladder(defs, instance)``
materialises the whole ladder in process (for ``marin demo``).
"""

from __future__ import annotations

import base64
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import dagster as dg

from marin_assets.orchestration import ArtifactStoreResource, StageConfig, StageContext, versioned, versioned_asset
from marin_assets.scaling.sweep import (_write_bytes, _write_text, budget_label, parse_partition_key, partition_key,
                                        run_sweep_point, sample_documents)
from marin_assets.store import ArtifactRef

SCALING_GROUP = "scaling"


@dataclass(frozen=True)
class Ladder:
    """The static shape of a sweep: budgets (FLOPs), the widths tried at each, which to fit on.

    ``widths[i]`` are the model widths run at ``budgets[i]``; ``fit_budgets`` are the budgets
    the fit sees (default: all but the largest, which is kept for the prediction check).
    """

    budgets: tuple[float, ...]
    widths: tuple[tuple[int, ...], ...]
    fit_budgets: tuple[float, ...] | None = None
    max_relative_error: float = 0.05  # the check fails above this |predicted - actual| / actual

    def __post_init__(self) -> None:
        if len(self.budgets) < 3:
            raise ValueError(f"Ladder needs >= 3 budgets (>= 2 to fit, 1 to predict), got {len(self.budgets)}")
        if len(self.widths) != len(self.budgets):
            raise ValueError(f"Ladder: {len(self.budgets)} budgets but {len(self.widths)} width lists")
        labels = [budget_label(b) for b in self.budgets]
        if len(set(labels)) != len(labels) or list(self.budgets) != sorted(self.budgets):
            raise ValueError(f"Ladder budgets must be increasing and distinct at 2 significant digits: {labels}")
        fit = self.fit_labels
        for b, ws in zip(labels, self.widths):
            if len(set(ws)) != len(ws) or not ws or (b in fit and len(ws) < 3):
                raise ValueError(f"Ladder budget {b}: need distinct widths, >= 3 on a fitted budget, got {ws}")
        if len(fit) < 2:
            raise ValueError(f"Ladder: need >= 2 fit budgets for the power laws, got {fit}")
        if not set(fit) <= set(labels):
            raise ValueError(f"Ladder.fit_budgets {sorted(set(fit) - set(labels))} are not ladder budgets {labels}")
        if self.target_label in fit:
            raise ValueError(f"Ladder: the predicted budget {self.target_label} must not be fitted on")
        if not self.max_relative_error > 0:
            raise ValueError(f"Ladder.max_relative_error must be > 0, got {self.max_relative_error}")

    @property
    def fit_labels(self) -> list[str]:
        chosen = self.budgets[:-1] if self.fit_budgets is None else self.fit_budgets
        return [budget_label(b) for b in chosen]

    @property
    def target(self) -> float:
        return max(self.budgets)

    @property
    def target_label(self) -> str:
        return budget_label(self.target)

    def keys(self, labels: Sequence[str] | None = None) -> list[str]:
        wanted = set(labels) if labels is not None else None
        return [partition_key(b, w) for b, ws in zip(self.budgets, self.widths)
                if wanted is None or budget_label(b) in wanted for w in ws]

    @property
    def fit_keys(self) -> list[str]:
        return self.keys(self.fit_labels)

    @property
    def target_keys(self) -> list[str]:
        return self.keys([self.target_label])


# Tiny dense 1-layer models (seq 64, head 8, batch 16, peak LR 1e-2) on the ladder's own
# 384-token BPE sample of the demo documents: 4 budgets a factor 2 apart, widths a factor 2
# apart, the envelope fitted on 3 budgets and extrapolated to the 4th. The small vocabulary
# keeps the LM head from dominating the FLOPs (with the demo's 4096-token BPE the narrowest
# width won every budget). Measured (one loaded CPU core, ~3 min for the whole ladder):
# validation loss d8/d16/d32 = 4.54/4.34/4.79 at 1e10, 4.28/4.21/4.42 at 2e10, 4.22/3.99/4.02
# at 4e10 (every fitted budget has an interior vertex); predicted 3.812 at 8e10 vs the best
# actual 3.736 (d16): +2.0%. Narrower width steps (16/24/32) were inside the run-to-run noise.
DEMO_LADDER = Ladder(
    budgets=(1e10, 2e10, 4e10, 8e10),
    widths=((8, 16, 32),) * 4,
)


def _read_json(ref: ArtifactRef, name: str) -> dict:
    import fsspec

    with fsspec.open(f"{ref.data_path.rstrip('/')}/{name}", "r") as f:
        return json.load(f)


def _read_bytes(ref: ArtifactRef, name: str) -> bytes:
    import fsspec

    with fsspec.open(f"{ref.data_path.rstrip('/')}/{name}", "rb") as f:
        return f.read()


def tokenizer_vocab_size(tokenized: ArtifactRef) -> int:
    """The vocabulary the caches were tokenized with (each source's stats.json records it)."""
    sizes = {}
    for source in sorted(tokenized.counts.get("tokens", {})):
        try:
            sizes[source] = int(_read_json(tokenized, f"{source}/stats.json")["vocab_size"])
        except (FileNotFoundError, KeyError) as e:
            raise ValueError(f"tokenized source {source!r}: no vocab_size in {tokenized.data_path}/{source}/stats.json "
                             f"({e!r}); set the sweep's vocab_size explicitly") from None
    if len(set(sizes.values())) != 1:
        raise ValueError(f"tokenized sources disagree on the vocabulary size: {sizes}")
    return sizes.popitem()[1]


def caches_of(tokenized: ArtifactRef, split: str) -> dict[str, str]:
    """{source: <data_path>/<source>/<split>} for every source the tokenized asset counted."""
    sources = sorted(tokenized.counts.get("tokens", {}))
    if not sources:
        raise ValueError(f"tokenized artifact {tokenized.path} lists no sources in counts['tokens']")
    return {s: f"{tokenized.data_path.rstrip('/')}/{s}/{split}" for s in sources}


# ---------------------------------------------------------------- fit and prediction (no dagster)


def runs_from_counts(counts_by_key: Mapping[str, Mapping[str, Any]]):
    """The fits' ``Runs`` from sweep partitions' counts (validation loss is the fitted loss)."""
    from marin_assets.scaling.data import validate_runs

    keys = sorted(counts_by_key)
    col = lambda name: [counts_by_key[k].get(name) for k in keys]
    return validate_runs(params=col("params"), tokens=col("tokens"), flops=col("flops"),
                         loss=col("validation_loss"), source="sweep"), keys


def loss_law(result) -> dict:
    """How the optimum's loss extrapolates: the envelope E + A C^-alpha when it was fitted
    (>= 3 budgets), else a pure power law L = k C^a through the optima (stated as such)."""
    from marin_assets.scaling.fits import fit_power_law

    if result.envelope is not None:
        e = result.envelope
        return {"kind": "envelope", "E": e.E, "A": e.A, "alpha": e.alpha}
    law = fit_power_law([o.budget for o in result.optima], [o.loss_opt for o in result.optima])
    return {"kind": "power_law", "k": law.k, "exponent": law.exponent, "note": result.envelope_note}


def loss_at(law: Mapping[str, Any], budget: float) -> float:
    if law["kind"] == "envelope":
        return float(law["E"] + law["A"] * budget ** (-law["alpha"]))
    return float(law["k"] * budget ** law["exponent"])


def nearest_config(budget: float, params_opt: float, config: "PredictionConfig", vocab_size: int) -> dict | None:
    """The family member (planned at ``budget``) whose parameter count is closest to N*."""
    from marin_assets.scaling.planner import ModelFamily, plan_sweep

    sweep = config.sweep
    family = ModelFamily(
        widths=tuple(range(sweep.head_dim, config.max_width + 1, sweep.head_dim)), vocab_size=vocab_size,
        seq_len=sweep.seq_len, head_dim=sweep.head_dim, aspect_ratio=sweep.aspect_ratio,
        batch_sizes=tuple(sweep.batch_sizes), min_steps=sweep.min_steps, lr_base=sweep.lr_base,
        lr_ref_width=sweep.lr_ref_width,
    )
    plan = plan_sweep([budget], family, tolerance=sweep.tolerance)
    if not plan.candidates:
        return None
    best = min(plan.candidates, key=lambda c: abs(math.log(c.params / params_opt)))
    return best.as_dict()


def _png_markdown(title: str, png: bytes) -> dg.MetadataValue:
    return dg.MetadataValue.md(f"**{title}**\n\n![{title}](data:image/png;base64,{base64.b64encode(png).decode()})")


# ---------------------------------------------------------------- configs


class SweepConfig(StageConfig):
    vocab_size: int = versioned(0, description="model vocabulary; 0 = the tokenizer's, read from the caches' stats.json")
    seq_len: int = versioned(64)
    head_dim: int = versioned(8)
    aspect_ratio: float = versioned(128.0, description="d_model / n_layers; 128 keeps these tiny models at 1 layer")
    batch_sizes: list[int] = versioned([16], description="sequences per step the planner may pick (small: more steps per FLOP)")
    min_steps: int = versioned(50)
    tolerance: float = versioned(0.04, description="planned FLOPs within this fraction of the budget")
    lr_base: float = versioned(1e-2, description="2e-2 diverges on some of these runs, 4e-3 is noisier")
    lr_ref_width: int = versioned(1024, description="LR shrinks as 1/width only above this width")
    decay_fraction: float = versioned(0.2, description="WSD: last fraction of steps decays the LR")
    skip_sigma: float = versioned(0.0, description="loss-spike skip test of the training guards; 0 = off. On these short "
                                                  "mixed-source runs the test froze whole runs (hundreds of skipped steps)")
    seed: int = versioned(0)
    validation_windows: int = versioned(256, description="held-out windows of seq_len per source")


class FitConfig(StageConfig):
    fit_budgets: list[str] = versioned([], description="budget labels (e.g. '1e11') to fit; [] = every budget the fit reads")
    huber_delta: float = versioned(0.01)
    bucket_base: float = versioned(1.1)
    bootstrap_n: int = versioned(100, description="bootstrap resamples for the confidence intervals")


class PredictionConfig(StageConfig):
    sweep: SweepConfig = versioned(SweepConfig(), description="the family to pick the predicted config from")
    max_width: int = versioned(512)


class ScalingDataConfig(StageConfig):
    vocab_size: int = versioned(384, description="BPE vocabulary of the ladder's own tokenizer: small, so the LM head "
                                                 "does not dominate the FLOPs of these tiny models")
    max_chars_per_source: int = versioned(2_000_000, description="document cap: whole documents per source up to this many characters")


class ScalingTokenizedConfig(StageConfig):
    validation_fraction: float = versioned(0.05, description="held-out share of documents (by id hash)")


# ---------------------------------------------------------------- the assets


@versioned_asset(key="scaling/tokenizer", code_version="1", config_cls=ScalingDataConfig,
                 ins={"docs": "final_documents"}, group_name=SCALING_GROUP)
def scaling_tokenizer(ctx: StageContext, config: ScalingDataConfig, docs: ArtifactRef):
    """The ladder's data: a capped sample of the final documents (docs/<source>/) and a
    small-vocabulary BPE trained on it (tokenizer.json)."""
    from marin_assets.datakit.shards import join, list_shards
    from marin_assets.datakit.tokenize import TokenizerTrainConfig, train_tokenizer

    sample = sample_documents(list_shards(docs.data_path), join(ctx.out_dir, "docs"), config.max_chars_per_source)
    shards = [p for source in sample for p in list_shards(join(ctx.out_dir, "docs", source))]
    tok = train_tokenizer(shards, ctx.out_dir, TokenizerTrainConfig(vocab_size=config.vocab_size))
    ctx.log(f"scaling/tokenizer: vocab {tok['vocab_size']} on {sample}")
    return {**tok, "documents": {s: v["documents"] for s, v in sample.items()},
            "chars": {s: v["chars"] for s, v in sample.items()}}


@versioned_asset(key="scaling/tokenized", code_version="1", config_cls=ScalingTokenizedConfig,
                 ins={"tok": "scaling/tokenizer"}, group_name=SCALING_GROUP)
def scaling_tokenized(ctx: StageContext, config: ScalingTokenizedConfig, tok: ArtifactRef):
    """One Levanter cache per source of the ladder's sample: <source>/{train,validation}."""
    from marin_assets.datakit.shards import join, list_shards
    from marin_assets.datakit.tokenize import TokenizeConfig, tokenize

    stats = {}
    for source in sorted(tok.counts["documents"]):
        s = tokenize(list_shards(join(tok.data_path, "docs", source)), join(tok.data_path, "tokenizer.json"),
                     join(ctx.out_dir, source), TokenizeConfig(validation_fraction=config.validation_fraction))
        stats[source] = {split: s[split]["tokens"] for split in ("train", "validation")}
        ctx.log(f"scaling/tokenized {source}: {stats[source]}")
    return {"tokens": stats, "train_tokens": sum(v["train"] for v in stats.values()),
            "vocab_size": tok.counts["vocab_size"]}




def build_scaling_assets(ladder: Ladder = DEMO_LADDER, *, tokenized_key: str = "scaling/tokenized",
                         automation_condition: dg.AutomationCondition | None = None, run_fn=None):
    """(assets, checks) for one ladder: sweep, scaling_fit, prediction and prediction_error.

    ``run_fn`` has ``run_sweep_point``'s signature and returns its counts (at least params,
    tokens, flops, validation_loss, vocab_size); tests pass a known law to check the fit path.
    """
    run_fn = run_fn or run_sweep_point
    partitions = dg.StaticPartitionsDefinition(ladder.keys())
    target = ladder.target

    @versioned_asset(key="sweep", code_version="1", config_cls=SweepConfig, ins={"tokenized": tokenized_key},
                     partitions_def=partitions, group_name=SCALING_GROUP, automation_condition=automation_condition,
                     extra_metadata=lambda ref: {"loss_curve": dg.MetadataValue.path(f"{ref.data_path}/loss_curve.png")})
    def sweep(ctx: StageContext, config: SweepConfig, tokenized: ArtifactRef):
        """One IsoFLOP run: the planned model for (budget, width) trained to its budget, validation loss."""
        budget, width = parse_partition_key(ctx.partition_key)
        if not config.vocab_size:
            config = config.model_copy(update={"vocab_size": tokenizer_vocab_size(tokenized)})
        return run_fn(budget, width, config, caches_of(tokenized, "train"),
                               caches_of(tokenized, "validation"), ctx.out_dir, log=ctx.log)

    def fit_metadata(ref: ArtifactRef) -> dict:
        return {"isoflop_curves": _png_markdown("IsoFLOP curves", _read_bytes(ref, "isoflop.png")),
                "power_laws": _png_markdown("Power laws and extrapolation", _read_bytes(ref, "power_laws.png"))}

    fit_in = dg.AssetIn(key="sweep", partition_mapping=dg.SpecificPartitionsPartitionMapping(ladder.fit_keys))

    @versioned_asset(key="scaling_fit", code_version="1", config_cls=FitConfig, ins={"sweep": fit_in},
                     group_name=SCALING_GROUP, automation_condition=automation_condition, extra_metadata=fit_metadata)
    def scaling_fit(ctx: StageContext, config: FitConfig, sweep: Mapping[str, ArtifactRef]):
        """IsoFLOP fit (Huber parabolas, vertices, N*/D* power laws, loss envelope) on the smaller budgets."""
        from marin_assets.scaling.bootstrap import BootstrapConfig
        from marin_assets.scaling.fits import IsoFlopConfig, fit_isoflop
        from marin_assets.scaling.plots import plot_isoflop_curves, plot_power_laws

        counts = {k: dict(ref.counts) for k, ref in sweep.items()}
        if config.fit_budgets:
            have = {budget_label(parse_partition_key(k)[0]) for k in counts}
            unknown = sorted(set(config.fit_budgets) - have)
            if unknown:
                raise ValueError(f"scaling_fit: fit_budgets {unknown} are not among the budgets it reads {sorted(have)}")
            counts = {k: c for k, c in counts.items() if budget_label(parse_partition_key(k)[0]) in config.fit_budgets}
        runs, keys = runs_from_counts(counts)
        iso = IsoFlopConfig(bucket_base=config.bucket_base, huber_delta=config.huber_delta,
                            bootstrap=BootstrapConfig(n=config.bootstrap_n))
        result = fit_isoflop(runs, iso)
        law = loss_law(result)
        summary = result.as_dict() | {"loss_law": law, "runs": [counts[k] | {"partition": k} for k in keys],
                                      "extrapolate_to": target}
        _write_text(ctx.out_dir, "fit.json", json.dumps(summary, indent=1, default=float))
        _write_bytes(ctx.out_dir, "isoflop.png", plot_isoflop_curves(runs, result, bucket_base=config.bucket_base))
        _write_bytes(ctx.out_dir, "power_laws.png", plot_power_laws(result, extrapolate_to=target))
        for ex in result.excluded_budgets:
            ctx.log(f"scaling_fit: budget {ex['budget']:.3g} excluded: {ex['reason']}")
        ctx.log(f"scaling_fit: N* ~ C^{result.n_opt.exponent:.3f}, D* ~ C^{result.d_opt.exponent:.3f} "
                f"from {len(result.optima)} budgets; loss law {law}")
        return {"runs": len(runs), "budgets_fitted": len(result.optima),
                "budgets_excluded": len(result.excluded_budgets),
                "n_opt_exponent": result.n_opt.exponent, "d_opt_exponent": result.d_opt.exponent,
                "loss_law": law["kind"]}

    @versioned_asset(key="prediction", code_version="1", config_cls=PredictionConfig, ins={"fit": "scaling_fit"},
                     group_name=SCALING_GROUP, automation_condition=automation_condition)
    def prediction(ctx: StageContext, config: PredictionConfig, fit: ArtifactRef):
        """Compute-optimal N*, D*, expected loss and the nearest family config at the largest budget."""
        from marin_assets.scaling.data import bucket_flops

        summary = _read_json(fit, "fit.json")
        vocabs = {r["vocab_size"] for r in summary["runs"]}
        if len(vocabs) != 1:
            raise ValueError(f"prediction: the fitted runs used different vocabularies {sorted(vocabs)}")
        budget = bucket_flops(target)  # the bucket the target's runs are planned into
        n_star = summary["n_opt_coefficient"] * budget ** summary["n_opt_exponent"]
        d_star = summary["d_opt_coefficient"] * budget ** summary["d_opt_exponent"]
        loss = loss_at(summary["loss_law"], budget)
        in_sample = [{"budget": o["budget"], "predicted": loss_at(summary["loss_law"], o["budget"]),
                      "vertex_loss": o["loss_opt"]} for o in summary["optima"]]
        out = {"budget": budget, "budget_label": ladder.target_label, "params_opt": n_star, "tokens_opt": d_star,
               "loss": loss, "loss_law": summary["loss_law"], "config": nearest_config(budget, n_star, config, vocabs.pop()),
               "in_sample": in_sample}
        _write_text(ctx.out_dir, "prediction.json", json.dumps(out, indent=1))
        ctx.log(f"prediction at C={budget:.3g}: N*={n_star:.3g}, D*={d_star:.3g}, loss {loss:.4f}")
        return {"budget": budget, "params_opt": n_star, "tokens_opt": d_star, "loss": loss,
                "width": (out["config"] or {}).get("width", 0)}

    @dg.asset_check(asset=prediction, name="prediction_error",
                    description=f"|predicted - actual| / actual of the best loss at the largest budget "
                                f"<= {ladder.max_relative_error}")
    def prediction_error(prediction: ArtifactRef, artifact_store: ArtifactStoreResource) -> dg.AssetCheckResult:
        store = artifact_store.store
        pred = _read_json(prediction, "prediction.json")
        actual = {k: store.read_pointer("sweep", k) for k in ladder.target_keys}
        present = {k: ref for k, ref in actual.items() if ref is not None}
        missing = sorted(set(actual) - set(present))
        if missing:
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.WARN,
                description=f"actual runs at C={ladder.target_label} not materialised yet: {missing}",
                metadata={"missing": dg.MetadataValue.json(missing), "predicted_loss": pred["loss"]})
        best_key = min(present, key=lambda k: present[k].counts["validation_loss"])
        best = present[best_key].counts
        error = relative_error_of(pred["loss"], best["validation_loss"])
        passed = abs(error) <= ladder.max_relative_error
        png = predicted_vs_actual_png(pred, best["validation_loss"])
        print(f"prediction_error: predicted {pred['loss']:.4f} vs actual best {best['validation_loss']:.4f} "
              f"({best_key}) at C={ladder.target_label}: relative error {error:+.4f}")
        return dg.AssetCheckResult(
            passed=passed, severity=dg.AssetCheckSeverity.ERROR,
            description=f"relative error {error:+.2%} (bound {ladder.max_relative_error:.0%})",
            metadata={
                "relative_error": float(error), "abs_relative_error": abs(float(error)),
                "bound": ladder.max_relative_error, "predicted_loss": float(pred["loss"]),
                "actual_loss": float(best["validation_loss"]), "actual_best_partition": best_key,
                "predicted_params": float(pred["params_opt"]), "actual_best_params": float(best["params"]),
                "actual_runs": dg.MetadataValue.json({k: r.counts["validation_loss"] for k, r in sorted(present.items())}),
                "predicted_vs_actual": _png_markdown("Predicted vs actual loss", png),
            })

    return [sweep, scaling_fit, prediction], [prediction_error]


def relative_error_of(predicted: float, actual: float) -> float:
    from marin_assets.scaling.predict import relative_error

    return relative_error(predicted, actual)


def predicted_vs_actual_png(pred: Mapping[str, Any], actual_loss: float) -> bytes:
    """The fitted budgets (envelope vs parabola vertex, in sample) and the target (out of sample)."""
    from marin_assets.scaling.plots import plot_predicted_vs_actual

    budgets = [p["budget"] for p in pred["in_sample"]] + [pred["budget"]]
    predicted = [p["predicted"] for p in pred["in_sample"]] + [pred["loss"]]
    actual = [p["vertex_loss"] for p in pred["in_sample"]] + [actual_loss]
    return plot_predicted_vs_actual(budgets, predicted, actual)


_ladder_assets, scaling_checks = build_scaling_assets(DEMO_LADDER)
scaling_assets = [scaling_tokenizer, scaling_tokenized, *_ladder_assets]
# Everything in the scaling group: data, sweep partitions, fit, prediction (and its check).
scaling_job = dg.define_asset_job("scaling", selection=dg.AssetSelection.groups(SCALING_GROUP),
                                  description="The IsoFLOP ladder: its data, sweep runs, fit, prediction and check.")


# ---------------------------------------------------------------- the whole ladder, in process


def run_ladder(defs: dg.Definitions, instance: dg.DagsterInstance, log=print, ladder: Ladder = DEMO_LADDER,
               run_config: Mapping[str, Any] | None = None) -> dict:
    """Materialise the ladder in process: scaling/tokenizer, scaling/tokenized, every sweep
    partition (the fit budgets, then the held-out largest one), then scaling_fit and
    prediction, whose check compares the prediction with the best run at the largest budget.

    Uses the job named "scaling" of ``defs`` (``scaling_job`` if ``defs`` has none);
    ``run_config``'s {"ops": {op: ...}} entries go to the steps that run those ops. The
    prediction only reads the fit budgets' runs, so running the target's partitions first
    changes nothing in it. Returns {"prediction", "actual", "relative_error", "passed",
    "exponents", "seconds", ...}; raises if a step fails."""
    started = time.monotonic()
    try:
        job = defs.resolve_job_def("scaling")
    except Exception:  # noqa: BLE001 - dagster raises different errors for a missing job across versions
        job = dg.Definitions.merge(defs, dg.Definitions(jobs=[scaling_job])).resolve_job_def("scaling")

    def execute(keys: Sequence[str], partition: str | None = None):
        t0 = time.monotonic()
        selection = [dg.AssetKey.from_user_string(k) for k in keys]
        names = {k.to_python_identifier() for k in selection}
        ops = {name: cfg for name, cfg in (run_config or {}).get("ops", {}).items() if name in names}
        result = job.execute_in_process(instance=instance, partition_key=partition, raise_on_error=True,
                                        asset_selection=selection, run_config={"ops": ops} if ops else None)
        log(f"scaling ladder: {'+'.join(keys)}{f' [{partition}]' if partition else ''} in {time.monotonic() - t0:.1f}s")
        return result

    execute(["scaling/tokenizer", "scaling/tokenized"])
    for key in ladder.fit_keys + ladder.target_keys:
        execute(["sweep"], key)
    result = execute(["scaling_fit", "prediction"])
    checks = [e for e in result.get_asset_check_evaluations() if e.check_name == "prediction_error"]
    if not checks:
        raise RuntimeError("scaling ladder: the prediction_error check did not run")
    meta = {k: v.value for k, v in checks[0].metadata.items()}
    if "actual_loss" not in meta:
        raise RuntimeError(f"scaling ladder: the check did not evaluate: {checks[0].description}")
    fit = result.output_for_node("scaling_fit").counts
    out = {
        "prediction": meta["predicted_loss"], "actual": meta["actual_loss"],
        "relative_error": meta["relative_error"], "passed": bool(checks[0].passed), "bound": meta["bound"],
        "actual_best_partition": meta["actual_best_partition"],
        "predicted_params": meta["predicted_params"], "actual_best_params": meta["actual_best_params"],
        "exponents": {"n_opt": fit["n_opt_exponent"], "d_opt": fit["d_opt_exponent"]},
        "budgets_fitted": fit["budgets_fitted"], "budgets_excluded": fit["budgets_excluded"],
        "seconds": round(time.monotonic() - started, 1),
    }
    log(f"scaling ladder: predicted loss {out['prediction']:.4f} at C={ladder.target_label}, actual best "
        f"{out['actual']:.4f} ({out['actual_best_partition']}): relative error {out['relative_error']:+.2%} "
        f"(bound {out['bound']:.0%}, {'passed' if out['passed'] else 'FAILED'}); N* ~ C^{out['exponents']['n_opt']:.3f}, "
        f"D* ~ C^{out['exponents']['d_opt']:.3f}; {out['seconds']:.0f}s")
    return out
