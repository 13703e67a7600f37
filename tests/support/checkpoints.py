"""Untrained train checkpoints for the tests that read one (eval, generate): one writer, so the layout a
reader sees is the one ``marin train`` writes (``checkpoint.save``), step 7 unless told."""

from __future__ import annotations

from pathlib import Path

from tests.support.configs import EVAL_CHECKPOINT


def save_untrained(folder: Path, model_changes: dict | None = None, meta: dict | None = None, step: int = 7) -> Path:
    """``EVAL_CHECKPOINT``'s model (with ``model_changes``) at its PRNGKey(0) init, saved under
    ``folder``/checkpoints with ``meta`` beside its config; returns ``folder``."""
    import jax

    from marin_assets.model import init_params, init_router_bias
    from marin_assets.train.checkpoints import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict, config_to_dict

    config = config_from_dict(dict(EVAL_CHECKPOINT, model=dict(EVAL_CHECKPOINT["model"], **(model_changes or {}))))
    state = {"params": init_params(config.model, jax.random.PRNGKey(0)), "router_bias": init_router_bias(config.model)}
    ckpt.save(folder / "checkpoints", step, state, {"config": config_to_dict(config), "phase": "main", **(meta or {})})
    return folder
