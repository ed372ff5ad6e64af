"""What ``numpytfmr lora`` and ``numpytfmr dpo`` share, on task models and on models of
text alike: the optimisation settings of the adapters, their training loop with a progress
bar and an optional wall-clock budget (``--minutes``), and the check that the frozen
weights stayed frozen."""
import functools
import time

from numpytfmr.run.cli import UsageError, from_flag
from numpytfmr.run.options import (BASE_DEFAULTS, check_base_kind, check_data_flags, check_flags,
                                   parse_targets)
from numpytfmr.run.outputs import check_out, logger, out_dir

__all__ = ["adapter_settings", "train_adapters", "snapshot", "unchanged", "timed", "budget_note",
           "base_model", "save_adapted", "start_adapter_run", "adapter_command"]


def adapter_settings(args):
    """The TrainSettings of the flags; with --minutes the number of steps is a placeholder
    until :func:`train_adapters` plans it."""
    from numpytfmr.run.loop import TrainSettings
    steps = args.steps if args.steps is not None else args.adapter_defaults["steps"]
    return TrainSettings(steps=steps, batch_size=args.batch_size, lr=args.lr,
                         warmup_steps=min(args.warmup_steps, steps - 1), weight_decay=0.0,
                         clip_norm=1.0, seed=args.seed, eval_every=args.eval_every)


def timed(f, *a, **k):
    """``(f(*a, **k), seconds it took)``: the evaluation before training, whose time plans
    a budgeted run."""
    t0 = time.perf_counter()
    out = f(*a, **k)
    return out, time.perf_counter() - t0


# What comes after the last step of a budgeted run, in evaluations (the final evaluation,
# and what each command does after it): see the call sites' ``budget=``.
PLOT_SECONDS = 1.5          # drawing curves.png (matplotlib) at the end


def _plan(args, adapters, loss_and_grads, settings, deadline, finish, eval_seconds):
    """Two steps on scratch copies (the first warms up, the second is timed) give the
    seconds per step; ``loop.plan_steps`` fits the run in what is left before ``deadline``
    less ``finish`` seconds."""
    from numpytfmr.run.cli import UsageError
    from numpytfmr.run.loop import plan_steps, step_seconds
    seconds = step_seconds(adapters, loss_and_grads, settings.lr)
    left = deadline - time.perf_counter() - finish
    if left <= 2 * seconds:
        spent = time.perf_counter() - (deadline - 60.0 * args.minutes)
        base = "" if args.checkpoint else ", the base model"
        raise UsageError(f"--minutes {args.minutes:g}: the budget was used before the "
                         f"training began ({spent:.0f} s went to loading, the data{base} and "
                         "the evaluation before training, and the final evaluation needs "
                         f"about {finish:.0f} s); give more minutes")
    return plan_steps(settings, seconds, eval_seconds, left)


def train_adapters(adapters, loss_and_grads, settings, evaluate, args, desc, history=None,
                   budget=None):
    """``run_loop`` (the fast path) over the adapters only, with a progress bar unless ``--quiet``;
    ``history``: the training state to start from (e.g. holding the step-0 evaluation).

    budget: None, or ``(start, eval_seconds, finish)`` for ``--minutes``: the command began
    at ``start`` (``time.perf_counter``), an evaluation takes ``eval_seconds``, and what the
    command does after the last step (the final evaluation included) takes about
    ``finish`` evaluations. The steps
    are planned to end the command near ``start + 60 * minutes`` and re-planned as the run
    goes (``loop.budget_replanner``, as ``pretrain``); training stops when only the finish
    is left before the deadline, whatever the plan said, and the run then ends with its
    final evaluation.

    Returns ``(adapters, history, seconds, plan)``: ``plan`` holds the settings the run
    ended with, and for a budget ``minutes``, ``planned_steps`` (the first plan) and
    ``stopped_by_budget``.
    """
    from numpytfmr.run.loop import BudgetUsed, budget_replanner, run_loop
    from numpytfmr.run.plot import plot_available
    from numpytfmr.run.progress import Progress

    plan = {"minutes": None, "planned_steps": None, "stopped_by_budget": False}
    if budget is None:
        replan, step = None, loss_and_grads
    else:
        start, eval_seconds, finish_evals = budget
        deadline = start + 60.0 * args.minutes
        finish = finish_evals * eval_seconds
        if plot_available() and (args.plot or args.out not in (None, "none")):
            finish += PLOT_SECONDS
        settings = _plan(args, adapters, loss_and_grads, settings, deadline, finish,
                         eval_seconds)
        plan.update(minutes=args.minutes, planned_steps=settings.steps)
        replanner = budget_replanner(deadline, finish, (history or {}).get("step", 0),
                                     eval_seconds=eval_seconds)

        def replan(h, s):                    # the plan as it stands, for a stop by the budget
            new = replanner(h, s)
            if new is not None:
                plan["settings"] = new
            return new

        def step(a, i):            # stopped by the budget, the command still ends in time
            if time.perf_counter() > deadline - finish:
                raise BudgetUsed
            return loss_and_grads(a, i)
    last = {}

    def keep(a, state, hist):                 # the live state, for a stop by the budget
        last.update(adapters=a, history=hist)

    bar = Progress(settings.steps, desc) if not args.quiet else None
    t0 = time.perf_counter()
    try:
        adapters, _, history, settings = run_loop(
            adapters, step, settings, evaluate=evaluate, history=history, progress=bar,
            log=logger(args), replan=replan, save=keep if budget is not None else None,
            fast=True)
    except BudgetUsed:
        plan["stopped_by_budget"] = True
        settings = plan.get("settings", settings)
        if last:
            adapters, history = last["adapters"], last["history"]
        else:
            history = history or {"step": 0, "seconds": 0.0, "tokens": 0, "loss": [],
                                  "evals": []}
    finally:
        if bar is not None:
            bar.close()
    if plan["stopped_by_budget"]:
        if not history["evals"] or history["evals"][-1]["step"] != history["step"]:
            history["evals"].append({"step": history["step"], **evaluate(adapters)})
        log = logger(args)
        if log is not None:
            log(f"the budget of {args.minutes:g} minutes is used: stopped at step "
                f"{history['step']} of {settings.steps}")
    plan["settings"] = settings
    return adapters, history, time.perf_counter() - t0, plan


