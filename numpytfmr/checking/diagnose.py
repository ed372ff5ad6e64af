"""Diagnoses: sentences that say how a failing gradient is wrong.

:func:`diagnose` tries, on the compared values of one input (``compare.compare_input``),
the patterns a wrong backward leaves (zeros, a factor, a sign, a transpose, a ``dout``
term, one slice), the op's catalogue (``catalogue.py``) and, with the whole case at hand
(full mode), one case-wide cause (``_DETECTORS``). Every diagnosis with an example sentence:
docs/gradcheck.md, "Diagnoses".
"""
import numpy as np

from .catalogue import catalogue_diagnoses
from .compare import FAIL, INCONCLUSIVE
from .counterfactual import counterfactual_diagnoses
from .elementwise import elementwise_diagnoses
from .evidence import Diagnosis, Evidence
from .locate import id_diagnoses, mask_diagnoses, rotation_diagnoses
from .products import product_diagnoses
from .report import format_index
from .rowwise import row_diagnoses

__all__ = ["diagnose", "kink_sentence", "NO_PATTERN", "Diagnosis"]

# The case-wide detectors, most specific first; the first that fits names the cause.
_DETECTORS = (elementwise_diagnoses, product_diagnoses, counterfactual_diagnoses,
              rotation_diagnoses, id_diagnoses, mask_diagnoses, row_diagnoses)

NO_PATTERN = Diagnosis("no simple pattern fits (constant factor, sign, transpose, zeros, a "
                       "missing dout term, one slice); compare the worst entries below with the "
                       "derivation term by term", "none")


