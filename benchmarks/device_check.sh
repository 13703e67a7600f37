#!/usr/bin/env bash
# The long-context device check, prepared to run once on one NVIDIA GPU (the `device` tool's machine) in
# under 8 minutes: each step has its own time limit and writes its JSON lines to $OUT/<step>.jsonl (and its
# stderr beside it), so a step that fails or runs out of time costs only itself.
#   1. attention equivalence on cuDNN (bf16) and the blockwise/XLA paths (fp32) vs the naive reference
#   2. attention memory and step time at long context, blockwise vs reference (benchmarks/attention.py)
#   3. the MoE model in bf16 for 50 timed steps: tokens/s and MFU vs Levanter's Mixtral (benchmarks/moe_step.py)
# Not covered yet: optimizer offload's memory saving (XLA:CPU cannot compile the offloaded step, and no script
# measures it yet), and pooled-wave vs ragged expert-parallel step time, which needs an expert axis of several
# devices (benchmarks/moe_step.py --figures moe_train_step_ep on a multi-GPU machine).
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
step attention_equivalence 90 benchmarks/device_check_attention.py --seq 4096
step attention_memory 150 benchmarks/attention.py --mem-seqs 8192 32768 65536 --time-seq 8192 --repeats 5
step moe_bf16 150 benchmarks/moe_step.py --dtype bfloat16 --figures moe_train_step --d-model 1024 --layers 8 \
    --heads 16 --kv-heads 4 --experts 16 --top-k 2 --expert-d-ff 1024 --seq 2048 --batch 16 --vocab 32768 \
    --iters 50 --peak-n 8192
exit $status
