"""``numpytfmr generate``: complete a prompt with a trained checkpoint.

    numpytfmr generate --prompt 3142                       # runs/gpt: prints 1234
    numpytfmr generate --prompt 3142 --temperature 1 --top-k 3 --seed 7
    numpytfmr generate --checkpoint runs/seq2seq-transformer --prompt "i am a student"
    numpytfmr generate --checkpoint runs/pretrain --prompt "The " --temperature 0.8 --top-p 0.95

For a GPT trained on a task the prompt is wrapped as ``<bos> prompt <sep>`` (``--raw``
takes it as written, special tokens spelled out) and the completion is printed up to
``<eos>``. For a seq2seq checkpoint the prompt is the source sentence and the greedy
translation is printed. For a GPT of ``numpytfmr pretrain`` the prompt is plain text,
printed with its continuation as it is produced (``--top-p``: nucleus sampling); past the
context window the model reads the last max_len tokens, as nanoGPT crops its context.

A prompt the model cannot read is refused (status 2): characters outside those of its
training task (``31a2`` for a model that sorts digits), words outside the vocabulary,
more tokens than its positions. A prompt longer than any seen in training is answered,
with a warning on stderr (the answer of a model that never saw 9 digits is a guess).
"""
import argparse
import sys

from numpytfmr.run.cli import (UsageError, checkpoint_path, from_flag, nonnegative_float,
                               nonnegative_int, positive_float, positive_int)
from numpytfmr.run.options import command_parser


def cmd_generate(args):
    from numpytfmr.run.blas import blas_threads
    _check_sampling(args)
    with blas_threads(1):
        return _generate(args)


def _check_sampling(args):
    """--top-k, --top-p and --seed choose how to sample: refused with greedy decoding
    (--temperature 0, the default), where they would change nothing. Then the seed's
    default."""
    if args.temperature == 0:
        given = [flag for flag, value in (("--top-k", args.top_k), ("--top-p", args.top_p),
                                          ("--seed", args.seed)) if value is not None]
        if given:
            raise UsageError(f"{given[0]} applies to sampling; with --temperature 0 (the "
                             "default) decoding is greedy: give --temperature above 0, or drop "
                             f"{given[0]}")
    if args.seed is None:
        args.seed = 0


def _warn(message):
    print(f"numpytfmr generate: warning: {message}", file=sys.stderr)


