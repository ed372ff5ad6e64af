"""The command line's shared flag groups and the reading of their values: what several
commands of ``numpytfmr/run/commands/`` declare alike is declared here once.

- :func:`add_force`, :func:`add_summary`, :func:`add_threads`, :func:`add_quiet`,
  :func:`add_minutes`, :func:`add_steps`: one flag each, for every command that takes it;
- :func:`add_run_options`: ``--out``, ``--resume``, ``--force``, ``--summary``, ``--plot``,
  ``--threads``, ``--quiet`` (every command that trains);
- :func:`add_model_options`: the shape of a transformer (``train``, ``pretrain``,
  ``train-seq2seq``);
- :func:`add_training_options`: the optimisation of ``train`` and ``train-seq2seq``;
- :func:`add_base_options`, :func:`add_adapter_options`, :func:`add_adapter_run_options`:
  the base model, the adapters (``--rank``, ``--alpha``, ``--targets``) and the time budget
  (``--minutes`` or ``--steps``) of ``lora`` and ``dpo``, checked by :func:`check_flags`;
- argument types and readers of files: :func:`text_file`, :func:`read_text`;
- :func:`command_parser`: a command's sub-parser, its help and description read from
  ``run/commands/commands.json`` (prose kept as data, beside the modules that add the flags).

The run folder and what a command prints and writes at the end are in ``run/outputs.py``.
"""
import argparse
import functools
import json
import os

from numpytfmr.run.cli import (UsageError, checkpoint_path, nonnegative_float, nonnegative_int,
                               output_dir, output_file, positive_float, positive_int, readable)

