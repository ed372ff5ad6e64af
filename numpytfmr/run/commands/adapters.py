"""What ``numpytfmr lora`` and ``numpytfmr dpo`` share, on task models and on models of
text alike: the optimisation settings of the adapters, their training loop with a progress
bar, and the check that the frozen weights stayed frozen."""
import time

from numpytfmr.run.commands.train import logger

__all__ = ["adapter_settings", "train_adapters", "snapshot", "unchanged"]


def adapter_settings(args):
    from numpytfmr.run.loop import TrainSettings
    return TrainSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                         warmup_steps=min(args.warmup_steps, args.steps - 1), weight_decay=0.0,
                         clip_norm=1.0, seed=args.seed, eval_every=args.eval_every)


def train_adapters(adapters, loss_and_grads, settings, evaluate, args, desc, history=None):
    """``train_loop`` over the adapters only, with a progress bar unless ``--quiet``;
    ``history``: the training state to start from (e.g. holding the step-0 evaluation).

    Returns ``(adapters, history, seconds)``.
    """
    from numpytfmr.run.loop import train_loop
    from numpytfmr.run.progress import Progress

    bar = Progress(settings.steps, desc) if not args.quiet else None
    t0 = time.perf_counter()
    try:
        adapters, _, history = train_loop(adapters, loss_and_grads, settings, evaluate=evaluate,
                                          history=history, progress=bar, log=logger(args))
    finally:
        if bar is not None:
            bar.close()
    return adapters, history, time.perf_counter() - t0


def snapshot(params):
    """Copies of the base arrays, to show afterwards that training left them untouched."""
    return {k: p.copy() for k, p in params.items()}


def unchanged(params, before):
    import numpy as np
    return all(np.array_equal(params[k], before[k]) and params[k].dtype == before[k].dtype
               for k in before) and set(params) == set(before)
