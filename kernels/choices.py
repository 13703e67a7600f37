"""The choices each kernel offers, by name, in a module without JAX: a model config checks a name
(marin_assets/model/config.py) without importing JAX, which the Dagster code location would pay for."""

ATTENTION_IMPLS = ("auto", "reference", "blockwise", "xla", "cudnn", "splash")  # kernels/attention.py
GROUPED_MATMUL_IMPLS = ("auto", "ragged_dot", "blocked")  # kernels/grouped_matmul.py
EP_TRANSPORTS = ("ragged", "pooled")  # kernels/expert_parallel.py
GATINGS = ("sigmoid", "softmax")  # kernels/router.py
# What context parallelism (kernels/attention.py SequenceParallel) runs: "auto" there means reference or blockwise.
CONTEXT_PARALLEL_IMPLS = ("auto", "reference", "blockwise")
