"""``numpytfmr pretrain``: train a GPT on real text and score it in bits per byte against the
smoothed n-gram baselines of 003 ch. 2, fitted and scored on the same split.

    numpytfmr pretrain                                  # stdlib docstrings, about 5 minutes
    numpytfmr pretrain --text book.txt --tokenizer byte --minutes 10 --out runs/book
    numpytfmr pretrain --steps 300 --d-model 64 --out runs/small --summary small.json
    numpytfmr pretrain --resume --steps 3000            # continue runs/pretrain
    numpytfmr generate --checkpoint runs/pretrain --prompt "The " --temperature 0.8 --top-p 0.95

Without ``--text`` the corpus is the docstrings of the installed Python standard library
(nothing is downloaded); ``--val-text`` defaults to the last tenth of the text. Without
``--steps`` a new run trains for ``--minutes`` of wall-clock time (default 4.5), the
number of steps being planned from the measured speed of the first ones.
"""
import argparse
import os

from numpytfmr.run.cli import UsageError, nonnegative_int, positive_float, positive_int
from numpytfmr.run.commands.train import (add_training_options, check_out, finish, logger,
                                          out_dir, resume_hint, settings_from_args)


def text_file(text):
    """A readable file (``--text``, ``--val-text``)."""
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is not a file; expected a UTF-8 "
                                         "text file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is not readable")
    return path


def _read(path, flag):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot be read as UTF-8 text ({exc})") from None


def cmd_pretrain(args):
    from numpytfmr.run.blas import blas_threads
    if args.minutes is not None and args.steps is not None:
        raise UsageError("--minutes and --steps both set the length of the run; give one")
    if args.vocab_size is not None and args.tokenizer not in (None, "bpe"):
        raise UsageError(f"--vocab-size applies to --tokenizer bpe; the {args.tokenizer} "
                         "tokenizer has a fixed vocabulary")
    check_out(args, "pretrain")
    with blas_threads(args.threads), resume_hint(args, "pretrain"):
        return _pretrain(args)


def _pretrain(args):
    from numpytfmr.run.pretrain import (PRETRAIN_DEFAULTS, PRETRAIN_MODEL, PRETRAIN_SETTINGS,
                                        pretrain)
    settings, changes = settings_from_args(args, PRETRAIN_SETTINGS)
    model = {k: getattr(args, k) for k in PRETRAIN_MODEL if getattr(args, k) is not None}
    if args.context is not None:
        model["context"] = args.context
    text = _read(args.text, "--text") if args.text else None
    val_text = _read(args.val_text, "--val-text") if args.val_text else None
    minutes = args.minutes
    if minutes is None and args.steps is None and not args.resume:
        minutes = PRETRAIN_DEFAULTS["minutes"]
    common = dict(text=text, val_text=val_text, source=args.text, val_source=args.val_text,
                  minutes=minutes, out=out_dir(args), progress=not args.quiet, log=logger(args),
                  n_samples=args.samples)
    if args.resume:
        changes.update(model)
        changes.update({k: getattr(args, k) for k in ("tokenizer", "vocab_size")
                        if getattr(args, k) is not None})
        _, summary = pretrain(resume=True, changes=changes, **common)
    else:
        _, summary = pretrain(tokenizer=args.tokenizer, vocab_size=args.vocab_size, model=model,
                              settings=settings, force=args.force, **common)
    finish(args, summary, summary_lines(summary))
    return 0