def diagnose(cmp, grad, dout, atol, case=None, *, case_wide=True, terms=None):
    """Sentences that say how a failing gradient is wrong (every one that fits).

    case: the :class:`~.evidence.Case` of this input, or None when only the compared values
    are known (then ``terms`` names factors). The case-wide diagnoses need it, and are
    skipped (``case_wide=False``) for a backward not linear in dout: not a vector-Jacobian
    product, its errors have no structure to read."""
    terms = terms if case is None else case.terms
    use = cmp["status"] != INCONCLUSIVE
    a, n, project = cmp["a"][use], cmp["n"][use], cmp["project"]
    fail = (cmp["status"] == FAIL)[use]
    if not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        return [Diagnosis(f"the analytic gradient has {bad} NaN/inf values (a division by zero or "
                          "the log/exp of an unguarded value in backward?)", "nan")]
    sentences = []
    scale = max(float(np.max(np.abs(a))) if a.size else 0.0, float(np.max(np.abs(n))) if n.size else 0.0)
    tiny = atol + 1e-12 * scale

    def close(u, v):
        return u.size > 0 and float(np.max(np.abs(u - v))) <= 1e-5 * max(scale, 1e-300) + atol

    # 1. everything zero, or zeros where the numeric gradient is not
    a_zero, n_zero = np.abs(a) <= tiny, np.abs(n) <= tiny
    all_zero = bool(a_zero.all() and not n_zero.all())
    if all_zero:
        sentences.append(Diagnosis(
            "the analytic gradient is all zeros but the numeric one is not: this gradient is never "
            "computed or never added in (a missing term, or a forgotten +=)", "zeros"))
    else:
        k = int((fail & a_zero & ~n_zero).sum())
        if k and 2 * k >= int(fail.sum()):
            sentences.append(Diagnosis(
                f"analytic is zero at {k} of the {int(fail.sum())} wrong entries where the numeric "
                "gradient is not: a term of the gradient is missing there", "zeros"))
        k = int((fail & n_zero & ~a_zero).sum())
        if k and 2 * k >= int(fail.sum()):
            sentences.append(Diagnosis(
                f"analytic is non-zero at {k} of the {int(fail.sum())} wrong entries where the output "
                "does not depend on this input (numeric 0): an extra term, or a mask not applied in "
                "backward", "extra_nonzero"))

    # 2. a constant factor (sign included)
    factor_found = False
    nn = float(np.dot(n, n))
    if nn > 0 and not a_zero.all():
        c = float(np.dot(a, n)) / nn
        if abs(c - 1.0) > 1e-4 and close(a, c * n) and (int((~n_zero).sum()) >= 2 or _named(c, terms)):
            factor_found = True
            sentences.append(_factor_sentence(c, terms))
    m = int(fail.sum())
    if not factor_found and 2 <= m < fail.size:
        # the same test on the wrong entries alone: a factor applied to part of the gradient
        a_f, n_f = a[fail], n[fail]
        nn = float(np.dot(n_f, n_f))
        c = float(np.dot(a_f, n_f)) / nn if nn > 0 else 0.0
        if c != 0.0 and abs(c - 1.0) > 1e-4 and close(a_f, c * n_f):
            label = _named(c, terms)
            named = f" ({abs(c):.4g} = {label})" if label else ""
            sentences.append(Diagnosis(
                f"at the {m} wrong entries analytic = {c:.4g} x numeric{named} (the other entries are "
                "right): a factor applied to part of the gradient only", "partial_factor"))

    # 3. transposed over the last two axes
    transposed = bool(grad.ndim >= 2 and grad.shape[-1] == grad.shape[-2] >= 2
                      and close(project(np.swapaxes(grad, -1, -2))[use], n))
    if transposed:
        sentences.append(Diagnosis(
            "transposed: analytic equals numeric with the last two axes swapped; the gradient is "
            "built transposed (for y = x @ W the weight gradient is x^T @ dout, of W's shape "
            "(d_in, d_out))", "transpose"))

    # 4. a missing (or extra) term proportional to dout: a direct path from this input to out
    reduced = _reduce_to_shape(dout, grad.shape)
    dout_term = False
    if reduced is not None and not factor_found:
        d = project(reduced)[use]
        r = n - a
        dd = float(np.dot(d, d))
        if dd > 0:
            c = float(np.dot(r, d)) / dd
            if abs(c) > 1e-6 and close(r, c * d) and float(np.max(np.abs(r))) > tiny:
                dout_term = True
                what = "dout" if reduced.shape == dout.shape else "dout summed over the broadcast axes"
                if c > 0:
                    path = ("a direct path from this input to the output (e.g. the identity path "
                            "of a residual y = f(x) + x, whose gradient is dout itself)"
                            if reduced.shape == dout.shape else
                            "a path where this input is added to the output directly (as a bias "
                            "is: its gradient is dout summed over the broadcast axes)")
                    text = (f"numeric - analytic = {_trim(c)}{what}: a term is missing -- the "
                            f"gradient of {path}")
                else:
                    text = (f"analytic - numeric = {_trim(-c)}{what}: an extra term -- dout passed "
                            "straight through once too often")
                sentences.append(Diagnosis(text, "dout_term"))

    # 5. a known wrong backward of the op's catalogue (any mode): named first; the case-wide
    #    diagnosis below still says what shape the error has
    known = []
    if case is not None and case_wide:
        known = catalogue_diagnoses(case, a, n, project, use, atol)
        sentences = known + sentences
    located = bool(known)

    # 6. with the whole case (full mode, every entry conclusive): one case-wide cause
    strong = factor_found or transposed or dout_term or all_zero
    if cmp["full"] and case is not None and case_wide and not strong and bool(use.all()) and grad.size:
        ev = Evidence(cmp["a"].reshape(grad.shape), cmp["n"].reshape(grad.shape),
                      (cmp["status"] == FAIL).reshape(grad.shape), dout, atol,
                      float(np.max(cmp["rounding"])) if cmp.get("rounding") is not None else 0.0,
                      case)
        found = next(filter(None, (detect(ev) for detect in _DETECTORS)), [])
        sentences += found
        located = located or bool(found)

    # 7. errors confined to one slice (full mode), unless a cause was located above
    if cmp["full"] and grad.ndim >= 1 and not located:
        fail_mask = (cmp["status"] == FAIL).reshape(grad.shape)
        where = np.nonzero(fail_mask)
        m = int(fail_mask.sum())
        if m == 1 and grad.size > 1:
            sentences.append(Diagnosis(
                f"only one entry is wrong, at index {tuple(int(i[0]) for i in where)}: look for a special "
                "case (a boundary element, an off-by-one)", "slice"))
        elif m >= 2 and m < grad.size:
            confined = []
            for axis, size in enumerate(grad.shape):
                values = np.unique(where[axis])
                if size > 1 and values.size == 1:
                    i = int(values[0])
                    tag = " (the first)" if i == 0 else (" (the last)" if i == size - 1 else "")
                    confined.append(f"index {i}{tag} of axis {axis}")
            if confined:
                sentences.append(Diagnosis(
                    f"the error is confined to one slice: all {m} wrong entries are at "
                    f"{' and '.join(confined)}; look for an off-by-one, a boundary row handled "
                    "separately (first/last position, a padded or masked slot), or a slice "
                    "assignment that misses part of the array", "slice"))
    return sentences


