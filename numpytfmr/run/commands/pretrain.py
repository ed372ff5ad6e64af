"""``numpytfmr pretrain``: train a GPT on real text and score it in bits per byte against the
smoothed n-gram baselines of 003 ch. 2, fitted and scored on the same split.

    numpytfmr pretrain                                  # stdlib docstrings, about 5 minutes
    numpytfmr pretrain --text book.txt --tokenizer byte --minutes 10 --out runs/book
    numpytfmr pretrain --text book.txt --tokenizer-out book-bpe.json --out runs/book
    numpytfmr tokenize --text more.txt --tokenizer book-bpe.json -o more.bin
    numpytfmr pretrain --tokens more.bin --init runs/book --minutes 2 --out runs/more
    numpytfmr pretrain --resume --steps 3000            # continue runs/pretrain
    numpytfmr generate --checkpoint runs/pretrain --prompt "The " --temperature 0.8 --top-p 0.95

The data is a text (``--text``; default the docstrings of the installed Python standard
library, nothing downloaded) or token files of ``numpytfmr tokenize`` (``--tokens``, whose
header names the tokenizer). ``--val-text``/``--val-tokens`` default to the last tenth.
The tokenizer is learnt on the text (``--tokenizer bpe|byte|char``), or read from a file
(``--tokenizer FILE``: ``--tokenizer-out`` of an earlier run, a run folder's
tokenizer.json), or comes with the token files or ``--init``. ``--init RUN`` starts from
the weights of a trained model (continued pretraining, domain adaptation).

Without ``--steps`` a new run trains for ``--minutes`` of wall-clock time (default 4.5):
the number of steps is planned from the measured speed and re-planned as it runs. The
run folder gets the checkpoint, tokenizer.json and curves.png (with matplotlib).
"""
import argparse
import os

from numpytfmr.run.cli import (UsageError, checkpoint_path, nonnegative_int, output_file,
                               positive_int)
from numpytfmr.run.options import (add_minutes, add_model_options, add_training_options,
                                   command_parser, read_text, settings_from_args, text_file)
from numpytfmr.run.outputs import (check_out, finish, logger, out_dir, refuse_overwrite,
                                   resume_hint)

SHAPE_FLAGS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "positional", "norm",
               "activation", "context")


def tokenizer_arg(text):
    """``bpe``, ``byte``, ``char`` or an existing tokenizer JSON file (``--tokenizer``)."""
    from numpytfmr.run.tokenizers import TEXT_TOKENIZERS
    if text in TEXT_TOKENIZERS:
        return text
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        kinds = ", ".join(TEXT_TOKENIZERS)
        raise argparse.ArgumentTypeError(f"is {text!r}, which is neither {kinds} nor a file; "
                                         "expected a kind to learn, or a tokenizer JSON "
                                         "(--tokenizer-out of a run, its tokenizer.json)")
    return path


