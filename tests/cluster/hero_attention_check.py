"""The 535B-A23B example's attention pattern, one layer of each kind, lowered on 8 host devices (shapes
only: nothing is allocated); prints one JSON object. Run as a subprocess (XLA_FLAGS must be set before
jax is imported): ``python tests/cluster/hero_attention_check.py``."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marin_assets.model import forward, init_params, init_router_bias  # noqa: E402
from marin_assets.model.layers import attention  # noqa: E402
from marin_assets.train.config import load_config  # noqa: E402

HERO = Path(__file__).resolve().parents[2] / "examples" / "marin_535b_a23b.yaml"


def main() -> None:
    config = load_config(HERO, check_memory=False)
    model = config.model
    one_layer = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))["layers"]
    names = ("wq", "wk", "wv", "wo", "q_norm", "k_norm")
    p = {name: jax.ShapeDtypeStruct(one_layer[name].shape[1:], jnp.bfloat16) for name in names}
    mesh = jax.make_mesh((8,), ("data",))
    rows = NamedSharding(mesh, P("data"))
    x = jax.ShapeDtypeStruct((8, config.seq_len, model.d_model), jnp.bfloat16, sharding=rows)
    report = {"devices": len(mesh.devices.flat), "seq_len": config.seq_len, "layer_windows": {}}
    for window in sorted(set(model.layer_windows), key=str):
        lowered = jax.jit(
            jax.grad(lambda p, x, w=window: jnp.sum(attention(p, x, model, None, w).astype(jnp.float32)), argnums=1)
        ).lower(p, x)
        report["layer_windows"][str(window)] = {"hlo_bytes": len(lowered.as_text()), "layers": model.layer_windows.count(window)}
    # and the whole model traces with the mixed pattern scanned over its 48 layers
    params = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    tokens = jax.ShapeDtypeStruct((1, config.seq_len), jnp.int32)
    logits, _ = jax.eval_shape(
        lambda p, t: forward(p, t, model, init_router_bias(model), compute_dtype="bfloat16"), params, tokens
    )
    report["forward_logits_shape"] = list(logits.shape)
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
