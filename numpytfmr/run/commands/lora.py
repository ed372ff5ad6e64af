"""``numpytfmr lora``: adapt a trained GPT to a related task by training LoRA adapters only
(000 §2.7), then merge them for inference.

    numpytfmr lora                                   # sort -> sort_desc, base included (~1 min)
    numpytfmr lora --checkpoint runs/gpt             # adapt a model of 'numpytfmr train'
    numpytfmr lora --base-task reverse               # reverse -> rotate
    numpytfmr lora --rank 8 --targets Wq,Wv --steps 800

Without ``--checkpoint`` the command first trains its own small base model (2 layers,
d_model 64, prompts of 1-6 digits) on ``--base-task``. The base weights stay frozen (the
summary records that they are bitwise unchanged); only the adapters ``A``, ``B`` of the
chosen projections are trained, on the target task (default: the related task of the
base's: sort <-> sort_desc, reverse <-> rotate). The adapted model is scored by greedy
exact match on held-out prompts of the target task, and merged (``W' = W + s A B``) into a
plain GPT checkpoint that ``numpytfmr generate --checkpoint DIR`` runs.

Defaults: rank 4, alpha 8, all four attention projections (3.9 % of the parameters),
1200 AdamW steps at lr 1e-2: 99-100 % exact match on sort -> sort_desc. Queries and
values alone (``--targets Wq,Wv``, 2 %) reach about 95 % in 800 steps; reverse -> rotate
is harder for a low-rank update (about 75 % with the defaults, 85 % adding the FFN).

Training and evaluation run on the fast path (``numpytfmr.fast.posttrain``: the same
numbers as ``numpytfmr.posttrain``).
"""
import functools
import time

from numpytfmr.run.cli import (UsageError, checkpoint_path, nonnegative_int, positive_float,
                               positive_int)
from numpytfmr.run.commands import posttext
from numpytfmr.run.commands.adapters import (adapter_settings, budget_note, snapshot, timed,
                                             train_adapters, unchanged)
from numpytfmr.run.commands.train import add_run_options as add_out_options
from numpytfmr.run.commands.train import check_out, finish, logger, out_dir

RELATED_TASKS = {"sort": "sort_desc", "sort_desc": "sort", "reverse": "rotate",
                 "rotate": "reverse", "sort_either": "sort"}
BASE_DEFAULTS = {"steps": 1000, "min_len": 1, "max_len": 6, "n_test": 300}
LORA_DEFAULTS = {"rank": 4, "alpha": 8.0, "targets": "Wq,Wk,Wv,Wo", "steps": 1200, "lr": 1e-2,
                 "batch_size": 64, "warmup_steps": 20, "clip_norm": 1.0, "eval_every": 300}


# ---------------------------------------------------------------------------------------
# Shared with ``numpytfmr dpo``
# ---------------------------------------------------------------------------------------

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
    g.add_argument("--minutes", type=positive_float, metavar="M",
                   help="wall-clock budget of the whole command: the steps are planned from "
                   "the measured speed and re-planned as the run goes, so that it ends near M "
                   "minutes (instead of --steps)")
    g.add_argument("--steps", type=positive_int, metavar="N",
                   help=f"AdamW updates of the adapters (default {d['steps']})")
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


def add_run_options(p, out):
    add_out_options(p, out, "where to save the merged model, adapters.npz and a base model "
                    f"trained here (in DIR/base) (default {out}); 'none' saves nothing")


def parse_targets(text):
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    from numpytfmr.posttrain import LORA_TARGETS
    bad = [t for t in targets if t not in LORA_TARGETS]
    if not targets or bad:
        raise UsageError(f"--targets is {text!r}; expected comma-separated names among "
                         f"{', '.join(LORA_TARGETS)}")
    return targets


