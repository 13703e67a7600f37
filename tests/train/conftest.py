import pytest

from cachebuild import stdlib_module_docs, stdlib_paragraphs, write_cache


@pytest.fixture(scope="session")
def caches(tmp_path_factory):
    """Two real Levanter caches: "license" (Python's LICENSE) and "docs" (stdlib docstrings)."""
    root = tmp_path_factory.mktemp("caches")
    return {"license": write_cache(root / "license", stdlib_paragraphs()),
            "docs": write_cache(root / "docs", stdlib_module_docs())}


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory):
    """A persistent XLA compile cache for the session: every test that builds the same train
    step (and the `marin train` subprocesses) compiles it once."""
    import jax

    path = tmp_path_factory.mktemp("jax_cache")
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path


TINY = {"model": {"vocab_size": 256, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 64,
                  "n_routed_experts": 4, "n_shared_experts": 1, "top_k": 2, "expert_d_ff": 32, "max_seq_len": 32},
        "seq_len": 32, "batch_size": 4, "num_steps": 12, "checkpoint_every_steps": 4,
        "schedule": {"kind": "wsd", "peak_lr": 3e-3, "warmup_steps": 2, "decay_steps": 4},
        "guards": {"window": 16, "min_history": 4}}


@pytest.fixture
def tiny_config(jax_cache):
    from marin_assets.train.config import config_from_dict

    return config_from_dict(TINY)