@functools.lru_cache(maxsize=1)
def _command_texts():
    path = os.path.join(os.path.dirname(__file__), "commands", "commands.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def command_parser(sub, name):
    """The sub-parser of the command ``name``: its one-line help (the list of ``numpytfmr
    --help``) and its description (``numpytfmr NAME --help``) are data, in
    run/commands/commands.json; the command's module adds its flags."""
    text = _command_texts()[name]
    return sub.add_parser(name, help=text["help"], description=text["description"])


# ---------------------------------------------------------------------------------------
# The flags several commands take, each declared here once (its name, type and metavar); the
# help says what it means for the command that adds it.
# ---------------------------------------------------------------------------------------

def add_force(p, help):
    """``--force``: replace or write over what a previous run left (the command says what)."""
    p.add_argument("--force", action="store_true", help=help)


def add_summary(p, help="write the final metrics as one JSON object to FILE (its directory "
                "must exist)"):
    """``--summary FILE``: the final figures as one JSON object."""
    p.add_argument("--summary", type=output_file, metavar="FILE", help=help)


def add_threads(p, help="BLAS threads (default 1: these matrices are too small to share)"):
    """``--threads N`` (default 1): the BLAS threads of the run (``run/blas.py``)."""
    p.add_argument("--threads", type=positive_int, default=1, metavar="N", help=help)


def add_quiet(p, help="no progress bar"):
    """``--quiet``: nothing on stderr while the command works."""
    p.add_argument("--quiet", action="store_true", help=help)


def add_minutes(p, help):
    """``--minutes M``: a wall-clock budget; the steps are planned from the measured speed."""
    p.add_argument("--minutes", type=positive_float, metavar="M", help=help)


def add_steps(p, help):
    """``--steps N``: the number of AdamW updates (the other way to set a run's length)."""
    p.add_argument("--steps", type=positive_int, metavar="N", help=help)


# ---------------------------------------------------------------------------------------
# Training: ``train``, ``train-seq2seq``, ``pretrain``
# ---------------------------------------------------------------------------------------

# Defaults shown in --help; the option values stay None unless given, so that --resume
# can tell an option the user asked for from a default.
TRAIN_DEFAULTS = {"steps": 1500, "batch_size": 64, "lr": 3e-3, "warmup_steps": 100,
                  "weight_decay": 0.01, "clip_norm": 1.0, "seed": 0, "eval_every": 250}
SETTINGS_OPTIONS = tuple(TRAIN_DEFAULTS)


def add_training_options(p, d, *, out, out_help=None):
    """Options shared by ``train`` and ``train-seq2seq``: the optimisation (defaults ``d``),
    the run's directory (default ``out``) and what is printed."""
    g = p.add_argument_group("training")
    add_steps(g, f"total AdamW updates of the run (default {d['steps']})")
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


def add_model_options(g, m, *, layers="decoder blocks"):
    """The shape of a transformer, defaults ``m`` shown in the help: ``--d-model``,
    ``--n-layers`` (``layers``: what one layer is), ``--n-heads``, for a GPT (``m`` has
    ``n_kv_heads``) ``--n-kv-heads`` and ``--d-ff``, then ``--positional``, ``--norm`` and,
    where ``m`` has one, ``--activation`` (``train``, ``pretrain``, ``train-seq2seq``)."""
    g.add_argument("--d-model", type=positive_int, metavar="N",
                   help=f"width (default {m['d_model']})")
    g.add_argument("--n-layers", type=positive_int, metavar="N",
                   help=f"{layers} (default {m['n_layers']})")
    g.add_argument("--n-heads", type=positive_int, metavar="N",
                   help=f"attention heads (default {m['n_heads']})")
    if "n_kv_heads" in m:
        g.add_argument("--n-kv-heads", type=positive_int, metavar="N",
                       help="key/value heads: GQA, 1 = MQA (default: n-heads)")
        g.add_argument("--d-ff", type=positive_int, metavar="N",
                       help="FFN width (default 4 d-model)")
    g.add_argument("--positional", choices=("learned", "sinusoidal", "rope"),
                   help=f"position representation (default {m['positional']})")
    g.add_argument("--norm", choices=("pre", "post"),
                   help=f"pre- or post-norm (default {m['norm']})")
    if "activation" in m:
        g.add_argument("--activation", choices=("relu", "gelu", "gelu_tanh"),
                       help=f"FFN activation (default {m['activation']})")


def add_run_options(p, out, out_help, *, resume=False):
    """--out, --force (and --resume), --summary, --threads, --quiet: shared by every command
    that trains."""
    g = p.add_argument_group("run")
    g.add_argument("--out", default=out, type=output_dir, metavar="DIR", help=out_help)
    if resume:
        g.add_argument("--resume", action="store_true",
                       help="continue the run saved in --out (same model, data and settings; "
                       "--steps may set a new total)")
    add_force(g, "start even if --out already holds files (a previous run), replacing that "
              "run; without it such a directory is refused")
    add_summary(g)
    g.add_argument("--plot", type=output_file, metavar="FILE",
                   help="draw the run's curves into this PNG (default: curves.png in --out, "
                   "when matplotlib is installed: pip install 'numpytfmr[plot]')")
    add_threads(g)
    add_quiet(g, "no progress bar or evaluation lines")


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


def model_config(build, args, names):
    """``build()`` (a model config from the command line); a config that refuses the sizes
    given is a usage error naming their flags."""
    try:
        return build()
    except (TypeError, ValueError) as exc:
        given = [f"--{n.replace('_', '-')} {getattr(args, n)}" for n in names
                 if getattr(args, n, None) is not None]
        raise UsageError(f"{', '.join(given) or 'the default model'}: {exc}") from None


def text_file(text):
    """A readable file (``--text``, ``--val-text``, ``--tokens``, ``--val-tokens``)."""
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is not a file; expected an "
                                         "existing file")
    return readable(path, f"is {text!r}, which is not readable")


