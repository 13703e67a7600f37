"""Expert parallelism on 8 host devices, checked in a subprocess (see ep_check.py)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
P_DEV, TOK_PER_DEV = 8, 10  # must match ep_check.py


@pytest.fixture(scope="module")
def ep_result():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "tests/kernels/ep_check.py")], env=env,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["ragged", "pooled"])
def test_no_drop_forward_and_backward_match_single_device(ep_result, transport):
    r = ep_result[transport]
    assert r["dropped"] == 0
    assert r["forward_err"] < 1e-5  # float32, same math in a different order
    assert r["grad_err"] < 1e-5
    m = ep_result[f"model_{transport}"]
    assert m["dropped"] == 0 and m["loss_err"] < 1e-5 and m["grad_err"] < 1e-5


@pytest.mark.slow
def test_drop_accounting_is_exact(ep_result):
    recv_cap = math.ceil(1.15 * TOK_PER_DEV)
    pool = math.ceil(1.10 * TOK_PER_DEV / P_DEV)  # waves=1
    total = P_DEV * TOK_PER_DEV
    expected = {
        # All 80 assignments want device 0: only recv_cap of them fit (ragged); pooled
        # senders first cut to their pool, then the receiver cuts to recv_cap.
        "all_to_one_ragged": total - recv_cap,
        "all_to_one_pooled": total - min(P_DEV * pool, recv_cap),
        # Each device sends its 10 to the next device: fits the receiver (ragged drops
        # nothing) but overflows the fixed per-destination pool (pooled).
        "shift_by_one_ragged": 0,
        "shift_by_one_pooled": P_DEV * (TOK_PER_DEV - pool),
    }
    for name, want in expected.items():
        r = ep_result[f"drops_{name}"]
        assert r["dropped"] == want, (name, r)
        assert r["zero_rows"] == want, (name, r)  # the dropped tokens are the zero rows
        assert r["kept_err"] < 1e-5, (name, r)  # every kept token got its full output
