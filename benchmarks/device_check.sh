#!/usr/bin/env bash
# The long-context device check, prepared to run once on one NVIDIA GPU (the `device` tool's machine) in
# under 8 minutes: each step has its own time limit and writes its JSON lines to $OUT/<step>.jsonl (and its
# stderr beside it), so a step that fails or runs out of time costs only itself.
#   1. attention equivalence on cuDNN (bf16) and the blockwise/XLA paths (fp32) vs the naive reference
#   2. attention memory and step time at long context, blockwise vs reference (benchmarks/attention.py)
#   3. the MoE model in bf16 for 50 timed steps: tokens/s and MFU vs Levanter's Mixtral (benchmarks/moe_step.py)
#   4. optimizer offload's memory saving: the compiled step's device bytes with and without the Adam moments
#      in pinned host memory (benchmarks/train_step_variants.py --figures offload; compile-only)
#   5. pooled-wave vs ragged expert transport, step time of the real train step (train_step_variants.py
#      --figures ep_transport). On one GPU the expert axis is 1, so the exchange stays local and the figure is
#      each transport's own cost; the all-to-all itself needs a machine with several GPUs.
# Steps 4 and 5 have run on CPU only (XLA:CPU refuses step 4, which exits 2 with XLA's reason there).
#
#   OUT=/tmp/out bash benchmarks/device_check.sh        (python3 must import jax with CUDA and this repo's deps)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_check_out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

step() {  # step NAME SECONDS ARGV...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$PY" "$@" 2>"$OUT/$name.err" | tee "$OUT/$name.jsonl"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

"$PY" -c 'import jax; print("devices:", jax.devices())' | tee "$OUT/devices.txt"
MOE=(--d-model 1024 --layers 8 --heads 16 --kv-heads 4 --experts 16 --top-k 2 --expert-d-ff 1024 --seq 2048 --vocab 32768)
step attention_equivalence 80 benchmarks/device_check_attention.py --seq 4096
step attention_memory 130 benchmarks/attention.py --mem-seqs 8192 32768 65536 --time-seq 8192 --repeats 5 --cp-devices 0
step moe_bf16 130 benchmarks/moe_step.py --dtype bfloat16 --figures moe_train_step "${MOE[@]}" --batch 16 --iters 50 \
    --peak-n 8192
step offload_memory 60 benchmarks/train_step_variants.py --figures offload --dtype bfloat16 "${MOE[@]}" --batch 16
step ep_transport 70 benchmarks/train_step_variants.py --figures ep_transport --dtype bfloat16 "${MOE[@]}" --batch 8 \
    --iters 10
exit $status
