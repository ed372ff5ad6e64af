"""The training loop: what every training command runs, as one flat loop.

:func:`train_loop` is the recipe of the notes (003 §2.1.2: minimise the mean next-token
cross-entropy) with the usual transformer optimiser, in the shape of nanoGPT's
``train.py``::

    while True:
        if step % eval_every == 0 or step == steps:   evaluate, log, save
        if step == steps:                             stop
        loss, g = loss_and_grads(params, step)        the batch of step_rng(seed, step),
                                                      forward, cross-entropy, backward
        g, N   = clip_grad_norm(g, clip_norm)         global L2 norm at most clip_norm
        lr     = lr_schedule(step, ...)               linear warmup, cosine decay
        params, opt_state = adamw_step(params, g, opt_state, lr=lr, ...)
        step  += 1

Because a batch depends only on ``(seed, step)`` (:func:`step_rng`) and the whole training
state (weights, AdamW moments, step, loss history) is saved (``checkpoint.py``), a run
stopped after ``k`` steps and resumed continues exactly -- bit for bit -- as if it had
never stopped.

The update is chosen explicitly: ``fast=True`` (what the commands run) clips and steps
with ``numpytfmr.fast.clip_grad_norm_`` and ``numpytfmr.fast.adamw_step_``, the
reference's numbers computed in place on the loop's own copies of the weights and moments
(made once at the start: nothing passed in is modified, and a step allocates nothing);
``fast=False`` runs ``optim.clip_grad_norm`` and ``optim.adamw_step``, the functions of
the notes (tests/test_training.py checks that both give the same weights).

What a command adds wraps around the loop (:func:`run_loop`): a progress bar, and the
re-planning of a ``--minutes`` budget (:func:`budget_replanner`), which ends the loop
through its ``should_stop`` and starts it again from where it stopped with the new
number of steps.
"""
from dataclasses import asdict, dataclass, fields
import json
import math
import time

import numpy as np

from ..fast import adamw_step_, clip_grad_norm_
from ..optim import adamw_init, adamw_step, clip_grad_norm, decay_exempt_keys, lr_schedule

__all__ = ["TrainSettings", "step_rng", "train_loop", "run_loop", "BudgetUsed", "plan_steps",
           "budget_replanner", "with_steps", "step_seconds", "STREAM_INIT", "STREAM_DATA", "STREAM_DROPOUT",
           "STREAM_TEST", "REPLAN_SECONDS", "EVALS_PLANNED", "FINISH_EVALS"]

# Independent random streams of a run, all derived from its seed.
STREAM_INIT, STREAM_DATA, STREAM_DROPOUT, STREAM_TEST = 0, 1, 2, 3


@dataclass(frozen=True)
class TrainSettings:
    """The optimisation settings of a run (saved in its checkpoint).

    steps:        total number of AdamW updates of the run
    batch_size:   examples per update
    lr:           peak learning rate, reached after ``warmup_steps`` (``lr_schedule``)
    min_lr:       learning rate at the end of the cosine decay
    weight_decay: AdamW's decoupled decay, on matrices and tables only (``decay_exempt_keys``)
    clip_norm:    the global gradient norm is clipped to this (``clip_grad_norm``)
    seed:         initial weights and the data of every step derive from it
    eval_every:   evaluate (and save a checkpoint) every this many steps, and at the end
    """
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr: float = 0.0
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    seed: int = 0
    eval_every: int = 250

    def __post_init__(self):
        where = "TrainSettings"
        for name in ("steps", "batch_size", "eval_every"):
            _positive_int(getattr(self, name), name, where)
        for name in ("warmup_steps", "seed"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{where}: {name} is {v!r}; expected an integer >= 0")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"{where}: warmup_steps is {self.warmup_steps} but steps is "
                             f"{self.steps}; expected fewer warmup steps than steps")
        for name, low_open in (("lr", True), ("min_lr", False), ("weight_decay", False),
                               ("clip_norm", True)):
            v = getattr(self, name)
            ok = isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and \
                math.isfinite(v) and (v > 0 if low_open else v >= 0)
            if not ok:
                raise ValueError(f"{where}: {name} is {v!r}; expected a finite number "
                                 f"{'> 0' if low_open else '>= 0'}")
        if self.min_lr > self.lr:
            raise ValueError(f"{where}: min_lr is {self.min_lr} but lr is {self.lr}; expected "
                             "min_lr <= lr")

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or set(d) - names:
            raise ValueError(f"TrainSettings.from_dict: got {d!r}; expected a dict with keys among "
                             f"{sorted(names)}")
        return cls(**d)