def kink_sentence(e):
    """The diagnosis of an entry at a kink whose analytic value lies outside the range of
    the one-sided derivatives (an entry note of ``compare_input`` marked failed)."""
    return Diagnosis(f"at {format_index(e['index'])} the input sits at a kink, and the analytic "
                     f"value {e['analytic']:.6g} is outside the range of the one-sided "
                     f"derivatives [{min(e['left'], e['right']):.6g}, "
                     f"{max(e['left'], e['right']):.6g}]", "kink")


def _trim(c):
    return "" if abs(c - 1) < 1e-6 else f"{c:.4g} x "


def _reduce_to_shape(dout, shape):
    """dout summed over the axes along which an input of ``shape`` was broadcast, or None."""
    if dout.shape == tuple(shape):
        return dout
    try:
        if np.broadcast_shapes(dout.shape, shape) != dout.shape:
            return None
    except ValueError:
        return None
    lead = dout.ndim - len(shape)
    reduced = dout.sum(axis=tuple(range(lead))) if lead else dout
    ones = tuple(i for i, size in enumerate(shape) if size == 1 and reduced.shape[i] != 1)
    return reduced.sum(axis=ones, keepdims=True) if ones else reduced


def _named(c, terms):
    """|c| in the case's terms (``"1/scale, scale = 0.5"``), or "" when none fits."""
    return terms.name_factor(c) if terms is not None else ""


def _factor_sentence(c, terms):
    label = _named(c, terms)
    named = f" ({abs(c):.4g} = {label})" if label else ""
    if abs(c + 1.0) <= 1e-4:
        return Diagnosis("wrong sign: analytic = -1 x numeric; a sign is flipped somewhere (a "
                         "subtraction reversed, or the gradient of -L returned)", "sign")
    if c < 0:
        return Diagnosis(f"wrong sign and scale: analytic = {c:.4g} x numeric{named}: a sign is flipped "
                         "and a scale factor is missing or applied twice", "sign")
    doubled, halved = abs(c - 2.0) <= 1e-4, abs(c - 0.5) <= 1e-4
    if not label and not (doubled or halved):
        return Diagnosis(f"off by a constant factor: analytic = {c:.4g} x numeric at every compared "
                         "entry; a scale factor is wrong (a mean vs a sum, a temperature, a normaliser)",
                         "factor")
    sentence = f"analytic = {c:.4g} x numeric{named}: a scale factor is missing or applied twice"
    if doubled:
        sentence += " (e.g. a gradient added twice, or d(x^2)/dx = 2x doubled again)"
    elif halved:
        sentence += (" (e.g. the 2 of d(x^2)/dx = 2x dropped, or only one of two paths of a shared "
                     "input added)")
    return Diagnosis(sentence, "factor")
