"""What the commands share about their output: no file or folder written over without
``--force`` (:func:`refuse_overwrite`), the run folder of the commands that train
(``--out``, refused when it holds work, unless ``--force`` or ``--resume``), the
evaluation lines on stderr, the hint to resume after Ctrl-C, and the end of a run (its
curves, its result lines and ``--summary``). The files themselves are written atomically
by ``numpytfmr/shared/fileio.py``; the flags are declared in ``run/options.py``.
"""
from contextlib import contextmanager
import os
import sys

from numpytfmr.run.cli import UsageError, from_flag


def out_dir(args):
    return None if args.out in (None, "", "none") else args.out


def refuse_overwrite(flag, path, force, *, folder=False, instead=", or name another file"):
    """Refuse, unless ``force`` (``--force``), to write over what ``flag`` names: a file
    that exists, or with ``folder`` a folder that holds files. ``instead``: the way out
    the message offers after "pass --force to replace it"."""
    if force:
        return
    if folder and os.path.isdir(path) and os.listdir(path):
        what = "already holds files"
    elif not folder and os.path.exists(path):
        what = "already exists"
    else:
        return
    raise UsageError(f"{flag} {path} {what}; pass --force to replace it{instead}")


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
        refuse_overwrite("--plot", args.plot, args.force)
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
        from_flag("--resume", load_checkpoint, out)
        return out
    if os.path.isdir(out) and os.listdir(out) and not args.force:
        what = ("a checkpoint" if os.path.exists(os.path.join(out, "checkpoint.json"))
                else "files")
        options = "--resume to continue that run, " if hasattr(args, "resume") else ""
        raise UsageError(f"--out {out} already holds {what}; pass {options}--force to replace "
                         "it, or choose another --out")
    return out


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


def task_lines(name, summary, held_out):
    """The result of ``train`` and ``train-seq2seq``: the exact match on the ``held_out``
    set, the steps, the train loss, the time and speed, and the checkpoint if one was saved."""
    lines = [f"{name}: exact match {100 * summary['exact_match']:.1f}% on "
             f"{summary['n_test']} held-out {held_out} after {summary['steps']} steps "
             f"(train loss {summary['loss']:.4f}, "
             f"{summary['seconds']:.0f} s, {summary['tokens_per_second']:,.0f} tokens/s)"]
    if summary["checkpoint"] is not None:
        lines.append(f"checkpoint: {summary['checkpoint']}")
    return lines


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