def budget_note(args, plan):
    """`` of a 2-minute budget`` (and whether it stopped the run) for the result line."""
    if not args.minutes:
        return ""
    stopped = "; stopped by the time budget" if plan.get("stopped_by_budget") else ""
    return f" of a {args.minutes:g}-minute budget{stopped}"


def snapshot(params):
    """Copies of the base arrays, to show afterwards that training left them untouched."""
    return {k: p.copy() for k, p in params.items()}


def unchanged(params, before):
    import numpy as np
    return all(np.array_equal(params[k], before[k]) and params[k].dtype == before[k].dtype
               for k in before) and set(params) == set(before)


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
        ck = from_flag("--checkpoint", load_model, args.checkpoint, kind="gpt")
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


def save_adapted(args, base, merged, adapters, targets, task, **extra):
    """Into --out: the merged model as a GPT checkpoint (``numpytfmr generate`` runs it),
    recording the ``task``, the adapters (``"lora"``: rank, alpha, targets, the base) and
    ``extra``, plus the adapters alone in ``adapters.npz``. Returns the checkpoint.json
    path, or None for ``--out none``."""
    import os

    from numpytfmr.shared import fileio
    from numpytfmr.run.checkpoint import save_checkpoint
    out = out_dir(args)
    if out is None:
        return None
    lora = {"rank": args.rank, "alpha": args.alpha, "targets": list(targets),
            "base_checkpoint": base["checkpoint"], "base_task": base["task"]}
    path = save_checkpoint(out, kind="gpt", config=base["config"].to_dict(), params=merged,
                           meta={"tokenizer": base["tokenizer"].to_dict(), "task": task,
                                 "lora": lora, **extra})
    fileio.save_arrays(os.path.join(out, "adapters.npz"), adapters)
    return path


def start_adapter_run(args, where):
    """The start shared by ``lora`` and ``dpo``: check what the argument types cannot see
    before any work (the targets, an --out that would replace a previous run without
    --force, one's own data without a model to tune), and load or train the base model
    (the BLAS threads are set by ``adapter_command``). Returns (targets, start time, base)."""
    start = time.perf_counter()
    check_data_flags(args, where)
    check_flags(args, where)
    targets = parse_targets(args.targets)
    check_out(args, where)
    return targets, start, base_model(args, where=where)


def adapter_command(where, text_run):
    """The command ``where`` (lora, dpo) of ``run(args, targets, start, base)`` with
    ``--threads`` BLAS threads (``blas_threads``), as they were afterwards: after the
    shared start (:func:`start_adapter_run`), a model of text goes to
    ``text_run(args, targets, start, base)`` (``run/tune_text.py``), a task model to ``run``."""
    def wrap(run):
        @functools.wraps(run)
        def command(args):
            from numpytfmr.run.blas import blas_threads
            with blas_threads(args.threads):
                targets, start, base = start_adapter_run(args, where)
                if check_base_kind(args, base, where):
                    return text_run(args, targets, start, base)
                return run(args, targets, start, base)
        return command
    return wrap