def _positive_int(v, name, where):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{where}: {name} is {v!r}; expected an integer >= 1")
    return int(v)


def step_rng(seed, step, stream=STREAM_DATA):
    """The random generator of one step: a fixed function of ``(seed, stream, step)``.

    Data drawn with it at step ``s`` is the same whether the run got there in one go or
    was stopped and resumed, which makes resuming exact.
    """
    return np.random.default_rng((int(seed), int(stream), int(step)))


def _new_history():
    return {"step": 0, "seconds": 0.0, "tokens": 0, "loss": [], "evals": []}


def train_loop(params, loss_and_grads, settings, *, opt_state=None, history=None, evaluate=None,
               save=None, log=None, should_stop=None, fast=True):
    """Train from ``history["step"]`` up to ``settings.steps``: one flat loop (module docstring).

    params:         flat dict of float arrays (the trainable ones)
    loss_and_grads: ``f(params, step) -> (loss, grads, n_tokens)``, forward and backward on
                    the batch of ``step_rng(settings.seed, step)`` (the data of a step is fixed)
    settings:       :class:`TrainSettings`
    opt_state:      AdamW state to continue from (``None``: fresh, ``adamw_init``)
    history:        the training state to continue from (``None``: a new run): a dict
                    ``{"step", "seconds", "tokens", "loss": [per step], "evals": [...]}``
    evaluate:       optional ``f(params) -> dict`` of metrics, every ``settings.eval_every``
                    steps and at the last one, kept in ``history["evals"]`` with the step
    save:           optional ``f(params, opt_state, history)``: after each evaluation, and on
                    Ctrl-C (KeyboardInterrupt) before the interruption goes on
    log:            optional ``f(str)``: one line per evaluation
    should_stop:    optional ``f(history) -> bool`` after every step: True returns at once
                    (progress bars and wall-clock budgets look at the run here: :func:`run_loop`)
    fast:           True: clip and update in place with ``fast.clip_grad_norm_`` and
                    ``fast.adamw_step_`` (what the commands run); False: the reference's
                    ``optim.clip_grad_norm`` and ``optim.adamw_step``. The same numbers.
    Returns ``(params, opt_state, history)``; nothing passed in is modified.
    """
    params, opt_state, history = _own_copies(params, opt_state, history)
    # the update: in place (numpytfmr.fast), or the reference's functions (numpytfmr.optim)
    clip, adamw = (clip_grad_norm_, adamw_step_) if fast else (clip_grad_norm, adamw_step)
    no_decay, s = decay_exempt_keys(params), settings
    began, seconds_before = time.perf_counter(), history["seconds"]
    try:
        while True:
            step = history["step"]
            # every eval_every steps and at the end (once a step): evaluate, log, save
            evaluated = bool(history["evals"]) and history["evals"][-1]["step"] >= step
            if evaluate is not None and step > 0 and not evaluated and \
                    (step % s.eval_every == 0 or step == s.steps):
                metrics = dict(evaluate(params))
                history["evals"].append({"step": step, **metrics})
                if log is not None:
                    log(f"step {step}: " + "  ".join(f"{k} {v:.4g}" if isinstance(v, float)
                                                     else f"{k} {v}" for k, v in metrics.items()))
                history["seconds"] = seconds_before + time.perf_counter() - began
                if save is not None:
                    save(params, opt_state, history)
            if step >= s.steps:
                break
            loss, grads, n_tokens = loss_and_grads(params, step)       # forward, backward
            if not math.isfinite(loss):
                raise ValueError(f"train_loop: the loss is {loss} at step {step}; training "
                                 "diverged (try a smaller lr)")
            grads, _ = clip(grads, s.clip_norm)                           # ||g|| <= clip_norm
            lr = lr_schedule(step, base_lr=s.lr, warmup_steps=s.warmup_steps,
                             total_steps=s.steps, min_lr=s.min_lr)
            params, opt_state = adamw(params, grads, opt_state, lr=lr,
                                      weight_decay=s.weight_decay, no_decay=no_decay)
            history["loss"].append(float(loss))
            history["tokens"] += int(n_tokens)
            history["step"] = step + 1
            history["seconds"] = seconds_before + time.perf_counter() - began
            if should_stop is not None and should_stop(history):
                break
    except KeyboardInterrupt:                    # Ctrl-C (or a budget): keep what was done
        if save is not None and history["step"] > 0:
            history["seconds"] = seconds_before + time.perf_counter() - began
            save(params, opt_state, history)
        raise
    return params, opt_state, history


