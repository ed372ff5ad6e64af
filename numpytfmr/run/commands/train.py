"""``numpytfmr train``: train a small GPT on a built-in character task, evaluate it by
greedy generation on held-out prompts, and save a checkpoint that ``--resume`` continues.

    numpytfmr train                          # sort 1-8 digits, about two minutes
    numpytfmr train --task reverse --steps 800 --out runs/reverse
    numpytfmr train --resume --steps 2000    # continue runs/gpt to 2000 steps
    numpytfmr train --force                  # start again in runs/gpt, replacing its run
    numpytfmr generate --prompt 3142         # -> 1234

A run never replaces the work in its directory unless asked: into a directory that
already holds files, ``train`` starts only with ``--resume`` (continue that run) or
``--force`` (replace it).
"""
from contextlib import contextmanager
import os
import sys

from numpytfmr.run.cli import (UsageError, nonnegative_float, nonnegative_int, output_dir,
                               output_file, positive_float, positive_int)

# Defaults shown in --help; the option values stay None unless given, so that --resume
# can tell an option the user asked for from a default.
TRAIN_DEFAULTS = {"steps": 1500, "batch_size": 64, "lr": 3e-3, "warmup_steps": 100,
                  "weight_decay": 0.01, "clip_norm": 1.0, "seed": 0, "eval_every": 250}
GPT_DEFAULTS = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": None, "d_ff": None,
                "positional": "learned", "norm": "pre", "activation": "relu"}
SETTINGS_OPTIONS = tuple(TRAIN_DEFAULTS)


def add_training_options(p, d, *, out, out_help=None):
    """Options shared by ``train`` and ``train-seq2seq``: the optimisation (defaults ``d``),
    the run's directory (default ``out``) and what is printed."""
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive_int, metavar="N",
                   help=f"total AdamW updates of the run (default {d['steps']})")
    g.add_argument("--batch-size", type=positive_int, metavar="B",
                   help=f"examples per update (default {d['batch_size']})")
    g.add_argument("--lr", type=positive_float, help=f"peak learning rate (default {d['lr']:g}), "
                   "after a linear warmup, then cosine decay to 0")
    g.add_argument("--warmup", dest="warmup_steps", type=nonnegative_int, metavar="N",
                   help=f"warmup steps (default {d['warmup_steps']}, at most a tenth of --steps)")
    g.add_argument("--weight-decay", type=nonnegative_float, metavar="W",
                   help=f"AdamW decoupled weight decay on matrices (default {d['weight_decay']:g})")
    g.add_argument("--clip", dest="clip_norm", type=positive_float, metavar="NORM",
                   help=f"clip the global gradient norm to this (default {d['clip_norm']:g})")
    g.add_argument("--seed", type=nonnegative_int, help="seed of the initial weights and of the "
                   f"data of every step (default {d['seed']})")
    g.add_argument("--eval-every", type=positive_int, metavar="N",
                   help=f"evaluate and save a checkpoint every N steps (default {d['eval_every']})")
    add_run_options(p, out, out_help or f"checkpoint directory (default {out}); 'none' saves "
                    "nothing", resume=True)


def add_run_options(p, out, out_help, *, resume=False):
    """--out, --force (and --resume), --summary, --threads, --quiet: shared by every command
    that trains."""
    g = p.add_argument_group("run")
    g.add_argument("--out", default=out, type=output_dir, metavar="DIR", help=out_help)
    if resume:
        g.add_argument("--resume", action="store_true",
                       help="continue the run saved in --out (same model, data and settings; "
                       "--steps may set a new total)")
    g.add_argument("--force", action="store_true",
                   help="start even if --out already holds files (a previous run), replacing "
                   "that run; without it such a directory is refused")
    g.add_argument("--summary", type=output_file, metavar="FILE",
                   help="write the final metrics as one JSON object to FILE (its directory "
                   "must exist)")
    g.add_argument("--plot", type=output_file, metavar="FILE",
                   help="draw the run's curves into this PNG (default: curves.png in --out, "
                   "when matplotlib is installed: pip install 'numpytfmr[plot]')")
    g.add_argument("--threads", type=positive_int, default=1, metavar="N",
                   help="BLAS threads (default 1: these matrices are too small to share)")
    g.add_argument("--quiet", action="store_true", help="no progress bar or evaluation lines")


