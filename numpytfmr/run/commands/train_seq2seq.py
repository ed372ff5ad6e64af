"""``numpytfmr train-seq2seq``: train an encoder-decoder on the toy English -> French task,
evaluate it on held-out sentences, and print the attention alignment of one translation
(a table like the notes' Je/suis/en example, 003 §5.1).

    numpytfmr train-seq2seq                      # the transformer, about a minute
    numpytfmr train-seq2seq --model rnn          # GRU encoder-decoder with Bahdanau attention
    numpytfmr train-seq2seq --sentence "the black cat sees a red car"

Each model has its own default directory, ``runs/seq2seq-transformer`` and
``runs/seq2seq-rnn``, so training one never replaces the other; as for ``train``, a
directory that already holds a run is continued with ``--resume`` or replaced with
``--force``, never overwritten silently.
"""
import argparse

from numpytfmr.run.cli import UsageError, positive_int
from numpytfmr.run.options import (TRAIN_DEFAULTS, add_model_options, add_training_options,
                                   command_parser, model_config, settings_from_args)
from numpytfmr.run.outputs import check_out, finish, logger, out_dir, resume_hint, task_lines

SEQ2SEQ_TRAIN_DEFAULTS = dict(TRAIN_DEFAULTS, steps=500, eval_every=100)
MODELS = {"transformer": "encdec", "rnn": "rnn"}
DEFAULT_OUT = {name: f"runs/seq2seq-{name}" for name in MODELS}
# command-line option -> config field, per model (the others do not apply to that model)
TRANSFORMER_OPTIONS = {"d_model": "d_model", "n_layers": ("n_enc_layers", "n_dec_layers"),
                       "n_heads": "n_heads", "positional": "positional", "norm": "norm"}
RNN_OPTIONS = {"d_hidden": "d_hidden", "d_emb": "d_emb", "bidirectional": "bidirectional"}


def _model_changes(args, kind):
    """Config fields given on the command line, checked against the chosen model."""
    mine, other = ((TRANSFORMER_OPTIONS, RNN_OPTIONS) if kind == "encdec"
                   else (RNN_OPTIONS, TRANSFORMER_OPTIONS))
    for opt in other:
        if getattr(args, opt) is not None:
            model = "transformer" if kind == "rnn" else "rnn"
            raise UsageError(f"--{opt.replace('_', '-')} applies to --model {model} only")
    fields = {}
    for opt, field in mine.items():
        value = getattr(args, opt)
        if value is None:
            continue
        for f in (field if isinstance(field, tuple) else (field,)):
            fields[f] = value
    return fields


def cmd_train_seq2seq(args):
    from numpytfmr.run.blas import blas_threads
    from numpytfmr.run.cli import output_dir
    if args.out is None:                  # the model's own directory
        args.out = output_dir(DEFAULT_OUT[args.model or "transformer"])
    check_out(args, "train-seq2seq")
    with blas_threads(args.threads), resume_hint(args, "train-seq2seq"):
        return _train_seq2seq(args)


def _train_seq2seq(args):
    from numpytfmr.run.data import translation_tokenizers
    from numpytfmr.run.models import replace_config, seq2seq_model
    from numpytfmr.run.tasks import alignment_table, train_seq2seq, translate, unknown_words
    src_tok, tgt_tok = translation_tokenizers()
    unknown = unknown_words(src_tok, args.sentence)   # an error now, not after training
    if not args.sentence.split():
        raise UsageError("--sentence is empty; expected a sentence of the toy English")
    if unknown:
        raise UsageError(f"--sentence {args.sentence!r} has the unknown word"
                         f"{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         "the toy English has the "
                         f"{len(src_tok.words)} words: {' '.join(src_tok.words)}")
    settings, changes = settings_from_args(args, SEQ2SEQ_TRAIN_DEFAULTS)
    out = out_dir(args)
    if args.resume:
        from numpytfmr.run.checkpoint import load_checkpoint
        kind = load_checkpoint(out, kind=("encdec", "rnn"))["kind"]
        if args.model is not None and MODELS[args.model] != kind:
            trained = "transformer" if kind == "encdec" else "rnn"
            raise UsageError(f"--model is {args.model} but the run in {out} (--out) trained the "
                             f"{trained} model")
        changes.update(_model_changes(args, kind))
        if args.n_test is not None:
            changes["n_test"] = args.n_test
        params, config, summary = train_seq2seq(out=out, resume=True, changes=changes,
                                                progress=not args.quiet, log=logger(args))
    else:
        kind = MODELS[args.model or "transformer"]
        model = seq2seq_model(kind)
        config = model["default_config"](src_tok.vocab_size, tgt_tok.vocab_size)
        config = model_config(lambda: replace_config(config, **_model_changes(args, kind)), args,
                              tuple(TRANSFORMER_OPTIONS) + tuple(RNN_OPTIONS))
        n_words = src_tok.encode(args.sentence).size
        if getattr(config, "positional", None) == "learned" and n_words > config.max_len:
            raise UsageError(f"--sentence has {n_words} words but the model reads at most "
                             f"{config.max_len}")
        params, config, summary = train_seq2seq(kind=kind, config=config, settings=settings,
                                                n_test=args.n_test, out=out,
                                                progress=not args.quiet, log=logger(args))
    name = "transformer" if kind == "encdec" else "rnn (GRU + Bahdanau attention)"
    lines = task_lines(name, summary, "sentences")
    words, source, weights = translate(params, kind, config, src_tok, tgt_tok, args.sentence)
    where = ("cross-attention of the last decoder layer, mean over heads" if kind == "encdec"
             else "Bahdanau attention weights")
    lines += ["", f"{args.sentence} -> {' '.join(w for w in words if w != '<eos>')}",
              f"alignment (row: the word chosen; {where}):",
              alignment_table(words, source, weights)]
    summary["alignment"] = {"source": source, "target": words, "weights": weights}
    finish(args, summary, lines)
    return 0


def add_command(sub):
    p = command_parser(sub, "train-seq2seq")
    p.add_argument("--model", choices=tuple(MODELS), default=None,
                   help="transformer (default) or rnn (GRU encoder-decoder with Bahdanau "
                   "attention)")
    p.add_argument("--sentence", default="i am a student", metavar="TEXT",
                   help="sentence whose alignment table is printed (default 'i am a student')")
    p.add_argument("--n-test", type=positive_int, metavar="N",
                   help="held-out sentences for the exact match (default 400)")
    g = p.add_argument_group("transformer")
    add_model_options(g, {"d_model": 64, "n_layers": 2, "n_heads": 4, "positional": "learned",
                          "norm": "pre"}, layers="encoder and decoder blocks, each")
    g = p.add_argument_group("rnn")
    g.add_argument("--d-hidden", type=positive_int, metavar="N", help="GRU state size (default 64)")
    g.add_argument("--d-emb", type=positive_int, metavar="N",
                   help="word embedding size (default 32)")
    g.add_argument("--bidirectional", action=argparse.BooleanOptionalAction, default=None,
                   help="bidirectional encoder, as Bahdanau et al. (default); "
                   "--no-bidirectional for one GRU")
    add_training_options(p, SEQ2SEQ_TRAIN_DEFAULTS, out=None, out_help="checkpoint directory "
                         f"(default {DEFAULT_OUT['transformer']} or {DEFAULT_OUT['rnn']}, "
                         "after --model); 'none' saves nothing")
    p.set_defaults(func=cmd_train_seq2seq)