def _own_copies(params, opt_state, history):
    """The loop's own weights, AdamW state and history (the fast path updates them in place)."""
    history = _new_history() if history is None else json.loads(json.dumps(history))
    params = {k: np.array(v, copy=True) for k, v in params.items()}
    opt_state = (adamw_init(params) if opt_state is None else
                 {k: np.array(v, copy=True) for k, v in opt_state.items()})
    return params, opt_state, history


def run_loop(params, loss_and_grads, settings, *, progress=None, replan=None, **loop):
    """:func:`train_loop` with a progress bar and a wall-clock budget's re-planning around it.

    progress: optional ``numpytfmr.run.progress.Progress`` over the remaining steps: after
              every step the mean loss of the last 20 steps and the learning rate, after an
              evaluation its ``exact_match``
    replan:   optional ``f(history, settings) -> TrainSettings or None`` after every step
              (:func:`budget_replanner`): new settings end the loop there, and it goes on
              with them from the next step (the schedule then decays towards the new total)
    loop:     the other arguments of :func:`train_loop` (opt_state, history, evaluate, save,
              log, fast)
    Returns ``(params, opt_state, history, settings)``, ``settings`` those the run ended with.
    """
    opt_state, history, evaluate = (loop.pop(k, None) for k in ("opt_state", "history",
                                                                 "evaluate"))
    first = 0 if history is None else history["step"]
    plan = {"settings": settings, "tokens": 0 if history is None else history["tokens"]}
    if progress is not None and evaluate is not None:
        def evaluate(p, evaluate=evaluate):
            metrics = evaluate(p)
            if "exact_match" in metrics:
                progress.update(0, metrics={"exact": float(metrics["exact_match"])})
            return metrics

    def should_stop(h):
        s = plan["settings"]
        if progress is not None:
            lr = lr_schedule(h["step"] - 1, base_lr=s.lr, warmup_steps=s.warmup_steps,
                             total_steps=s.steps, min_lr=s.min_lr)
            progress.update(metrics={"loss": float(np.mean(h["loss"][-20:])), "lr": lr},
                            tokens=h["tokens"] - plan["tokens"])
            plan["tokens"] = h["tokens"]
        new = None if replan is None else replan(h, s)
        if new is None:
            return False
        plan["settings"] = new
        if progress is not None:
            progress.total = max(new.steps - first, 1)
        return True

    while True:
        params, opt_state, history = train_loop(
            params, loss_and_grads, plan["settings"], opt_state=opt_state, history=history,
            evaluate=evaluate, should_stop=should_stop, **loop)
        if history["step"] >= plan["settings"].steps:
            return params, opt_state, history, plan["settings"]


# ---------------------------------------------------------------------------------------
# A wall-clock budget (``--minutes`` of pretrain, lora and dpo)
# ---------------------------------------------------------------------------------------

REPLAN_SECONDS = 2.0      # how often a budgeted run measures its speed again
EVALS_PLANNED = 10        # at most this many points on the curve of a budgeted run
FINISH_EVALS = 2.0        # the final evaluation, the samples and the save, in evaluations


class BudgetUsed(KeyboardInterrupt):
    """Raised inside a step when the wall-clock budget is used. ``train_loop`` treats it
    as an interruption (it saves the state and re-raises), which is what a budget stop is;
    the command catches it and goes on to its final evaluation."""


