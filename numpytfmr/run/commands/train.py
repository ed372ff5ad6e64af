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
from numpytfmr.run.cli import UsageError, positive_int
from numpytfmr.run.options import (TRAIN_DEFAULTS, add_model_options, add_training_options,
                                   command_parser, model_config, settings_from_args)
from numpytfmr.run.outputs import check_out, finish, logger, out_dir, resume_hint, task_lines

# Defaults shown in --help (the training's, TRAIN_DEFAULTS, are in run/options.py); the
# option values stay None unless given, so that --resume can tell an option the user asked
# for from a default.
GPT_DEFAULTS = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": None, "d_ff": None,
                "positional": "learned", "norm": "pre", "activation": "relu"}


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
    finish(args, summary, task_lines(summary["task"], summary, "prompts"),
           title=f"numpytfmr train: {summary['task']}")
    return 0


def add_command(sub):
    from numpytfmr.run.data import TASKS
    p = command_parser(sub, "train")
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
    add_model_options(g, GPT_DEFAULTS)
    add_training_options(p, TRAIN_DEFAULTS, out="runs/gpt")
    p.set_defaults(func=cmd_train)
