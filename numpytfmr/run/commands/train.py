"""``numpytfmr train``: train a small GPT on a built-in character task, evaluate it by
greedy generation on held-out prompts, and save a checkpoint that ``--resume`` continues.

    numpytfmr train                          # sort 1-8 digits, about two minutes
    numpytfmr train --task reverse --steps 800 --out runs/reverse
    numpytfmr train --resume --steps 2000    # continue runs/gpt to 2000 steps
    numpytfmr generate --prompt 3142         # -> 1234
"""
from contextlib import contextmanager
import os
import sys

# Defaults shown in --help; the option values stay None unless given, so that --resume
# can tell an option the user asked for from a default.
TRAIN_DEFAULTS = {"steps": 1500, "batch_size": 64, "lr": 3e-3, "warmup_steps": 100,
                  "weight_decay": 0.01, "clip_norm": 1.0, "seed": 0, "eval_every": 250}
GPT_DEFAULTS = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": None, "d_ff": None,
                "positional": "learned", "norm": "pre", "activation": "relu"}
SETTINGS_OPTIONS = tuple(TRAIN_DEFAULTS)


def add_training_options(p, d, *, out):
    """Options shared by ``train`` and ``train-seq2seq``: the optimisation (defaults ``d``),
    the run's directory and what is printed."""
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, metavar="N",
                   help=f"total AdamW updates of the run (default {d['steps']})")
    g.add_argument("--batch-size", type=int, metavar="B",
                   help=f"examples per update (default {d['batch_size']})")
    g.add_argument("--lr", type=float, help=f"peak learning rate (default {d['lr']:g}), after a "
                   "linear warmup, then cosine decay to 0")
    g.add_argument("--warmup", dest="warmup_steps", type=int, metavar="N",
                   help=f"warmup steps (default {d['warmup_steps']}, at most a tenth of --steps)")
    g.add_argument("--weight-decay", type=float, metavar="W",
                   help=f"AdamW decoupled weight decay on matrices (default {d['weight_decay']:g})")
    g.add_argument("--clip", dest="clip_norm", type=float, metavar="NORM",
                   help=f"clip the global gradient norm to this (default {d['clip_norm']:g})")
    g.add_argument("--seed", type=int, help="seed of the initial weights and of the data of "
                   f"every step (default {d['seed']})")
    g.add_argument("--eval-every", type=int, metavar="N",
                   help=f"evaluate and save a checkpoint every N steps (default {d['eval_every']})")
    g = p.add_argument_group("run")
    g.add_argument("--out", default=out, metavar="DIR",
                   help=f"checkpoint directory (default {out}); 'none' saves nothing")
    g.add_argument("--resume", action="store_true",
                   help="continue the run saved in --out (same model, data and settings; "
                   "--steps may set a new total)")
    g.add_argument("--summary", metavar="FILE",
                   help="write the final metrics as one JSON object to FILE")
    g.add_argument("--threads", type=int, default=1, metavar="N",
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
    return TrainSettings(**values), None


def out_dir(args):
    return None if args.out in (None, "", "none") else args.out


def logger(args):
    """One line per evaluation on stderr (where the progress bar is), or nothing."""
    if args.quiet:
        return None

    def log(line):
        prefix = "\r\033[K" if sys.stderr.isatty() else ""   # clear a redrawn bar first
        print(prefix + line, file=sys.stderr, flush=True)
    return log


def finish(args, summary, lines):
    """Print the result lines and write ``--summary``."""
    from numpytfmr.run import fileio
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


def check_counts(args, names):
    for name in names:
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} is {v}; expected an integer >= 1")


def cmd_train(args):
    from numpytfmr.run.blas import blas_threads
    check_counts(args, ("steps", "batch_size", "eval_every", "threads", "n_test", "d_model",
                        "n_layers", "n_heads", "n_kv_heads", "d_ff"))
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
        if out is None:
            raise ValueError("--resume needs the run's directory --out DIR")
        changes.update(model_opts)
        changes.update({k: v for k, v in task_opts.items() if v is not None})
        params, summary = train_gpt(out=out, resume=True, changes=changes,
                                    progress=not args.quiet, log=logger(args))
    else:
        from numpytfmr.run.data import CharTokenizer
        max_len = task_opts["max_prompt_len"] or GPT_TASK_DEFAULTS["max_len"]
        config = replace_config(default_gpt_config(CharTokenizer().vocab_size, max_len),
                                **model_opts)
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
    finish(args, summary, lines)
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
    g.add_argument("--min-prompt-len", type=int, metavar="N", help="shortest prompt (default 1)")
    g.add_argument("--max-prompt-len", type=int, metavar="N", help="longest prompt (default 8)")
    g.add_argument("--n-test", type=int, metavar="N",
                   help="held-out prompts for the exact match (default 500)")
    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=int, metavar="N", help="width (default 64)")
    g.add_argument("--n-layers", type=int, metavar="N", help="decoder blocks (default 2)")
    g.add_argument("--n-heads", type=int, metavar="N", help="attention heads (default 4)")
    g.add_argument("--n-kv-heads", type=int, metavar="N", help="key/value heads: GQA, 1 = MQA "
                   "(default: n-heads)")
    g.add_argument("--d-ff", type=int, metavar="N", help="FFN width (default 4 d-model)")
    g.add_argument("--positional", choices=("learned", "sinusoidal", "rope"),
                   help="position representation (default learned)")
    g.add_argument("--norm", choices=("pre", "post"), help="pre- or post-norm (default pre)")
    g.add_argument("--activation", choices=("relu", "gelu", "gelu_tanh"),
                   help="FFN activation (default relu)")
    add_training_options(p, TRAIN_DEFAULTS, out="runs/gpt")
    p.set_defaults(func=cmd_train)