def base_model(args, *, where):
    """The base GPT: loaded from --checkpoint, or trained here on --base-task.

    Returns a dict: "params", "config", "tokenizer", "task", "min_len", "max_len",
    "checkpoint" (path or None), "seconds" (training time, 0 when loaded), "exact_match"
    (the base's held-out exact match on its own task when trained here, else None).
    """
    from numpytfmr.run.checkpoint import checkpoint_file, load_model
    from numpytfmr.run.loop import TrainSettings
    from numpytfmr.run.models import default_gpt_config
    from numpytfmr.run.tasks import train_gpt
    if args.checkpoint:
        try:
            ck = load_model(args.checkpoint, kind="gpt")
        except ValueError as exc:
            raise UsageError(f"--checkpoint: {exc}") from None
        task = ck.get("task") if isinstance(ck.get("task"), dict) else {}
        return {"params": ck["params"], "config": ck["model_config"], "tokenizer": ck["tokenizer"],
                "task": task.get("task"), "min_len": task.get("min_prompt_len", 1),
                "max_len": task.get("max_prompt_len", args.max_prompt_len),
                "checkpoint": ck["path"], "seconds": 0.0, "exact_match": None, "record": task}
    from numpytfmr.run.data import TASKS, CharTokenizer
    if args.base_task not in TASKS or args.base_task == "dyck":
        raise UsageError(f"--base-task is {args.base_task!r}; expected one of "
                         f"{', '.join(t for t in TASKS if t != 'dyck')}")
    out = out_dir(args)
    base_out = None if out is None else f"{out}/base"
    steps = args.base_steps
    settings = TrainSettings(steps=steps, warmup_steps=min(100, steps // 10), seed=args.seed,
                             eval_every=steps)
    config = default_gpt_config(CharTokenizer().vocab_size, args.max_prompt_len)
    params, summary = train_gpt(config=config, settings=settings, task=args.base_task,
                                min_len=BASE_DEFAULTS["min_len"], max_len=args.max_prompt_len,
                                n_test=args.n_test, out=base_out, progress=not args.quiet,
                                log=logger(args))
    return {"params": params, "config": config, "tokenizer": CharTokenizer(),
            "task": args.base_task, "min_len": BASE_DEFAULTS["min_len"],
            "max_len": args.max_prompt_len,
            "checkpoint": None if base_out is None else checkpoint_file(base_out),
            "seconds": summary["seconds"], "exact_match": summary["exact_match"]}


def save_adapted(out, base, merged, adapters, meta):
    """The merged model as a GPT checkpoint (``numpytfmr generate`` runs it) plus the
    adapters alone in ``adapters.npz``; returns the checkpoint.json path."""
    import os

    from numpytfmr.shared import fileio
    from numpytfmr.run.checkpoint import save_checkpoint
    path = save_checkpoint(out, kind="gpt", config=base["config"].to_dict(), params=merged,
                           meta={"tokenizer": base["tokenizer"].to_dict(), **meta})
    fileio.save_arrays(os.path.join(out, "adapters.npz"), adapters)
    return path


def start_adapter_run(args, where):
    """The start shared by ``lora`` and ``dpo``: check what the argument types cannot see
    before any work (the targets, an --out that would replace a previous run without
    --force, one's own data without a model to tune), and load or train the base model
    (the BLAS threads are set by ``adapter_command``). Returns (targets, start time, base)."""
    start = time.perf_counter()
    posttext.check_data_flags(args, where)
    check_flags(args, where)
    targets = parse_targets(args.targets)
    check_out(args, where)
    return targets, start, base_model(args, where=where)


# ---------------------------------------------------------------------------------------
# numpytfmr lora
# ---------------------------------------------------------------------------------------

def adapter_command(run):
    """The command ``run(args)`` with ``--threads`` BLAS threads (``blas_threads``), as
    they were afterwards."""
    @functools.wraps(run)
    def command(args):
        from numpytfmr.run.blas import blas_threads
        with blas_threads(args.threads):
            return run(args)
    return command


@adapter_command
def cmd_lora(args):
    import numpy as np

    from numpytfmr.run.data import make_task
    from numpytfmr.fast.posttrain import gpt_lora_loss
    from numpytfmr.posttrain import add_lora, lora_parameter_counts, merge_lora, unmerge_lora
    from numpytfmr.run.checkpoint import load_model
    from numpytfmr.run.loop import STREAM_INIT, STREAM_TEST, step_rng
    from numpytfmr.run.tasks import IGNORE, evaluate_gpt, gpt_task_data, task_record

    where = "lora"
    targets, start, base = start_adapter_run(args, where)
    if posttext.check_base_kind(args, base, where):
        return posttext.lora_text(args, targets, start, base)
    params, config, tok = base["params"], base["config"], base["tokenizer"]
    task = args.task or RELATED_TASKS.get(base["task"])
    if task is None:
        raise UsageError(f"--task: the base model's task is {base['task']!r}, which has no "
                         "related task; name the target with --task")
    min_len, max_len = base["min_len"], base["max_len"]
    # the same held-out prompts for both tasks (the split is a function of the prompt)
    test = make_task(task, args.n_test, rng=np.random.default_rng((args.seed, STREAM_TEST)),
                     split="test", min_len=min_len, max_len=max_len, unique=True, tokenizer=tok)
    base_test = None
    if base["task"] in RELATED_TASKS and base["task"] != "sort_either":
        base_test = make_task(base["task"], args.n_test,
                              rng=np.random.default_rng((args.seed, STREAM_TEST)), split="test",
                              min_len=min_len, max_len=max_len, unique=True, tokenizer=tok)
    before = snapshot(params)
    first, eval_seconds = timed(evaluate_gpt, params, config, test)
    target_before = first["exact_match"]
    base_task_before = None
    if base_test is not None:
        base_task_before = evaluate_gpt(params, config, base_test)["exact_match"]

    adapters = add_lora(params, config, r=args.rank, targets=targets,
                        rng=step_rng(args.seed, 0, STREAM_INIT))
    counts = lora_parameter_counts(params, adapters)
    settings = adapter_settings(args)
    alpha = args.alpha

    def loss_and_grads(a, step):
        inputs, labels = gpt_task_data(task, step, seed=settings.seed + 1,
                                       batch_size=settings.batch_size, min_len=min_len,
                                       max_len=max_len, tokenizer=tok)
        loss, grads = gpt_lora_loss(params, a, inputs, labels, config=config, alpha=alpha,
                                    ignore_index=IGNORE)
        return loss, grads, inputs.size

    def evaluate(a):
        return evaluate_gpt(merge_lora(params, a, alpha=alpha), config, test)

    adapters, history, lora_seconds, plan = train_adapters(
        adapters, loss_and_grads, settings, evaluate, args, f"lora {task}",
        # after the last step: the final evaluation, the saved model's, the base task's two
        budget=(start, eval_seconds, 2.0 + 2.0 * (base_test is not None)) if args.minutes
        else None)
    settings = plan.pop("settings")

    merged = merge_lora(params, adapters, alpha=alpha)
    exact = history["evals"][-1]["exact_match"]
    restored = unmerge_lora(merged, adapters, alpha=alpha)
    unmerge_error = max(float(np.max(np.abs(restored[k] - params[k]))) for k in params)
    out = out_dir(args)
    checkpoint = None
    if out is not None:
        checkpoint = save_adapted(out, base, merged, adapters, {
            "task": task_record(task, min_len, max_len, args.n_test),
            "lora": {"rank": args.rank, "alpha": alpha, "targets": list(targets),
                     "base_checkpoint": base["checkpoint"], "base_task": base["task"]}})
        merged = load_model(out, kind="gpt")["params"]     # score what was saved
    merged_exact = evaluate_gpt(merged, config, test)["exact_match"]
    base_task_after = adapted_base_task = None
    if base_test is not None:
        base_task_after = evaluate_gpt(params, config, base_test)["exact_match"]
        adapted_base_task = evaluate_gpt(merged, config, base_test)["exact_match"]
    seconds = time.perf_counter() - start
    summary = {
        "command": "lora", "task": task, "base_task": base["task"],
        "exact_match": exact, "merged_exact_match": merged_exact,
        "target_exact_match_before": target_before,
        "base_task_exact_match_before": base_task_before,
        "base_task_exact_match_after": base_task_after,
        "adapted_base_task_exact_match": adapted_base_task,
        "trainable_fraction": counts["fraction"], "lora_parameters": counts["lora"],
        "base_parameters": counts["base"], "adapted_matrix_parameters": counts["adapted"],
        "lora_rank": args.rank, "lora_alpha": alpha, "targets": list(targets),
        "steps": history["step"], "loss": float(np.mean(history["loss"][-50:])),
        "seconds": seconds, "base_seconds": base["seconds"], "lora_seconds": lora_seconds,
        "base_weights_unchanged": unchanged(params, before),
        "unmerge_max_abs_error": unmerge_error,
        "base_checkpoint": base["checkpoint"], "checkpoint": checkpoint,
        "settings": settings.to_dict(), **plan, "evals": history["evals"],
        "loss_history": history["loss"]}
    lines = [f"{base['task']} -> {task}: exact match {100 * exact:.1f}% on held-out prompts "
             f"(base model {100 * target_before:.1f}%), training {counts['lora']:,} of "
             f"{counts['base']:,} parameters ({100 * counts['fraction']:.2f}%), "
             f"{seconds:.0f} s in all{budget_note(args, plan)}"]
    if base_task_before is not None:
        lines.append(f"{base['task']}: the frozen base {100 * base_task_before:.1f}% before and "
                     f"{100 * base_task_after:.1f}% after; the adapted model "
                     f"{100 * adapted_base_task:.1f}%")
    if checkpoint is not None:
        lines.append(f"merged model: {checkpoint} (exact match {100 * merged_exact:.1f}%)")
    finish(args, summary, lines)
    return 0


def add_command(sub):
    from numpytfmr.run.data import TASKS
    p = sub.add_parser(
        "lora", help="LoRA: tune a model of text on your text (--text) or prompt/completion "
        "rows (--data), or adapt a task model to a related task",
        description="Freeze a trained GPT and train low-rank adapters W' = W + (alpha/r) A B on "
        "chosen projections, then save the merged model. On a model of text (--checkpoint of "
        "pretrain, lora or dpo): continued language modelling of --text FILE, or --data "
        "FILE.jsonl of {\"prompt\", \"completion\"} rows (TRL's prompt-completion format, "
        "the loss on the completions); held-out bits per byte before and after. Without "
        "them, on the built-in tasks: a task model (trained here, or --checkpoint of train) "
        "learns a related task (sort -> sort_desc); held-out exact match.")
    add_base_options(p, task="sort", steps=BASE_DEFAULTS["steps"])
    g = p.add_argument_group("target")
    g.add_argument("--task", choices=[t for t in TASKS if t not in ("sort_either", "dyck")],
                   default=None, help="target task (default: related to the base's task: "
                   "sort <-> sort_desc, reverse <-> rotate)")
    posttext.add_data_options(p, "lora")
    add_adapter_options(p, LORA_DEFAULTS)
    add_run_options(p, "runs/lora")
    p.set_defaults(func=cmd_lora)