def settings_from_args(args, defaults):
    """``(TrainSettings for a new run, changes dict for a resumed one)``."""
    from numpytfmr.run.loop import TrainSettings
    given = {k: getattr(args, k) for k in SETTINGS_OPTIONS if getattr(args, k) is not None}
    if args.resume:
        return None, given
    values = {**defaults, **given}
    if "warmup_steps" not in given:         # a short run gets a tenth of its steps as warmup
        values["warmup_steps"] = min(defaults["warmup_steps"], values["steps"] // 10)
    elif values["warmup_steps"] >= values["steps"]:
        raise UsageError(f"--warmup is {values['warmup_steps']} but the run has "
                         f"{values['steps']} steps (--steps); expected fewer warmup steps")
    return TrainSettings(**values), None


def out_dir(args):
    return None if args.out in (None, "", "none") else args.out


def check_out(args, command):
    """Refuse, before any work, a run that would lose work or find nothing: ``--resume``
    without a checkpoint in ``--out``, and a new run into a directory that already holds
    files, unless ``--force``. Returns the directory (None for ``--out none``)."""
    out = out_dir(args)
    resume = getattr(args, "resume", False)
    if getattr(args, "plot", None):
        from numpytfmr.run.plot import plot_available
        if not plot_available():
            raise UsageError(f"--plot {args.plot}: matplotlib is not installed; install it "
                             "(pip install 'numpytfmr[plot]') or drop --plot")
        if os.path.exists(args.plot) and not args.force:
            raise UsageError(f"--plot {args.plot} already exists; pass --force to replace it, "
                             "or name another file")
    if resume and args.force:
        raise UsageError("--resume continues the run in --out and --force replaces it; "
                         "give one of them")
    if out is None:
        if resume:
            raise UsageError("--resume needs the run's directory --out DIR")
        return None
    if resume:
        if not os.path.isfile(os.path.join(out, "checkpoint.json")):
            raise UsageError(f"--resume: no checkpoint in {out} (--out) to continue; expected "
                             f"a directory written by numpytfmr {command}")
        from numpytfmr.run.checkpoint import load_checkpoint
        try:
            load_checkpoint(out)
        except ValueError as exc:
            raise UsageError(f"--resume: {exc}") from None
        return out
    if os.path.isdir(out) and os.listdir(out) and not args.force:
        what = ("a checkpoint" if os.path.exists(os.path.join(out, "checkpoint.json"))
                else "files")
        options = "--resume to continue that run, " if hasattr(args, "resume") else ""
        raise UsageError(f"--out {out} already holds {what}; pass {options}--force to replace "
                         "it, or choose another --out")
    return out


def model_config(build, args, names):
    """``build()`` (a model config from the command line); a config that refuses the sizes
    given is a usage error naming their flags."""
    try:
        return build()
    except (TypeError, ValueError) as exc:
        given = [f"--{n.replace('_', '-')} {getattr(args, n)}" for n in names
                 if getattr(args, n, None) is not None]
        raise UsageError(f"{', '.join(given) or 'the default model'}: {exc}") from None


def logger(args):
    """One line per evaluation on stderr (where the progress bar is), or nothing."""
    if args.quiet:
        return None

    def log(line):
        prefix = "\r\033[K" if sys.stderr.isatty() else ""   # clear a redrawn bar first
        print(prefix + line, file=sys.stderr, flush=True)
    return log


def finish(args, summary, lines, panels=None, title=None):
    """Draw the run's curves (``panels``, default ``plot.run_panels(summary)``) into
    ``--plot`` or the run folder's curves.png, print the result lines and write
    ``--summary`` (which records the picture's path as ``"plot"``)."""
    from numpytfmr.shared import fileio
    from numpytfmr.run.plot import CURVES_FILE, plot_available, run_panels, save_curves
    out = out_dir(args)
    path = getattr(args, "plot", None) or (os.path.join(out, CURVES_FILE) if out else None)
    summary["plot"] = None
    if path is not None and plot_available():
        save_curves(path, run_panels(summary) if panels is None else panels, title)
        summary["plot"] = path
        lines = list(lines) + [f"curves: {path}"]
    elif path is not None:
        lines = list(lines) + ["curves: not drawn, matplotlib is not installed "
                               "(pip install 'numpytfmr[plot]')"]
    for line in lines:
        print(line)
    if args.summary:
        fileio.write_summary(args.summary, summary)


@contextmanager
def resume_hint(args, command):
    """On Ctrl-C, say where the run was saved and how to continue it."""
    try:
        yield
    except KeyboardInterrupt:
        out = out_dir(args)
        if out is not None and os.path.exists(os.path.join(out, "checkpoint.json")):
            from numpytfmr.run.checkpoint import load_checkpoint
            try:
                step = load_checkpoint(out)["state"]["step"]
                print(f"\nsaved step {step} in {out}; continue with: numpytfmr {command} "
                      f"--resume --out {out}", file=sys.stderr)
            except (ValueError, KeyError, TypeError):
                pass
        raise


def cmd_train(args):
    from numpytfmr.run.blas import blas_threads
    check_out(args, "train")
    with blas_threads(args.threads), resume_hint(args, "train"):
        return _train(args)


def _train(args):
    from numpytfmr.run.models import default_gpt_config, replace_config
    from numpytfmr.run.tasks import GPT_TASK_DEFAULTS, train_gpt
    settings, changes = settings_from_args(args, TRAIN_DEFAULTS)
    model_opts = {k: getattr(args, k) for k in GPT_DEFAULTS if getattr(args, k) is not None}
    task_opts = {"task": args.task, "min_prompt_len": args.min_prompt_len,
                 "max_prompt_len": args.max_prompt_len, "n_test": args.n_test}
    out = out_dir(args)
    if args.resume:
        changes.update(model_opts)
        changes.update({k: v for k, v in task_opts.items() if v is not None})
        params, summary = train_gpt(out=out, resume=True, changes=changes,
                                    progress=not args.quiet, log=logger(args))
    else:
        from numpytfmr.run.data import CharTokenizer
        max_len = task_opts["max_prompt_len"] or GPT_TASK_DEFAULTS["max_len"]
        min_len = task_opts["min_prompt_len"] or GPT_TASK_DEFAULTS["min_len"]
        if min_len > max_len:
            raise UsageError(f"--min-prompt-len is {min_len} but --max-prompt-len is {max_len}; "
                             "expected min <= max")
        config = model_config(lambda: replace_config(
            default_gpt_config(CharTokenizer().vocab_size, max_len), **model_opts),
            args, GPT_DEFAULTS)
        params, summary = train_gpt(config=config, settings=settings, task=args.task,
                                    min_len=args.min_prompt_len, max_len=args.max_prompt_len,
                                    n_test=args.n_test, out=out, progress=not args.quiet,
                                    log=logger(args))
    lines = [f"{summary['task']}: exact match {100 * summary['exact_match']:.1f}% on "
             f"{summary['n_test']} held-out prompts after {summary['steps']} steps "
             f"(train loss {summary['loss']:.4f}, "
             f"{summary['seconds']:.0f} s, {summary['tokens_per_second']:,.0f} tokens/s)"]
    if out is not None:
        lines.append(f"checkpoint: {summary['checkpoint']}")
    finish(args, summary, lines, title=f"numpytfmr train: {summary['task']}")
    return 0


def add_command(sub):
    from numpytfmr.run.data import TASKS
    p = sub.add_parser(
        "train", help="train a small GPT on a built-in task (default: sort digits)",
        description="Train a decoder-only transformer on a built-in character task "
        "('<bos> prompt <sep> answer <eos>', loss on the answer), evaluate it by greedy "
        "generation with the KV cache on held-out prompts, and save a checkpoint.")
    g = p.add_argument_group("task")
    g.add_argument("--task", choices=[t for t in TASKS], default=None,
                   help="the task (default sort)")
    g.add_argument("--min-prompt-len", type=positive_int, metavar="N",
                   help="shortest prompt (default 1)")
    g.add_argument("--max-prompt-len", type=positive_int, metavar="N",
                   help="longest prompt (default 8)")
    g.add_argument("--n-test", type=positive_int, metavar="N",
                   help="held-out prompts for the exact match (default 500)")
    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=positive_int, metavar="N", help="width (default 64)")
    g.add_argument("--n-layers", type=positive_int, metavar="N", help="decoder blocks (default 2)")
    g.add_argument("--n-heads", type=positive_int, metavar="N", help="attention heads (default 4)")
    g.add_argument("--n-kv-heads", type=positive_int, metavar="N", help="key/value heads: GQA, "
                   "1 = MQA (default: n-heads)")
    g.add_argument("--d-ff", type=positive_int, metavar="N", help="FFN width (default 4 d-model)")
    g.add_argument("--positional", choices=("learned", "sinusoidal", "rope"),
                   help="position representation (default learned)")
    g.add_argument("--norm", choices=("pre", "post"), help="pre- or post-norm (default pre)")
    g.add_argument("--activation", choices=("relu", "gelu", "gelu_tanh"),
                   help="FFN activation (default relu)")
    add_training_options(p, TRAIN_DEFAULTS, out="runs/gpt")
    p.set_defaults(func=cmd_train)