def summary_lines(s):
    """The result of a run in a few lines: held-out bits per byte and perplexity, the
    n-gram baselines and the ratio, speed, samples, checkpoint."""
    lines = [f"held-out: {s['val_bits_per_byte']:.3f} bits per byte, perplexity "
             f"{s['val_perplexity']:.1f} per token ({s['tokenizer']} tokenizer, "
             f"{s['vocab_size']} tokens, {s['bytes_per_token']:.2f} bytes per token)"]
    if s["ngram_bits_per_byte"]:
        grams = ", ".join(f"{k} {v:.3f}" for k, v in s["ngram_bits_per_byte"].items())
        lines.append(f"n-gram baselines on the same split (bits per byte): {grams}; the model "
                     f"is at {s['ratio_to_baseline']:.2f}x the best ({s['baseline']})")
    speed = f"{s['tokens_per_second']:,.0f} tokens/s" if s["tokens_per_second"] else "no step"
    budget = "; stopped by the time budget" if s["stopped_by_budget"] else ""
    lines.append(f"{s['steps']} steps in {s['seconds']:.0f} s of training ({speed}), "
                 f"{s['wall_seconds']:.0f} s in all{budget}")
    for text in s["samples"]:
        lines.append("sample: " + text.replace("\n", "\n        "))
    if s["checkpoint"]:
        lines.append(f"checkpoint: {s['checkpoint']}")
    return lines


def add_command(sub):
    from numpytfmr.run.pretrain import (PRETRAIN_DEFAULTS, PRETRAIN_MODEL, PRETRAIN_SETTINGS,
                                        TOKENIZERS)
    m, d = PRETRAIN_MODEL, PRETRAIN_DEFAULTS
    p = sub.add_parser(
        "pretrain", help="train a GPT on real text, against n-gram baselines",
        description="Pre-train a decoder-only transformer on a text (default: the docstrings of "
        "the installed Python standard library) by next-token prediction, and report held-out "
        "bits per byte and perplexity beside smoothed unigram, bigram and trigram models "
        "fitted on the same training text.")
    g = p.add_argument_group("text")
    g.add_argument("--text", type=text_file, metavar="FILE",
                   help="training text, UTF-8 (default: standard-library docstrings)")
    g.add_argument("--val-text", type=text_file, metavar="FILE",
                   help="held-out text (default: the last tenth of --text)")
    g.add_argument("--tokenizer", choices=TOKENIZERS, default=None,
                   help=f"byte-level BPE learnt on the text, UTF-8 bytes, or characters "
                   f"(default {d['tokenizer']})")
    g.add_argument("--vocab-size", type=positive_int, metavar="N",
                   help=f"BPE vocabulary size (default {d['vocab_size']})")
    g = p.add_argument_group("model")
    g.add_argument("--context", type=positive_int, metavar="T",
                   help=f"context length: tokens per training window (default {d['context']})")
    g.add_argument("--d-model", type=positive_int, metavar="N",
                   help=f"width (default {m['d_model']})")
    g.add_argument("--n-layers", type=positive_int, metavar="N",
                   help=f"decoder blocks (default {m['n_layers']})")
    g.add_argument("--n-heads", type=positive_int, metavar="N",
                   help=f"attention heads (default {m['n_heads']})")
    g.add_argument("--n-kv-heads", type=positive_int, metavar="N",
                   help="key/value heads: GQA, 1 = MQA (default: n-heads)")
    g.add_argument("--d-ff", type=positive_int, metavar="N", help="FFN width (default 4 d-model)")
    g.add_argument("--positional", choices=("learned", "sinusoidal", "rope"),
                   help=f"position representation (default {m['positional']})")
    g.add_argument("--norm", choices=("pre", "post"),
                   help=f"pre- or post-norm (default {m['norm']})")
    g.add_argument("--activation", choices=("relu", "gelu", "gelu_tanh"),
                   help=f"FFN activation (default {m['activation']})")
    g = p.add_argument_group("length of the run")
    g.add_argument("--minutes", type=positive_float, metavar="M",
                   help=f"wall-clock budget (default {d['minutes']:g} for a new run without "
                   "--steps): the steps are planned from the measured speed, training stops when "
                   "the budget is used, then the final evaluation runs")
    shown = dict(PRETRAIN_SETTINGS, steps=f"planned from --minutes {d['minutes']:g}")
    add_training_options(p, shown, out="runs/pretrain")
    p.add_argument("--samples", type=nonnegative_int, default=3, metavar="N",
                   help="continuations printed at the end (default 3)")
    p.set_defaults(func=cmd_pretrain)
