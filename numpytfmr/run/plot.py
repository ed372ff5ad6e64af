"""Pictures of a run: its curves as a PNG, drawn with matplotlib when it is installed
(``pip install "numpytfmr[plot]"``). Every training command calls :func:`save_curves` at
the end of a run, into its run folder (``curves.png``) or the file ``--plot`` names.

A picture is a list of panels side by side; a panel is a dict::

    {"title": str, "xlabel": str, "ylabel": str,
     "lines": [{"x": [...], "y": [...], "label": str, "style": "-" | "o-" | ...,
                "alpha": float}],
     "hlines": [{"y": float, "label": str}]}

:func:`run_panels` makes the panels of any run summary (its training loss per step and
each held-out metric at its evaluations); ``pretrain`` draws bits per byte beside the
n-gram baselines instead (:func:`pretrain_panels`).
"""
import importlib.util
import io
import math

import numpy as np

from ..shared.fileio import atomic_write_bytes

__all__ = ["plot_available", "save_curves", "run_panels", "pretrain_panels", "CURVES_FILE"]

CURVES_FILE = "curves.png"
_STYLES = (":", "-.", "--", (0, (1, 3)))


def plot_available():
    """True when matplotlib can be imported (the ``plot`` extra)."""
    return importlib.util.find_spec("matplotlib") is not None


def _smoothed(y, width):
    """The running mean of ``y`` over ``width`` points (shorter at the start)."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0 or width <= 1:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))                  # c[i] = y[0] + ... + y[i-1]
    end = np.arange(1, y.size + 1)
    begin = np.maximum(end - width, 0)
    return (c[end] - c[begin]) / (end - begin)


def _loss_panel(loss, ylabel="training loss", scale=1.0):
    steps = np.arange(1, len(loss) + 1)
    y = np.asarray(loss, dtype=np.float64) * scale
    width = max(1, len(loss) // 50)
    lines = [{"x": steps, "y": y, "label": "per step", "style": "-", "alpha": 0.25}]
    if width > 1:
        lines.append({"x": steps, "y": _smoothed(y, width), "label": f"mean of {width} steps",
                      "style": "-", "alpha": 1.0})
    return {"title": "training", "xlabel": "step", "ylabel": ylabel, "lines": lines, "hlines": []}


def run_panels(summary, metrics=None):
    """Panels of a run summary: the training loss per step (``loss_history``), and one
    panel per held-out metric of ``summary["evals"]`` (``metrics``: their names, default
    every number there but the step), each against the step of its evaluation."""
    panels = []
    loss = summary.get("loss_history") or summary.get("train_loss_history")
    if loss:
        panels.append(_loss_panel(loss))
    evals = summary.get("evals") or []
    names = metrics if metrics is not None else [
        k for k in (evals[0] if evals else {}) if k != "step"
        and isinstance(evals[0][k], (int, float)) and not isinstance(evals[0][k], bool)]
    for name in names:
        points = [(e["step"], e[name]) for e in evals if isinstance(e.get(name), (int, float))]
        if points:
            x, y = zip(*points)
            panels.append({"title": name.replace("_", " "), "xlabel": "step",
                           "ylabel": name.replace("_", " "),
                           "lines": [{"x": x, "y": y, "label": "held-out", "style": "o-",
                                      "alpha": 1.0}], "hlines": []})
    return panels


def pretrain_panels(summary):
    """One panel: held-out bits per byte at every evaluation (step 0 before any update, the
    last one the final figure) over the training loss in bits per byte, and the n-gram
    baselines of the same split as horizontal lines."""
    to_bpb = 1.0 / math.log(2) / summary["bytes_per_token"]
    panel = _loss_panel(summary["loss_history"], "bits per byte", to_bpb)
    for line in panel["lines"]:
        line["label"] = "training batches" + ("" if line["alpha"] < 1 else " (running mean)")
    evals = summary["evals"]
    panel["lines"].append({"x": [e["step"] for e in evals],
                           "y": [e["val_bits_per_byte"] for e in evals],
                           "label": "held-out text", "style": "o-", "alpha": 1.0})
    panel["hlines"] = [{"y": v, "label": f"{k} (Kneser-Ney)"}
                       for k, v in (summary.get("ngram_bits_per_byte") or {}).items()]
    panel["title"] = "pretraining"
    values = [e["val_bits_per_byte"] for e in evals] + [h["y"] for h in panel["hlines"]]
    panel["ylim"] = (0.0, max(values[1:] + [values[-1]]) * 1.25) if values else None
    return [panel]


def save_curves(path, panels, title=None):
    """Draw ``panels`` side by side and write the PNG to ``path`` (atomically); returns
    the path. Raises ImportError without matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * max(len(panels), 1) + 0.6, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        for line in panel["lines"]:
            ax.plot(line["x"], line["y"], line.get("style", "-"), alpha=line.get("alpha", 1.0),
                    label=line["label"], markersize=3)
        for h, style in zip(panel.get("hlines", []), _STYLES * 4):
            ax.axhline(h["y"], color="tab:gray", linestyle=style, label=h["label"])
        if panel.get("ylim"):
            ax.set_ylim(*panel["ylim"])
        ax.set_title(panel["title"])
        ax.set_xlabel(panel["xlabel"])
        ax.set_ylabel(panel["ylabel"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_write_bytes(path, buffer.getvalue())
    return path
