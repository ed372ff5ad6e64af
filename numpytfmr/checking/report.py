"""How a gradient check is reported: numbers as text and the report of a result."""
import numpy as np

__all__ = ["BELOW_NOISE", "format_error", "format_rel_error", "format_index", "format_result",
           "describe", "reproduce_line"]

BELOW_NOISE = "< noise"


def format_error(v):
    """An absolute or relative error as text (``-`` when there is none)."""
    return "-" if v is None else f"{v:.2e}"


def format_rel_error(v):
    """A reported relative error as text; 0 means no difference rose above the rounding noise."""
    return BELOW_NOISE if v == 0.0 else format_error(v)


def format_index(index):
    """The label of a compared value: ``index (i, j)`` of an entry, or ``direction k``."""
    return index if isinstance(index, str) else f"index {index}"


def describe(x):
    """What ``x`` is, for error messages: an array's dtype and shape, or its type."""
    if isinstance(x, np.ndarray):
        return f"an array of dtype {x.dtype} and shape {x.shape}"
    return "None" if x is None else f"a {type(x).__name__}"


def reproduce_line(seed, h, mode, rtol, atol, n_directions, n_coordinates):
    """The ``check_gradients`` call that repeats a check (settings that differ from the
    defaults spelled out)."""
    extra = "".join(text for differs, text in (
        (rtol != 1e-6, f", rtol={rtol!r}"), (atol != 1e-9, f", atol={atol!r}"),
        (mode == "directional", f", n_directions={n_directions}, n_coordinates={n_coordinates}"))
        if differs)
    return f"check_gradients(forward, backward, inputs, seed={seed!r}, h={h!r}, mode={mode!r}{extra})"


def format_result(result):
    """The readable report of a GradcheckResult (what ``str(result)`` prints): the table of
    inputs, failed structural checks, worst entries, inconclusive entries, diagnoses, and
    the call that reproduces the check."""
    names = {row.position: row.name for row in result.rows}
    lines = [f"gradient check {'PASSED' if result.passed else 'FAILED'} "
             f"(mode={result.mode!r}, rtol={result.rtol:g}, atol={result.atol:g})", ""]
    table = [("input", "shape", "max abs err", "max rel err", "verdict")]
    for row in result.rows:
        table.append((row.name, "None" if row.shape is None else str(row.shape),
                      format_error(row.max_abs_error), format_rel_error(row.max_rel_error), row.verdict))
    widths = [max(len(r[c]) for r in table) for c in range(5)]
    for r in table:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    if any(r[3] == BELOW_NOISE for r in table):
        lines.append(f"  ({BELOW_NOISE}: every difference is within the rounding error of the "
                     "finite differences)")
    failed = [(name, msg) for name, ok, msg in result.structural if not ok]
    if failed:
        lines += ["", "structural checks that failed:"]
        lines += [f"  - {name}: {msg}" for name, msg in failed]
    if result.worst:
        lines += ["", "worst entries (analytic = from backward, numeric = finite differences):"]
        for pos, entries in result.worst.items():
            for e in entries:
                lines.append(f"  {names[pos]} {format_index(e['index'])}: analytic {e['analytic']:.8g}, "
                             f"numeric {e['numeric']:.8g} (abs err {e['abs_error']:.2e})")
    if result.inconclusive:
        lines += ["", "inconclusive entries (not failures):"]
        for pos, entries in result.inconclusive.items():
            for e in entries[:3]:
                lines.append(f"  {names[pos]} {format_index(e['index'])}: {e['reason']}")
            if len(entries) > 3:
                lines.append(f"  {names[pos]}: ... {len(entries) - 3} more")
    if any(result.diagnoses.values()):
        lines += ["", "diagnoses:"]
        for pos, sentences in result.diagnoses.items():
            lines += [f"  {names[pos]}: {s}" for s in sentences]
    lines += ["", f"seed {result.seed}, step h = {result.h:g} (five-point stencil)",
              f"reproduce: {result.reproduce}"]
    return "\n".join(lines)
