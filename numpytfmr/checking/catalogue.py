"""Known wrong backwards: is this gradient one of the formulas students write instead?

Each registered op declares a catalogue of named wrong backwards (``registry.Mistake``),
each computing the wrong gradient from the op's cache. The op the forward computes
(``recognise.py``) is run on the case's inputs, and ``analytic = c * variant`` is tested
for every variant of the failing input's gradient: ``c = 1`` names the mistake, another
``c`` names it with the wrong factor. See docs/gradcheck.md, "The catalogue of known wrong
backwards".
"""
import copy

import numpy as np

from .evidence import Diagnosis

__all__ = ["catalogue_diagnoses", "mistakes_for", "reference_cache"]

_MATCH = 2e-6          # relative tolerance of "equal up to rounding" (float32 included)
_LIMIT = 2             # at most this many matching variants are named


def mistakes_for(case, recognition):
    """``[Mistake]`` of the input under diagnosis for one recognition of the forward."""
    from ..registry import input_names, get          # the registry imports the topic modules
    spec = get(recognition.op)
    if not spec.mistakes:
        return []
    names = input_names(spec.forward)
    if case.p >= len(names) or names[case.p] in recognition.left_out:
        return []
    return [m for m in spec.mistakes if m.of == names[case.p]]


def reference_cache(case, k, recognition):
    """The cache of the recognised op on the case's inputs (memoised), or None. For a forward
    of the student's own, a copy that also holds the op's inputs under ``"inputs"`` (a
    variant may need an input the cache keeps only in part)."""
    def run():
        try:
            out, cache = recognition.run()
        except Exception:  # noqa: BLE001 -- a wrapper that passes other inputs: no catalogue
            return None
        if out.shape != case.out.shape:
            return None
        if not recognition.reference:            # a forward of the student's own: the
            cache = copy.copy(cache)             # variants also see the op's inputs
            cache["inputs"] = recognition.args
        return cache
    return case.memo(("reference_cache", k), run)


def catalogue_diagnoses(case, a, n, project, use, atol):
    """Sentences naming the known wrong backwards that ``a`` equals (times a constant),
    after a sentence on how the forward differs from the op it is close to, if it does.
    ``a``, ``n``: the values compared; ``project``, ``use``: as in ``diagnose``."""
    try:
        recognitions = case.recognised()
    except Exception:  # noqa: BLE001 -- looking never fails a check
        return []
    first = ([Diagnosis(recognitions[0].difference(), "forward_differs")]
             if recognitions and recognitions[0].close else [])
    for k, rec in enumerate(recognitions):
        try:
            found = _matches(case, k, rec, a, n, project, use, atol)
        except Exception:  # noqa: BLE001
            found = []
        if found:
            return first + found
    return first


def _matches(case, k, rec, a, n, project, use, atol):
    mistakes = mistakes_for(case, rec)
    cache = reference_cache(case, k, rec) if mistakes else None
    if cache is None:
        return []
    found = []
    for m in mistakes:
        try:
            with np.errstate(all="ignore"):
                v = np.asarray(m.gradient(case.dout * rec.factor, cache), dtype=np.float64)
            if v.shape != case.x.shape or not np.isfinite(v).all():
                continue
            pv = np.asarray(project(v), dtype=np.float64)[use]
        except Exception:  # noqa: BLE001 -- a variant that does not apply to this case
            continue
        c = _fit(a, pv, n, atol)
        if c is not None:
            found.append(_sentence(case, rec, m, c))
            if len(found) >= _LIMIT:
                break
    return found


def _fit(a, v, n, atol):
    """The c with a = c * v up to rounding, or None (also when v tells nothing here)."""
    scale = max(float(np.max(np.abs(n), initial=0.0)), float(np.max(np.abs(v), initial=0.0)))
    if scale == 0.0 or not a.size:
        return None
    loose = 1e-5 * scale + atol
    if float(np.max(np.abs(a))) <= loose:
        return None                                     # all zeros: said as such
    if float(np.max(np.abs(v - n))) <= loose:
        return None                                     # the right gradient on this case
    vv = float(np.dot(v, v))
    if vv == 0.0:
        return None
    c = float(np.dot(a, v)) / vv
    off = float(np.max(np.abs(a - c * v)))
    if not 1e-3 <= abs(c) <= 1e3 or off > _MATCH * max(scale, abs(c) * scale) + atol:
        return None
    nn = float(np.dot(n, n))
    if abs(c - 1.0) > 1e-6 and nn > 0:
        k = float(np.dot(v, n)) / nn
        if float(np.max(np.abs(v - k * n))) <= loose:
            return None                                 # v is a scaled right gradient: a factor
    return c


def _sentence(case, rec, m, c):
    short = len(case.name) <= 7 and " " not in case.name
    grad = f"d{case.name}" if short else f"gradient of {case.name}"
    known = f"{rec.op}'s known wrong backward \"{m.name}\""
    if rec.reference:
        head, verb = grad if short else f"the {grad}", "is"
    elif rec.close:
        head, verb = f"against your own forward (close to {rec.describe()}), your {grad}", "matches"
    else:
        head, verb = f"your forward computes {rec.describe()}; your {grad}", "matches"
    if abs(c - 1.0) <= 1e-6:
        return _known(f"{head} {verb} {known}: {m.text}", m)
    label = case.terms.name_factor(c) if case.terms is not None else ""
    named = f" ({abs(c):.4g} = {label})" if label else ""
    if abs(c + 1.0) <= 1e-6:
        return _known(f"{head} = -1 x {known}: two mistakes, a flipped sign and this one: "
                      f"{m.text}", m)
    return _known(f"{head} = {c:.4g} x {known}{named}: two mistakes, a wrong factor (a scale "
                  f"missing or applied twice) and this one: {m.text}", m)


def _known(text, m):
    return Diagnosis(text, "known_mistake", m.name)
