"""``marin generate``: text from a trained checkpoint (KV-cached sampling, model/decode.py).

  marin generate --checkpoint OUT_DIR_OR_CHECKPOINT --prompt "Once upon" [--prompt ...]
                 [--prompt-file F] [--max-new-tokens 64] [--temperature 0] [--top-p 1]
                 [--stop TEXT ...] [--seed 0] [--tokenizer NAME|PATH] [--json]

The checkpoint is a ``marin train`` out dir (its newest valid checkpoint) or a checkpoint folder.
Text goes in and out through the tokenizer the model trained with: the checkpoint records the
sha256 of its data's tokenizer, which is matched against the named tokenizers (bytes, olmo);
any other needs ``--tokenizer PATH`` (a tokenizer.json or its folder), and a ``--tokenizer`` that
is not the recorded one is refused. Each prompt starts with the tokenizer's EOS id, as the
training documents (and the evals' contexts) do, and a row stops at EOS or at a ``--stop`` text,
neither of which is printed (a stop text is matched as the tokens it encodes to on its own).
``--prompt-file``: one prompt per line (blank lines are not prompts).

Prints JSON (one line with ``--json``): the checkpoint, its step and per prompt the completion and
its token count. Exit codes: 0 generated, 2 a bad flag, checkpoint or tokenizer (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from marin_assets.datakit.tokenize import TOKENIZER_NAMES, load_encoder
from marin_assets.evaluation.run import SamplingSettings, check_model_tokenizer
from marin_assets.knobs import add_flags, from_flags
from marin_assets.store.fsutil import filesystem, join

if TYPE_CHECKING:
    from marin_assets.datakit.tokenize import Encoder
    from marin_assets.model import ModelConfig

HF_PREFIX = "hf:"
_PROGRESS_FROM = 128  # new tokens from which a progress bar is worth its stderr lines


class ModelSource(NamedTuple):
    """What generating from a model needs: its weights, config, router bias and tokenizer."""

    params: dict
    config: ModelConfig
    router_bias: object
    encoder: Encoder
    step: int | None


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="Sample text from a checkpoint (greedy, temperature, top-p, stops).")
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a marin train out dir (its newest checkpoint) or a checkpoint folder; hf:PATH for a Hugging Face folder",
    )
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    p.add_argument("--prompt-file", default=None, metavar="F", help="a text file: one prompt per line")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop a row when it generates TEXT (repeatable; EOS always stops)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="NAME|PATH",
        help="the model's tokenizer (bytes, olmo or a tokenizer.json path) when the checkpoint does not record a known one",
    )
    add_flags(p, SamplingSettings, ["max_new_tokens", "temperature", "top_p", "seed", "compute_dtype"])
    p.add_argument("--json", action="store_true", help="print compact JSON on one line")
    p.set_defaults(handler=_generate)


def load_model_source(source: str, tokenizer: str | None = None) -> ModelSource:
    """The model and tokenizer of ``source``: a marin checkpoint (or out dir), or ``hf:PATH``.
    ``tokenizer`` overrides (a checkpoint: must match) the one the source records."""
    if source.startswith(HF_PREFIX):
        return load_hf_source(source.removeprefix(HF_PREFIX), tokenizer)
    from marin_assets.train.restore import load_model_from_checkpoint  # deferred (import cost): jax, optax

    params, config, bias, meta = load_model_from_checkpoint(source)
    encoder = checkpoint_tokenizer(meta, source, tokenizer)
    check_model_tokenizer(encoder, meta, config, source)
    return ModelSource(params, config, bias, encoder, int(meta["step"]))


def load_hf_source(path: str, tokenizer: str | None = None) -> ModelSource:
    """A Hugging Face folder's model (``marin_assets.hf.import_hf``: nothing fetched from a hub) and its
    tokenizer.json, or ``tokenizer`` when given; the router bias is zero (HF routers have none)."""
    from marin_assets.hf.convert import import_hf  # deferred (import cost): jax, optax
    from marin_assets.model import init_router_bias  # deferred (import cost): jax

    params, config = import_hf(path)
    fs, folder = filesystem(path)
    if tokenizer is None and not fs.exists(join(folder, "tokenizer.json")):
        raise ValueError(f"{HF_PREFIX}{path} has no tokenizer.json: pass --tokenizer PATH|bytes")
    encoder = load_encoder(tokenizer or join(path, "tokenizer.json"))
    if encoder.vocab_size > config.vocab_size:
        raise ValueError(
            f"the tokenizer given has {encoder.vocab_size} ids, more than {HF_PREFIX}{path}'s vocab_size {config.vocab_size}"
        )
    return ModelSource(params, config, init_router_bias(config), encoder, None)


def checkpoint_tokenizer(meta: dict, where: str, override: str | None):
    """The Encoder the checkpoint's data was tokenized with (meta's data_tokenizers sha256s), or
    ``override`` when given and not contradicting them."""
    recorded = set((meta.get("data_tokenizers") or {}).values())
    if override is not None:
        return load_encoder(override)  # load_model_source checks it against the checkpoint
    how = "pass --tokenizer PATH|bytes (a tokenizer.json, or the byte tokenizer)"
    if len(recorded) != 1:
        said = "records no tokenizer" if not recorded else "trained on data of several tokenizers"
        raise ValueError(f"checkpoint {where} {said}: {how}")
    (sha,) = recorded
    for name in TOKENIZER_NAMES:
        try:
            encoder = load_encoder(name)
        except (OSError, ValueError):  # a named tokenizer whose package is missing cannot be the match
            continue
        if encoder.sha256 == sha:
            return encoder
    raise ValueError(
        f"checkpoint {where} trained with tokenizer sha256 {sha[:12]}, not a named one ({', '.join(TOKENIZER_NAMES)}): {how}"
    )


def decode_text(encoder, ids: list[int]) -> str:
    """Text of ``ids`` (ids past the tokenizer's vocabulary, which a padded LM head can emit, are left out)."""
    ids = [i for i in ids if i < encoder.vocab_size]
    if encoder.is_bytes:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
    return encoder.tokenizer.decode(ids)


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompt_file is not None:
        prompts += [line for line in Path(args.prompt_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError("no prompt: pass --prompt TEXT or --prompt-file F")
    for text in args.stop:
        if not text:
            raise ValueError("--stop '' : a stop text must not be empty")
    return prompts


def _generate(args: argparse.Namespace) -> int:
    try:
        texts = _prompts(args)
        source = load_model_source(args.checkpoint, args.tokenizer)
        samples = _sample(source, texts, args)
    except (ValueError, OSError) as exc:
        print(f"marin generate: {str(exc).removeprefix('generate: ')}", file=sys.stderr)
        return 2
    result = {"checkpoint": args.checkpoint, "step": source.step, "samples": samples}
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def _sample(source: ModelSource, texts: list[str], args: argparse.Namespace) -> list[dict]:
    return sample_texts(source, texts, from_flags(args, SamplingSettings), args.stop)


def sample_texts(source: ModelSource, texts: list[str], how: SamplingSettings, stop: Sequence[str] = ()) -> list[dict]:
    """{prompt, completion, tokens} per text: each prompt after the tokenizer's EOS (as documents are
    trained), stopped at EOS or any text of ``stop``, sampled as ``how`` says (tqdm progress on stderr)."""
    from tqdm import tqdm

    from marin_assets.model.decode import Generator  # deferred (import cost): jax

    encoder = source.encoder
    start = [encoder.eos_id] if encoder.eos_id is not None else []
    prompts = [start + encoder.encode(text) for text in texts]
    stops = [encoder.encode(text) for text in stop] + ([[encoder.eos_id]] if encoder.eos_id is not None else [])
    generator = Generator(source.params, source.config, source.router_bias, compute_dtype=how.compute_dtype)
    with tqdm(
        total=how.max_new_tokens, desc="generate", unit="tok", file=sys.stderr, disable=how.max_new_tokens < _PROGRESS_FROM
    ) as bar:
        new = generator(
            prompts,
            max_new_tokens=how.max_new_tokens,
            temperature=how.temperature,
            top_p=how.top_p,
            stop_sequences=stops,
            seed=how.seed,
            on_progress=bar.update,
        )
    return [
        {"prompt": text, "completion": decode_text(encoder, ids), "tokens": len(ids)}
        for text, ids in zip(texts, new, strict=True)
    ]