def dropout_rate(text):
    """A rate in [0, 1) (``--dropout``)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"is {text!r}; expected a number in [0, 1)")
    return value


def _is_file(spec):
    from numpytfmr.run.tokenizers import TEXT_TOKENIZERS
    return spec is not None and spec not in TEXT_TOKENIZERS


def check_flags(args):
    """Every combination of flags that cannot run, refused before any work (status 2)."""
    given = lambda *names: [f"--{n.replace('_', '-')}" for n in names  # noqa: E731
                            if getattr(args, n) not in (None, False)]
    if args.minutes is not None and args.steps is not None:
        raise UsageError("--minutes and --steps both set the length of the run; give one")
    if args.tokens and (args.text or args.val_text):
        flag = given("text", "val_text")[0]
        raise UsageError(f"--tokens and {flag} both give the data of the run; give texts "
                         "(--text, --val-text) or token files (--tokens, --val-tokens)")
    if args.val_tokens and not args.tokens:
        raise UsageError("--val-tokens goes with --tokens FILE (the training tokens); for a "
                         "text, give --val-text FILE")
    if args.resume:
        bad = given("init", "tokenizer_out", "vocab_size") + \
            (["--tokenizer"] if _is_file(args.tokenizer) else [])
        if bad:
            raise UsageError(f"{bad[0]}: a resumed run keeps its model and tokenizer; drop "
                             f"{bad[0]}, or start a new run with another --out")
        return
    learnt = args.tokenizer in ("bpe", "char") or (args.tokenizer is None and not
                                                   (args.tokens or args.init))
    source = "--tokens" if args.tokens else "--init" if args.init else None
    if source and args.tokenizer in ("bpe", "char"):
        raise UsageError(f"--tokenizer {args.tokenizer} learns a tokenizer from --text, but the "
                         f"run reads {source}; pass the tokenizer file that made them, or no "
                         f"--tokenizer ({source} brings its own)")
    if args.vocab_size is not None and not (learnt and args.tokenizer in (None, "bpe")):
        why = (f"the tokenizer comes from {source}" if source else
               f"the {args.tokenizer} tokenizer has a fixed vocabulary"
               if args.tokenizer in ("byte", "char") else "the tokenizer is read from a file")
        raise UsageError(f"--vocab-size applies to a BPE tokenizer learnt on --text; {why}")
    if args.init:
        shape = given(*SHAPE_FLAGS)
        if shape:
            raise UsageError(f"{shape[0]}: the model comes from --init {args.init} and keeps its "
                             f"shape; drop {shape[0]} (only --dropout may change)")
    if args.tokenizer_out:
        refuse_overwrite("--tokenizer-out", args.tokenizer_out, args.force)


def _tokenizer(args):
    """The tokenizer of --tokenizer FILE (None for a kind), loaded."""
    from numpytfmr.run.tokenizers import load_tokenizer
    if not _is_file(args.tokenizer):
        return None
    try:
        return load_tokenizer(args.tokenizer)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--tokenizer {args.tokenizer}: {exc}") from None


def _init_tokenizer(args, tok):
    """Refuse --init that holds no model of text, or whose tokenizer is not the run's
    (``tok``: from --tokenizer or --tokens, None when it comes from --init)."""
    from numpytfmr.run.pretrain import is_text_checkpoint, load_text_model
    from numpytfmr.run.tokenizers import tokenizer_difference
    if not is_text_checkpoint(args.init):
        raise UsageError(f"--init {args.init} holds no model of text; expected a run of "
                         "numpytfmr pretrain (or of lora/dpo from one)")
    try:
        ck = load_text_model(args.init)
    except ValueError as exc:
        raise UsageError(f"--init {args.init}: {exc}") from None
    if tok is not None:
        differs = tokenizer_difference(ck["tokenizer"], tok)
        if differs is not None:
            flag = f"--tokens {args.tokens}" if args.tokens else f"--tokenizer {args.tokenizer}"
            raise UsageError(f"--init {args.init} was trained with another tokenizer than {flag} "
                             f"gives ({differs}); use the run's own tokenizer "
                             f"({os.path.join(args.init, 'tokenizer.json')}), or tokenize the "
                             "text with it")


def cmd_pretrain(args):
    from numpytfmr.run.blas import blas_threads
    check_flags(args)
    check_out(args, "pretrain")
    with blas_threads(args.threads), resume_hint(args, "pretrain"):
        return _pretrain(args)


def _pretrain(args):
    from numpytfmr.run.plot import pretrain_panels
    from numpytfmr.run.pretrain import (PRETRAIN_DEFAULTS, PRETRAIN_MODEL, PRETRAIN_SETTINGS,
                                        pretrain, read_token_file)
    from numpytfmr.run.tokenizers import make_tokenizer
    settings, changes = settings_from_args(args, PRETRAIN_SETTINGS)
    model = {k: getattr(args, k) for k in PRETRAIN_MODEL if getattr(args, k) is not None}
    if args.context is not None:
        model["context"] = args.context
    minutes = args.minutes
    if minutes is None and args.steps is None and not args.resume:
        minutes = PRETRAIN_DEFAULTS["minutes"]
    common = dict(minutes=minutes, out=out_dir(args), progress=not args.quiet,
                  log=logger(args), n_samples=args.samples)
    tok = _tokenizer(args)
    if args.tokenizer == "byte" and (args.tokens or args.init):
        tok = make_tokenizer("byte", "")
    data = {}
    if args.tokens:
        data["tokens"] = read_token_file(args.tokens, tok)
        data["tokens_source"] = args.tokens
        tok = data["tokens"][1]
        if args.val_tokens:
            data["val_tokens"] = read_token_file(args.val_tokens, tok, what="--val-tokens")
            data["val_tokens_source"] = args.val_tokens
    else:
        data = dict(text=read_text(args.text, "--text") if args.text else None,
                    val_text=read_text(args.val_text, "--val-text") if args.val_text else None,
                    source=args.text, val_source=args.val_text)
    if args.resume:
        changes.update(model)
        changes.update({k: getattr(args, k) for k in ("vocab_size", "grad_accum")
                        if getattr(args, k) is not None})
        if args.tokenizer is not None:
            changes["tokenizer"] = args.tokenizer
        _, summary = pretrain(resume=True, changes=changes, **data, **common)
    else:
        if args.init:
            _init_tokenizer(args, tok)
        kind = args.tokenizer if not _is_file(args.tokenizer) and tok is None else None
        _, summary = pretrain(tokenizer=tok if tok is not None else kind,
                              tokenizer_source=args.tokenizer if _is_file(args.tokenizer)
                              else None, vocab_size=args.vocab_size, model=model,
                              settings=settings, grad_accum=args.grad_accum, init=args.init,
                              force=args.force, tokenizer_out=args.tokenizer_out, **data,
                              **common)
    lines = summary_lines(summary)
    if summary.get("tokenizer_out"):
        lines.append(f"tokenizer: {summary['tokenizer_out']}")
    data_name = os.path.basename(summary["source"] or summary["tokens_source"] or "text")
    finish(args, summary, lines, pretrain_panels(summary), f"numpytfmr pretrain: {data_name}")
    return 0


def summary_lines(s):
    """The result of a run in a few lines: held-out bits per byte (at step 0 and at the
    end: the curve's first and last points) and perplexity, the n-gram baselines and the
    ratio, speed, samples, checkpoint."""
    start = "the initial model" if s["init"] is None else f"--init {s['init']}"
    lines = [f"held-out (the whole held-out text, {s['val_tokens']:,} tokens): "
             f"{s['val_bits_per_byte']:.3f} bits per byte after {s['steps']} steps, from "
             f"{s['initial_val_bits_per_byte']:.3f} at step 0 ({start}); perplexity "
             f"{s['val_perplexity']:.1f} per token ({s['tokenizer']} tokenizer, "
             f"{s['vocab_size']} tokens, {s['bytes_per_token']:.2f} bytes per token)"]
    if s["ngram_bits_per_byte"]:
        grams = ", ".join(f"{k} {v:.3f}" for k, v in s["ngram_bits_per_byte"].items())
        lines.append(f"n-gram baselines on the same split (bits per byte): {grams}; the model "
                     f"is at {s['ratio_to_baseline']:.2f}x the best ({s['baseline']})")
    speed = f"{s['tokens_per_second']:,.0f} tokens/s" if s["tokens_per_second"] else "no step"
    budget = "; stopped by the time budget" if s["stopped_by_budget"] else ""
    planned = f" of a {s['minutes']:g}-minute budget" if s["minutes"] else ""
    lines.append(f"{s['steps']} steps in {s['seconds']:.0f} s of training ({speed}), "
                 f"{s['wall_seconds']:.0f} s in all{planned}{budget}")
    for text in s["samples"]:
        lines.append("sample: " + text.replace("\n", "\n        "))
    if s["checkpoint"]:
        lines.append(f"checkpoint: {s['checkpoint']}")
    return lines


def add_command(sub):
    from numpytfmr.run.pretrain import PRETRAIN_DEFAULTS, PRETRAIN_MODEL, PRETRAIN_SETTINGS
    m, d = PRETRAIN_MODEL, PRETRAIN_DEFAULTS
    p = command_parser(sub, "pretrain")
    g = p.add_argument_group("data")
    for flag, help in (
            ("--text", "training text, UTF-8 (default: standard-library docstrings)"),
            ("--val-text", "held-out text (default: the last tenth of --text)"),
            ("--tokens", "training tokens: a token file of 'numpytfmr tokenize' "
                         "(instead of --text)"),
            ("--val-tokens", "held-out tokens (default: the last tenth of --tokens)")):
        g.add_argument(flag, type=text_file, metavar="FILE", help=help)
    g.add_argument("--tokenizer", type=tokenizer_arg, default=None, metavar="KIND|FILE",
                   help="bpe, byte or char: learnt on --text (default bpe); or a tokenizer "
                   "file (--tokenizer-out of a run, a run's tokenizer.json); with --tokens or "
                   "--init, default theirs")
    g.add_argument("--vocab-size", type=positive_int, metavar="N",
                   help=f"BPE vocabulary size (default {d['vocab_size']})")
    g.add_argument("--tokenizer-out", type=output_file, metavar="FILE",
                   help="also write the run's tokenizer to FILE (for numpytfmr tokenize and "
                   "later runs); the run folder always gets tokenizer.json")
    g = p.add_argument_group("model")
    g.add_argument("--init", type=checkpoint_path, metavar="RUN",
                   help="start from the weights of a text model (a run of pretrain, lora or "
                   "dpo): continued pretraining on new text; its shape and tokenizer are kept")
    g.add_argument("--context", type=positive_int, metavar="T",
                   help=f"context length: tokens per training window (default {d['context']})")
    add_model_options(g, m)
    g.add_argument("--dropout", type=dropout_rate, metavar="P",
                   help=f"dropout rate on the embeddings and every sublayer output in training "
                   f"(default {m['dropout']:g})")
    g = p.add_argument_group("length of the run")
    add_minutes(g, f"wall-clock budget (default {d['minutes']:g} for a new run without "
                "--steps): the steps are planned from the measured speed and re-planned as "
                "the run goes, so that it ends near M minutes")
    g.add_argument("--grad-accum", type=positive_int, metavar="N",
                   help="micro-batches of --batch-size windows per update (default 1): an "
                   "update averages N batches' gradients")
    shown = dict(PRETRAIN_SETTINGS, steps=f"planned from --minutes {d['minutes']:g}")
    add_training_options(p, shown, out="runs/pretrain")
    p.add_argument("--samples", type=nonnegative_int, default=3, metavar="N",
                   help="continuations printed at the end (default 3)")
    p.set_defaults(func=cmd_pretrain)