def with_steps(settings, steps):
    """``settings`` with ``steps`` in all and the warmup at most a tenth of them."""
    values = dict(settings.to_dict(), steps=steps,
                  warmup_steps=min(settings.warmup_steps, max(steps // 10, 0)))
    if values["warmup_steps"] >= steps:
        values["warmup_steps"] = steps - 1
    return TrainSettings(**values)


def step_seconds(params, loss_and_grads, lr):
    """Seconds of one AdamW step of ``loss_and_grads`` (``f(params, step)``, as for
    :func:`train_loop`): two steps run on scratch copies of ``params``, the first to warm
    up, the second timed. What a budget is planned from."""
    from ..fast import adamw_step
    scratch = {k: np.array(v, copy=True) for k, v in params.items()}
    state = adamw_init(scratch)
    for i in range(2):
        t0 = time.perf_counter()
        _, grads, _ = loss_and_grads(scratch, i)
        scratch, state = adamw_step(scratch, grads, state, lr=lr)
        seconds = time.perf_counter() - t0
    return seconds


def plan_steps(settings, step_seconds, eval_seconds, left):
    """``settings`` with the number of steps that fits in ``left`` seconds (the budget
    less what the run still has to do after its last step), a step taking
    ``step_seconds`` and an evaluation ``eval_seconds``: evaluations every
    ``eval_every`` steps, but at most as many as a tenth of the budget pays for and at
    most EVALS_PLANNED (``eval_every`` is lowered so that the curve gets its points); the
    warmup stays at most a tenth of the steps. ``budget_replanner`` corrects the plan as
    the run goes."""
    affordable = max(1, min(EVALS_PLANNED, int(0.1 * left / max(eval_seconds, 1e-9))))
    rough = max(2, int(0.9 * left / step_seconds))          # steps, evaluations aside
    eval_every = min(settings.eval_every, max(1, rough // affordable))
    per_step = step_seconds + 1.1 * eval_seconds / eval_every
    steps = max(2, int(left / per_step))
    return with_steps(TrainSettings(**dict(settings.to_dict(), eval_every=eval_every)), steps)


def _steps_with_evaluations(step, first_step, every, elapsed, eval_seconds, room):
    """How many more steps fit in ``room`` seconds, the ``elapsed`` seconds since
    ``first_step`` having paid for the steps and for the evaluations after every
    ``every``-th step before this one (this step's is still to come), and each evaluation
    to come before the last step (whose own is in the finish) taking ``eval_seconds``."""
    made = (step - 1) // every - first_step // every
    done = step - first_step
    training = max(elapsed - made * eval_seconds, 0.1 * elapsed) / done     # per step
    more = int(room / training)
    while more > 0 and more * training + ((step + more - 1) // every - (step - 1) // every) \
            * eval_seconds > room:
        more -= 1
    return more


def budget_replanner(deadline, finish_seconds, first_step, clock=None, eval_seconds=None):
    """The ``replan`` of ``train_loop`` for a wall-clock budget: every REPLAN_SECONDS, the
    seconds per step measured so far in this run (evaluations and saves included) give how
    many more steps fit before ``deadline`` (a time of ``clock``, default
    ``time.perf_counter``), less ``finish_seconds`` (what comes after the last step: the
    final evaluation, the save...; None: FINISH_EVALS steps); the total is moved there
    (never below the step reached). Warmup steps already taken stay.

    With ``eval_seconds`` (the time of one evaluation), the evaluations already made are
    taken out of the measured time and those still to come (one every ``eval_every``
    steps) put back in, so that a long evaluation near the start of a short run does not
    count again for every step after it."""
    clock = clock or time.perf_counter
    t_start = clock()
    state = {"next": t_start + REPLAN_SECONDS}

    def replan(history, settings):
        now = clock()
        done = history["step"] - first_step
        if now < state["next"] or done < 2:
            return None
        state["next"] = now + REPLAN_SECONDS
        per_step = (now - t_start) / done
        final = finish_seconds if finish_seconds is not None else FINISH_EVALS * per_step
        more = int((deadline - now - final) / per_step)
        if eval_seconds is not None:
            more = _steps_with_evaluations(history["step"], first_step, settings.eval_every,
                                           now - t_start, eval_seconds, deadline - now - final)
        steps = max(history["step"] + 1, history["step"] + more)
        if steps == settings.steps:
            return None
        new = with_steps(settings, steps)
        if history["step"] < settings.warmup_steps:
            return new
        # past the warmup: keep it as it was (the schedule's first part is history)
        return TrainSettings(**dict(new.to_dict(), warmup_steps=min(settings.warmup_steps,
                                                                    steps - 1)))
    return replan
