"""What ``numpytfmr lora`` and ``numpytfmr dpo`` share, on task models and on models of
text alike: the optimisation settings of the adapters, their training loop with a progress
bar and an optional wall-clock budget (``--minutes``), and the check that the frozen
weights stayed frozen."""
import time

from numpytfmr.run.commands.train import logger

__all__ = ["adapter_settings", "train_adapters", "snapshot", "unchanged", "timed", "budget_note"]


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
    """``train_loop`` over the adapters only, with a progress bar unless ``--quiet``;
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
    from numpytfmr.run.loop import BudgetUsed, budget_replanner, train_loop
    from numpytfmr.run.plot import plot_available
    from numpytfmr.run.progress import Progress

    plan = {"minutes": None, "planned_steps": None, "stopped_by_budget": False}
    replan, step = None, loss_and_grads
    if budget is not None:
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
        adapters, _, history, settings = train_loop(
            adapters, step, settings, evaluate=evaluate, history=history, progress=bar,
            log=logger(args), replan=replan or (lambda h, s: None),
            save=keep if budget is not None else None)
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
