"""The demo's last word: text from the model it trained (the main run's newest phase, its final checkpoint)."""

from __future__ import annotations

import dagster as dg

from assets.partitions import newest_main_partition, newest_materialisation
from marin_assets.cli.generate import load_model_source, sample_texts
from marin_assets.evaluation.run import SamplingSettings

PROMPT = "To be, or not to be"
NEW_TOKENS = 48  # byte tokens at most: a line or so of text (the demo model's context is 64)


def newest_main_phase(
    instance: dg.DagsterInstance, train_key: dg.AssetKey, phases: dg.DynamicPartitionsDefinition
) -> tuple[str, str] | None:
    """(phase, artifact data folder) of the main run's newest materialised phase (what ``NewestMainPhase`` reads:
    a phase the plan added but the run never reached is passed over); None when there is none."""
    phase = newest_main_partition(phases.get_partition_keys(dynamic_partitions_store=instance), instance, train_key)
    materialisation = newest_materialisation(instance, train_key, phase) if phase is not None else None
    path = materialisation.metadata.get("path") if materialisation is not None else None
    return (phase, f"{path.value}/data") if phase is not None and path is not None else None


def sample_main_run(
    instance: dg.DagsterInstance, train_key: dg.AssetKey, phases: dg.DynamicPartitionsDefinition, prompt: str = PROMPT
) -> dict | None:
    """One greedy sample of the newest main phase's final checkpoint: {phase, step, prompt, completion}; None
    when no phase was trained."""

    found = newest_main_phase(instance, train_key, phases)
    if found is None:
        return None
    phase, data = found
    source = load_model_source(data)
    room = source.config.max_seq_len - 1 - len(source.encoder.encode(prompt))  # the context holds EOS + prompt + new
    if room < 1:
        raise ValueError(f"demo sample: the prompt {prompt!r} fills the model's {source.config.max_seq_len}-token context")
    (sample,) = sample_texts(source, [prompt], SamplingSettings(max_new_tokens=min(NEW_TOKENS, room)))
    return {"phase": phase, "step": source.step, "prompt": prompt, "completion": sample["completion"]}