def _check_gpt_prompt(ck, args):
    """Refuse what the GPT of ``ck`` cannot read; warn about a prompt longer than training's."""
    from numpytfmr.run.data import SPECIAL_TOKENS
    from numpytfmr.run.tasks import split_special, task_symbols
    prompt, tok, config = args.prompt, ck["tokenizer"], ck["model_config"]
    task = ck.get("task") if isinstance(ck.get("task"), dict) else {}
    parts = split_special(prompt)
    specials = [p for p in parts if p in SPECIAL_TOKENS]
    if specials and not args.raw:
        raise UsageError(f"--prompt {prompt!r} holds the special token {specials[0]}; <bos> and "
                         "<sep> are added around the prompt (--raw: write the whole sequence "
                         "yourself)")
    text = "".join(p for p in parts if p not in SPECIAL_TOKENS)
    symbols = task.get("symbols") or task_symbols(task.get("task")) or tok.symbols
    unknown = list(dict.fromkeys(c for c in text if c not in symbols or c not in tok.symbols))
    if unknown:
        trained = f"{task['task']} prompts" if task.get("task") else "its vocabulary"
        raise UsageError(f"--prompt {prompt!r} has the unknown character"
                         f"{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"the model knows only {symbols!r} ({trained})")
    n_tokens = len(text) + len(specials) if args.raw else len(text) + 2
    if args.raw and n_tokens == 0:
        raise UsageError("--prompt is empty; expected at least one token")
    if config.positional == "learned":
        room = config.max_len - n_tokens + 1       # generate reads at most max_len positions
        if room < 1:
            raise UsageError(f"--prompt is {n_tokens} tokens long"
                             f"{'' if args.raw else ' with <bos> and <sep>'} but the model "
                             f"reads at most max_len={config.max_len} positions")
        if args.max_new_tokens is not None and args.max_new_tokens > room:
            raise UsageError(f"--max-new-tokens is {args.max_new_tokens} but a prompt of "
                             f"{n_tokens} tokens leaves room for {room} "
                             f"(max_len={config.max_len})")
    longest = task.get("max_prompt_len")
    # the prompt proper: with --raw, what comes before the first <sep>
    asked = "".join(p for p in (parts[:parts.index("<sep>")] if "<sep>" in parts else parts)
                    if p not in SPECIAL_TOKENS)
    if isinstance(longest, int) and len(asked) > longest:
        _warn(f"--prompt has {len(asked)} characters but the model was trained on prompts of "
              f"at most {longest}; its answer may be wrong")


def _check_source(ck, args):
    """Refuse words the translation model does not have; warn about a long sentence."""
    from numpytfmr.run.tasks import unknown_words
    src, config = ck["src_tokenizer"], ck["model_config"]
    unknown = unknown_words(src, args.prompt)
    if unknown:
        raise UsageError(f"--prompt {args.prompt!r} has the unknown word"
                         f"{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         "the model knows the "
                         f"{len(src.words)} words: {' '.join(src.words)}")
    n_words = len(args.prompt.split())
    if n_words == 0:
        raise UsageError("--prompt is empty; expected a sentence")
    limit = config.max_len if getattr(config, "positional", None) == "learned" else None
    if limit is not None and n_words > limit:
        raise UsageError(f"--prompt has {n_words} words but the model reads at most "
                         f"max_len={limit}")
    if limit is not None and args.max_new_tokens is not None and args.max_new_tokens > limit:
        raise UsageError(f"--max-new-tokens is {args.max_new_tokens} but the model reads at "
                         f"most max_len={limit} target positions")
    task = ck.get("task") if isinstance(ck.get("task"), dict) else {}
    longest = task.get("max_source_words")
    if isinstance(longest, int) and n_words > longest:
        _warn(f"--prompt has {n_words} words but the model was trained on sentences of at "
              f"most {longest}; its translation may be wrong")


def _generate_text(args):
    """A model of text (``numpytfmr pretrain``, or lora/dpo from one): the prompt is plain
    text, continued as it is and printed as it is produced. Past the context window the
    model reads the last max_len tokens (the window slides, as in nanoGPT)."""
    import numpy as np

    from numpytfmr.run.pretrain import encode_text, load_text_model, stream_text
    if args.raw:
        raise UsageError("--raw: the checkpoint holds a model of plain text (numpytfmr "
                         "pretrain), whose prompts have no special tokens")
    ck = from_flag("--checkpoint", load_text_model, args.checkpoint)
    config, tok = ck["model_config"], ck["tokenizer"]
    n_prompt = len(encode_text(tok, args.prompt))
    if n_prompt == 0:
        raise UsageError("--prompt is empty; expected at least one character")
    if n_prompt > config.max_len:
        _warn(f"--prompt is {n_prompt} tokens but the model reads {config.max_len} at a time; "
              f"it continues from the last {config.max_len}")
    greedy = args.temperature == 0 or args.top_k == 1
    rng = None if greedy else np.random.default_rng(args.seed)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    for piece in stream_text(ck["params"], config, tok, args.prompt,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, rng=rng,
                             use_cache=not args.no_cache):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _generate(args):
    import numpy as np

    from numpytfmr.run.checkpoint import load_model
    from numpytfmr.run.pretrain import is_text_checkpoint
    from numpytfmr.run.tasks import complete, translate

    if is_text_checkpoint(args.checkpoint):
        return _generate_text(args)
    if args.top_p is not None:
        raise UsageError("--top-p applies to checkpoints of numpytfmr pretrain (models of "
                         "text); task checkpoints sample with --temperature and --top-k")
    ck = from_flag("--checkpoint", load_model, args.checkpoint)
    if ck["kind"] == "gpt":
        _check_gpt_prompt(ck, args)
        greedy = args.temperature == 0 or args.top_k == 1
        rng = None if greedy else np.random.default_rng(args.seed)
        text, _ = complete(ck["params"], ck["model_config"], ck["tokenizer"], args.prompt,
                           max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, rng=rng, use_cache=not args.no_cache, raw=args.raw)
        print(text)
        return 0
    given = [flag for flag, on in (("--temperature", args.temperature != 0),
                                   ("--top-k", args.top_k is not None),
                                   ("--raw", args.raw)) if on]
    if given:
        raise UsageError(f"{', '.join(given)}: the checkpoint holds a {ck['kind']!r} translation "
                         "model, which decodes greedily; --temperature, --top-k and --raw apply "
                         "to GPT checkpoints")
    _check_source(ck, args)
    words, _, _ = translate(ck["params"], ck["kind"], ck["model_config"], ck["src_tokenizer"],
                            ck["tgt_tokenizer"], args.prompt, max_new_tokens=args.max_new_tokens,
                            use_cache=not args.no_cache)
    print(" ".join(w for w in words if w != "<eos>"))
    return 0


def _top_p(text):
    """A probability in (0, 1] (``--top-p``)."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"is {text}; expected a number in (0, 1]")
    return value


def add_command(sub):
    p = command_parser(sub, "generate")
    p.add_argument("--checkpoint", default="runs/gpt", type=checkpoint_path, metavar="PATH",
                   help="checkpoint directory or its checkpoint.json (default runs/gpt)")
    p.add_argument("--prompt", required=True, metavar="TEXT",
                   help="the prompt, e.g. 3142 for the sort task; characters the model never "
                   "saw in training are refused")
    p.add_argument("--raw", action="store_true",
                   help="use the prompt as written (no <bos>/<sep> added; special tokens may be "
                   "spelled out, e.g. '<bos>3142<sep>')")
    p.add_argument("--temperature", type=nonnegative_float, default=0.0,
                   help="sampling temperature; 0 (default) = greedy decoding")
    p.add_argument("--top-k", type=positive_int, default=None, metavar="K",
                   help="with --temperature above 0: sample among the K most likely tokens "
                   "(1 = greedy)")
    p.add_argument("--top-p", type=_top_p, default=None, metavar="P",
                   help="with --temperature above 0, nucleus sampling: sample among the most "
                   "likely tokens whose probabilities sum to at least P (text checkpoints of "
                   "numpytfmr pretrain)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, metavar="N",
                   help="stop after N tokens (default: until <eos> or the end of the context); "
                   "a model of text goes on past its context window, reading the last max_len "
                   "tokens")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute the whole sequence at every step instead of using the KV cache "
                   "(same output, slower)")
    p.add_argument("--seed", type=nonnegative_int, default=None,
                   help="seed of the sampling, with --temperature above 0 (default 0)")
    p.set_defaults(func=cmd_generate)