def read_text(path, flag):
    """The UTF-8 text of ``path``; a UsageError naming ``flag`` when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot be read as UTF-8 text ({exc})") from None


# ---------------------------------------------------------------------------------------
# ``lora`` and ``dpo``: the base model, the adapters and the budget
# ---------------------------------------------------------------------------------------

BASE_DEFAULTS = {"steps": 1000, "min_len": 1, "max_len": 6, "n_test": 300}


def add_base_options(p, *, task, steps):
    """--checkpoint, or the base model the command trains itself. The options of the
    built-in tasks default to None, so that one given where it does not apply is refused
    (:func:`check_flags`); their defaults are filled in afterwards."""
    g = p.add_argument_group("base model")
    g.add_argument("--checkpoint", type=checkpoint_path, metavar="PATH",
                   help="a GPT checkpoint (directory or its checkpoint.json): of 'numpytfmr "
                   "pretrain' (a model of text, tuned on --text or --data), or of 'numpytfmr "
                   "train' (a task model); default: train a small task model first")
    g.add_argument("--base-task", metavar="TASK",
                   help=f"task of the base model trained here, without --checkpoint "
                   f"(default {task})")
    g.add_argument("--base-steps", type=positive_int, metavar="N",
                   help=f"training steps of that base model (default {steps})")
    g.add_argument("--max-prompt-len", type=positive_int, metavar="N",
                   help="longest prompt of the base model trained here (default "
                   f"{BASE_DEFAULTS['max_len']}); a checkpoint keeps its own")
    p.set_defaults(base_defaults={"base_task": task, "base_steps": steps,
                                  "max_prompt_len": BASE_DEFAULTS["max_len"]})


def add_adapter_options(p, d):
    """The adapters and their training; defaults ``d``, filled in after the checks (the
    values stay None unless given)."""
    g = p.add_argument_group("LoRA")
    g.add_argument("--rank", type=positive_int, metavar="R",
                   help=f"rank r of each adapter (default {d['rank']})")
    g.add_argument("--alpha", type=positive_float,
                   help=f"LoRA alpha; the update is (alpha / r) A B (default {d['alpha']:g})")
    g.add_argument("--targets", metavar="NAMES",
                   help="comma-separated projections to adapt in every block, among Wq, Wk, Wv, "
                   f"Wo, W1, W2 (default {d['targets']})")
    g = p.add_argument_group("training")
    add_minutes(g, "wall-clock budget of the whole command: the steps are planned from the "
                "measured speed and re-planned as the run goes, so that it ends near M minutes "
                "(instead of --steps)")
    add_steps(g, f"AdamW updates of the adapters (default {d['steps']})")
    g.add_argument("--lr", type=positive_float, help=f"peak learning rate (default {d['lr']:g})")
    g.add_argument("--batch-size", type=positive_int, metavar="B",
                   help=f"examples (or preference pairs) per update (default {d['batch_size']})")
    g.add_argument("--warmup", dest="warmup_steps", type=nonnegative_int, metavar="N",
                   help=f"warmup steps (default {d['warmup_steps']}, at most a tenth of a "
                   "budgeted run)")
    g.add_argument("--eval-every", type=positive_int, metavar="N",
                   help=f"evaluate every N steps (default {d['eval_every']})")
    g.add_argument("--n-test", type=positive_int, metavar="N",
                   help="held-out prompts of the built-in task's evaluation (default "
                   f"{BASE_DEFAULTS['n_test']}); one's own data holds out its last tenth or "
                   "--val-text/--val-data")
    g.add_argument("--seed", type=nonnegative_int, help="seed of everything random (default 0)")
    p.set_defaults(adapter_defaults=dict(d, n_test=BASE_DEFAULTS["n_test"], seed=0))


# The options of the built-in tasks, refused with one's own data; per command.
TASK_FLAGS = {"lora": ("base_task", "base_steps", "max_prompt_len", "n_test", "task"),
              "dpo": ("base_task", "base_steps", "max_prompt_len", "n_test", "prefer", "pairs",
                      "n_prompts", "samples")}


BASE_FLAGS = ("base_task", "base_steps", "max_prompt_len")


def _flag(name):
    return "--" + {"warmup_steps": "warmup"}.get(name, name).replace("_", "-")


def check_flags(args, where):
    """Refuse, before any work, a flag that does not apply to the data or mode chosen:
    the built-in tasks' options with one's own data (--text, --data), the base model's
    with --checkpoint, the adapters' with --full, --samples with --pairs synthetic,
    --minutes with --steps. Then fill in the defaults of the flags not given."""
    own = getattr(args, "text", None) or getattr(args, "data", None)
    given = lambda names: [n for n in names if getattr(args, n, None) is not None]  # noqa: E731
    if args.minutes is not None and args.steps is not None:
        raise UsageError("--minutes and --steps both set the length of the run; give one")
    if own:
        data = "--text" if getattr(args, "text", None) else "--data"
        bad = given(TASK_FLAGS[where])
        if bad:
            raise UsageError(f"{_flag(bad[0])} applies to the built-in tasks; with {data} (one's "
                             f"own data) it does nothing: drop {_flag(bad[0])}")
    elif args.checkpoint:
        bad = given(BASE_FLAGS)
        if bad:
            raise UsageError(f"{_flag(bad[0])} applies to the base model trained here; with "
                             f"--checkpoint the base model is loaded: drop {_flag(bad[0])}")
    if getattr(args, "full", False):
        bad = given(("rank", "alpha", "targets"))
        if bad:
            raise UsageError(f"{_flag(bad[0])} sets the LoRA adapters; --full trains every "
                             f"weight without adapters: drop {_flag(bad[0])} or --full")
    if getattr(args, "pairs", None) == "synthetic" and args.samples is not None:
        raise UsageError("--samples applies to --pairs generated (pairs from the base model's "
                         "samples); --pairs synthetic writes the pairs out")
    for name, value in {**args.base_defaults, **args.adapter_defaults,
                        **getattr(args, "task_defaults", {})}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.minutes is not None:
        args.steps = None                  # planned from the budget


def add_adapter_run_options(p, out):
    """--out (the merged model, the adapters, a base model trained here) and the rest
    of the run group, for ``lora`` and ``dpo``."""
    add_run_options(p, out, "where to save the merged model, adapters.npz and a base model "
                    f"trained here (in DIR/base) (default {out}); 'none' saves nothing")


def parse_targets(text):
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    from numpytfmr.posttrain import LORA_TARGETS
    bad = [t for t in targets if t not in LORA_TARGETS]
    if not targets or bad:
        raise UsageError(f"--targets is {text!r}; expected comma-separated names among "
                         f"{', '.join(LORA_TARGETS)}")
    return targets


# one's own data of ``lora`` and ``dpo`` (on a model of text, run by ``run/tune_text.py``)

TEXT_DATA_FLAGS = ("text", "val_text", "data", "val_data")


def add_data_options(p, command):
    g = p.add_argument_group("one's own data (with --checkpoint of a model of text)")
    if command == "lora":
        g.add_argument("--text", type=text_file, metavar="FILE",
                       help="continue language modelling on this UTF-8 text")
        g.add_argument("--val-text", type=text_file, metavar="FILE",
                       help="held-out text (default: the last tenth of --text)")
        rows = "{\"prompt\": ..., \"completion\": ...} rows (TRL's prompt-completion format; " \
               "the loss is on the completion tokens only)"
    else:
        rows = "{\"prompt\": ..., \"chosen\": ..., \"rejected\": ...} rows (TRL's preference " \
               "format)"
        g.add_argument("--full", action="store_true",
                       help="train every weight instead of LoRA adapters (the reference stays "
                       "the frozen start model)")
    g.add_argument("--data", type=text_file, metavar="FILE.jsonl", help=f"JSON lines: {rows}")
    g.add_argument("--val-data", type=text_file, metavar="FILE.jsonl",
                   help="held-out rows (default: the last tenth of --data)")


def given_flags(args, names):
    """The flags among ``names`` given a value, spelled ``--val-text``."""
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None)]


def check_data_flags(args, where):
    """Combinations refused before any work: own data without --checkpoint, two kinds of
    data, a held-out file without its training file."""
    data = given_flags(args, TEXT_DATA_FLAGS)
    if getattr(args, "full", False) and not getattr(args, "data", None):
        raise UsageError("--full trains every weight on --data FILE.jsonl (preference rows of a "
                         "model of text); pass --data, or drop --full")
    if not data:
        return
    if not args.checkpoint:
        raise UsageError(f"{data[0]}: tuning on one's own data needs the model: pass --checkpoint "
                         "RUN (a run of numpytfmr pretrain)")
    if getattr(args, "text", None) and args.data:
        raise UsageError("--text and --data are two kinds of data; give one (--text FILE: "
                         "continued language modelling, --data FILE.jsonl: prompt-completion rows)")
    for held, main_flag in (("val_text", "text"), ("val_data", "data")):
        if getattr(args, held, None) and not getattr(args, main_flag, None):
            raise UsageError(f"--{held.replace('_', '-')} goes with --{main_flag} FILE (the "
                             "training data)")


def check_base_kind(args, base, where):
    """True when the base is a model of text (then --text or --data is needed); a task
    model with one's own data, or a model of text without, is refused."""
    record = base.get("record") or {}
    is_text = record.get("task") == "text"
    data = given_flags(args, TEXT_DATA_FLAGS)
    if is_text and not data:
        need = "--text FILE or --data FILE.jsonl" if where == "lora" else "--data FILE.jsonl"
        raise UsageError(f"--checkpoint {args.checkpoint} holds a model of text (numpytfmr "
                         f"pretrain); pass {need} with your own data (the built-in tasks apply "
                         "to task models of numpytfmr train)")
    if is_text and getattr(args, "task", None):
        raise UsageError(f"--task applies to task models; --checkpoint {args.checkpoint} holds a "
                         "model of text: drop --task")
    if not is_text and data:
        raise UsageError(f"{data[0]}: --checkpoint {args.checkpoint} holds a task model "
                         f"({base['task']!r}), not a model of text; pass a run of numpytfmr "
                         f"pretrain, or drop {data[0]} to tune on the built-in tasks")
    return is_text
