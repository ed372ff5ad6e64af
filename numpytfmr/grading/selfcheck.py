"""Check your homework on the visible cases, without the grader and without the answer key.

    python check.py homework.py            (or homework.ipynb)
    python check.py homework.py --only softmax_forward softmax_backward
    python check.py homework.py --json verdicts.json
    python check.py homework.py --timeout 30

It needs only Python and NumPy. ``check_data.json`` and ``check_data.npz`` beside it hold
the visible cases of the assignment: their inputs, the upstream gradients, and the expected
outputs and gradients. Your functions are run on them and judged as the grader judges its
visible tests: the values (with the grader's tolerances), the shapes and dtypes, what comes
back (a pair (out, cache) from a forward, one gradient per input from a backward), inputs,
caches and dout left unchanged. Where a backward is wrong, it is also checked against finite
differences of your own forward, which tells whether the forward or the backward is at fault.
As in the grader, such a backward keeps its points only where your forward is recognisably the
op: on that case a near miss the grader can name (the expected output times a constant, a
known slip, a factor from the shapes, an option left out or with another value, dropout or LoRA
scaled wrongly), or right on more than half of the function's visible cases; each credit
("credited: ...", "not credited: ...") and each slip's deduction is named in the output.
Random ops (dropout) are judged against your own draw: the mask is read off your output and its
statistics tested, and the backward is checked against finite differences of your forward
(the same seed gives the same mask).

Your homework runs in a second Python process, and each call of one of your functions may take
at most the assignment's time limit (``--timeout S`` changes it): a function that never returns
is reported as timed out, and the others are still checked.

The hidden cases are not here; the grader adds them. A function whose cases are all hidden is
listed as "hidden: graded after the due date" and does not fail the check. Exit status: 0 when
every visible case passes, 1 when one fails, 2 on a usage error.

This file is written by ``numpytfmr make-assignment`` (numpytfmr/grading/selfcheck.py), with
``judge.py`` beside it: the grader's own judge (numpytfmr/grading/judge.py, copied unchanged),
which decides every verdict here as it does in the grader. Both import only the standard
library and NumPy; keep them in the same folder.
"""
import argparse
import json
import os
import re
import sys
import time
import traceback
import types

import numpy as np

try:                     # inside the package: numpytfmr/grading/judge.py
    from . import judge
except ImportError:      # check.py in the student's folder: judge.py beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import judge

SLIP = "slip (right values, but it costs part of the points): "
FD_MAX_ENTRIES = 4000    # inputs larger than this are checked on a sample of their entries
FD_DIRECTIONS = 8        # random directions (and as many single entries) per input, in that mode


class UsageError(Exception):
    pass


# --- reading the homework ------------------------------------------------------------------

# `!cmd`, `%magic`, `x = !cmd`, `x = %magic` at any indentation
_MAGIC = re.compile(r"^(\s*)(?:[!%]|[\w.,\s\[\]]+=\s*[!%])")


def cell_code(source):
    """A notebook cell's code with IPython shell and magic lines made ``pass`` (None for a cell
    magic such as ``%%bash``). The grader reads notebooks with this same function."""
    lines = source.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("%%"):
        return None
    out = []
    for line in lines:
        m = _MAGIC.match(line)
        out.append(f"{m.group(1)}pass  # IPython line dropped" if m else line)
    return "\n".join(out) + "\n"


def read_chunks(path):
    """[(filename, source, continue_on_error)] of a .py file or a notebook's code cells."""
    base = os.path.basename(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"{path!r} cannot be read: {exc.strerror}") from None
    if path.endswith(".py"):
        return [(base, text, False)]
    if not path.endswith(".ipynb"):
        raise UsageError(f"{path!r}: expected a .py file or a .ipynb notebook")
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path!r} is not a valid notebook ({exc.msg}, line {exc.lineno})") from None
    chunks = []
    for k, cell in enumerate(nb.get("cells", []) if isinstance(nb, dict) else [], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        code = cell_code(src) if isinstance(src, str) else None
        if code and code.strip():
            chunks.append((f"{base} [cell {k}]", code, True))
    return chunks


def load_homework(path):
    """(module, problems): the homework run as a module, and what went wrong while loading."""
    module = types.ModuleType("submission")
    module.__file__ = os.path.abspath(path)
    problems = []
    for filename, source, keep_going in read_chunks(path):
        try:
            exec(compile(source, filename, "exec"), module.__dict__)
        except Exception as exc:  # noqa: BLE001 -- reported, as the grader reports it
            problems.append(f"{filename}: {type(exc).__name__}: {exc}")
            if not keep_going:
                return None, problems
    return module, problems


# --- the cases -----------------------------------------------------------------------------

def decode(enc, arrays):
    """A stored value: arrays by key, dicts, lists, tuples and plain JSON values."""
    if isinstance(enc, dict):
        if "array" in enc:
            return arrays[enc["array"]].copy()
        if "dict" in enc:
            return {k: decode(v, arrays) for k, v in enc["dict"].items()}
        if "tuple" in enc:
            return tuple(decode(v, arrays) for v in enc["tuple"])
        if "list" in enc:
            return [decode(v, arrays) for v in enc["list"]]
        if "value" in enc:
            return enc["value"]
    return enc


def fresh_kwargs(kwargs):
    """Options for one call: an int ``rng`` is a seed, made a new Generator every time."""
    kw = dict(kwargs)
    if type(kw.get("rng")) is int:
        kw["rng"] = np.random.default_rng(kw["rng"])
    return kw


def _copy(obj):
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if type(obj) is dict:
        return {k: _copy(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_copy(v) for v in obj)
    return obj


def _same(a, b):
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype
                and a.tobytes() == b.tobytes())
    if type(a) is dict:
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) in (list, tuple):
        return type(b) is type(a) and len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a is b


# --- judging one value ---------------------------------------------------------------------

def check_value(v, expected, what, tol="float64", none_reason=""):
    """(ok, short, lines): the grader's verdict on one returned value (:func:`judge.check_value`);
    right values with a contract slip pass, the slip named in a line that starts with SLIP."""
    verdict = judge.check_value(judge.returned(v), expected, what, tol=tol, none_reason=none_reason)
    return verdict.ok, verdict.short, verdict.lines + [SLIP + verdict.slip] * bool(verdict.slip)


# --- a wrong forward that is recognisably the op: a near miss the grader can name ---------------

def recognised(case, arrays, got, tol, sentences=()):
    """The near miss of the op that gives the wrong output ``got`` on ``case``, in words, or ""
    (the grader's rule): the expected output times a constant; one of the named variants stored
    for the case (a known slip, one input times a factor from the shapes, an option left out,
    scaled, flipped or changed; ``sentences``: check_data's ``near_sentences``, which they
    index); a numeric option with another value (the output taken as affine in the option, from
    its output at twice the value)."""
    ret = judge.returned(got)
    if not ret.is_number:
        return ""
    g = ret.array.astype(np.float64)
    e = np.asarray(arrays[case["out"]], dtype=np.float64)
    if g.shape != e.shape or not g.size or not np.isfinite(g).all() or not np.isfinite(e).all():
        return ""
    scaled = judge.scaled_output(g, e, tol)
    if scaled:
        return scaled
    if case.get("near"):
        rows = arrays[case["near_out"]]
        for sentence, row in case["near"]:
            if judge.close_at(g, rows[row], tol):
                return sentences[sentence]
    for key, value, row in case.get("moved", []):
        moved = arrays[case["moved_out"]][row]
        ratio = judge.option_ratio(g, e, moved)
        # the output taken as affine in the option: e + (ratio - 1) (moved - e)
        if ratio is None or not judge.close_at(g, e + (ratio - 1.0) * (moved - e), tol):
            continue
        return judge.option_sentence(key, value, ratio)
    return ""


def judge_draw(draw, args, kw, got, tol, redraw=None):
    """(ok, short, lines, mask_read, near_miss) for a random forward judged against its own draw,
    or None when the output is not an array of the right shape (then compared as any other).
    ``redraw(seed)``: the forward's output under another generator, for the larger cases."""
    ret = judge.returned(got)
    if ret.kind != "array" or ret.array.shape != tuple(draw["shape"]) or not np.isfinite(ret.array).all():
        return None
    reader = judge.DRAWS[draw["op"]][0]
    mask, lines, near = judge.read_draw(draw["op"], args, kw, ret.array.astype(np.float64), tol)
    if isinstance(mask, str):                     # a mask that cannot be read: compared as any other
        return None
    if mask is None:
        return False, "out: no dropout mask gives it", lines, False, near
    ok, lines = judge.mask_statistics(mask, args[0], draw["p"])
    if not ok:
        return False, "mask statistics", lines, True, ""
    seeds = judge.redraw_seeds(draw["op"], args, kw) if redraw is not None else []
    if seeds:
        masks = [mask]
        for seed in seeds:
            again = judge.returned(redraw(seed))
            m = reader(args, kw, again.array.astype(np.float64), tol)[0] \
                if again.kind == "array" and again.array.shape == mask.shape else None
            if m is None or isinstance(m, str):
                return True, "", [], True, ""
            masks.append(m)
        ok, lines = judge.rng_dependence(masks, args[0], draw["p"])
        if not ok:
            return False, "mask ignores rng", lines, True, ""
    return True, "", [], True, ""


# --- finite differences of the student's own forward ----------------------------------------------

def finite_differences(forward, args, kw, dout, p, rng):
    """(indices, numeric) of d sum(forward(args) * dout) / d args[p] at some entries."""
    base = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    x = base[p]
    n = x.size
    idx = np.arange(n) if n <= FD_MAX_ENTRIES else np.sort(rng.choice(n, FD_MAX_ENTRIES, replace=False))
    num = np.zeros(idx.size)

    def f(xp):
        call = list(base)
        call[p] = xp
        out = forward(*[_copy(a) for a in call], **fresh_kwargs(kw))[0]
        return float(np.sum(np.asarray(out, dtype=np.float64) * dout))
    for m, j in enumerate(idx):
        _beat()
        values = []
        for step in (-2, -1, 1, 2):
            xp = x.copy()
            xp.reshape(-1)[j] += step * judge.FD_STEP
            values.append(f(xp))
        num[m] = (values[0] - 8 * values[1] + 8 * values[2] - values[3]) / (12 * judge.FD_STEP)
    return idx, num


def directional_check(forward, args, kw, dout, p, grad, name, rng, rtol, atol):
    """(ok, lines): the gradient of input ``p`` along FD_DIRECTIONS random unit directions u
    (sum(grad * u)) and at as many entries spread over it, against finite differences of the
    forward along the same directions."""
    x = args[p]
    dirs = [u / np.linalg.norm(u) for u in (rng.standard_normal(x.shape) for _ in range(FD_DIRECTIONS))]
    for j in np.linspace(0, x.size - 1, min(FD_DIRECTIONS, x.size)).astype(int):
        e = np.zeros(x.shape)
        e.reshape(-1)[j] = 1.0
        dirs.append(e)

    def f(xp):
        call = list(args)
        call[p] = xp
        out = forward(*[_copy(a) for a in call], **fresh_kwargs(kw))[0]
        return float(np.sum(np.asarray(out, dtype=np.float64) * dout))
    num, ana = np.zeros(len(dirs)), np.zeros(len(dirs))
    g = grad.astype(np.float64)
    for m, u in enumerate(dirs):
        _beat()
        values = [f(x + step * judge.FD_STEP * u) for step in (-2, -1, 1, 2)]
        num[m] = (values[0] - 8 * values[1] + 8 * values[2] - values[3]) / (12 * judge.FD_STEP)
        ana[m] = float(np.sum(g * u))
    scale = max(1.0, float(np.max(np.abs(num))))
    bad = np.abs(ana - num) > atol * scale + rtol * np.abs(num)
    if not bad.any():
        return True, []
    m = int(np.argmax(bad))
    return False, [f"d{name}: along {int(bad.sum())} of {len(dirs)} directions (random ones, then "
                   f"single entries) your gradient differs from finite differences of your forward; "
                   f"first: yours {ana[m]:.6g}, finite differences {num[m]:.6g}"]


def own_forward_check(forward, args, kw, dout, grads, names):
    """(consistent, lines): the backward's gradients against finite differences of the forward.
    float32 inputs are differentiated in float64 (the same draw for random ops), and compared
    with float32's tolerance."""
    rng = np.random.default_rng(0)
    lines, ok = [], True
    single = any(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in args)
    args = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a
            for a in args]
    dout = np.asarray(dout, dtype=np.float64)
    rtol, atol = (2e-3, 1e-3) if single else (1e-4, 1e-5)
    size = sum(a.size for a in args if isinstance(a, np.ndarray) and a.dtype == np.float64)
    for p, (a, g) in enumerate(zip(args, grads)):
        if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.size):
            continue
        ret = judge.returned(g)
        if ret.kind != "array" or ret.array.shape != a.shape:
            continue
        garr = ret.array
        if size > judge.FULL_CHECK_ENTRIES:             # a large case, as the grader checks it
            good, more = directional_check(forward, args, kw, dout, p, garr, names[p], rng,
                                           rtol, atol)
            ok = ok and good
            lines += more
            continue
        idx, num = finite_differences(forward, args, kw, dout, p, rng)
        ana = garr.astype(np.float64).reshape(-1)[idx]
        scale = max(1.0, float(np.max(np.abs(num))))
        bad = np.abs(ana - num) > atol * scale + rtol * np.abs(num)
        if bad.any():
            ok = False
            j = int(idx[np.argmax(bad)])
            where = tuple(int(i) for i in np.unravel_index(j, a.shape))
            lines.append(f"d{names[p]}: {int(bad.sum())} of {idx.size} entries differ from finite "
                         f"differences of your forward; first at {where}: yours "
                         f"{ana[np.argmax(bad)]:.6g}, finite differences {num[np.argmax(bad)]:.6g}")
            lines += ["  diagnosis: " + s for s in _patterns(ana, num)]
    return ok, lines


def _patterns(got, num):
    """Simple patterns between a gradient and its finite differences."""
    if not np.any(num) or not np.all(np.isfinite(got)):
        return []
    if not np.any(got):
        return ["your gradient is all zeros: a term is never computed or never added in"]
    big = np.abs(num) > 1e-6 * max(1.0, float(np.max(np.abs(num))))
    ratio = got[big] / num[big]
    if ratio.size and np.allclose(ratio, ratio[0], rtol=1e-4):
        if np.isclose(ratio[0], -1.0):
            return ["your gradient has the wrong sign everywhere"]
        return [f"your gradient is {ratio[0]:.6g} times the finite differences everywhere: a "
                "constant factor is off"]
    return []


# --- one function, case by case ------------------------------------------------------------------

def call(fn, *args, **kw):
    """(value, error_short, error_lines)."""
    _beat()                   # each call gets the time limit afresh (redraws, repeated calls)
    try:
        return fn(*args, **kw), "", []
    except NotImplementedError:
        return None, "not implemented", [f"not implemented: {fn.__name__} raises NotImplementedError"]
    except Exception as exc:  # noqa: BLE001 -- reported to the student
        tb = traceback.extract_tb(exc.__traceback__)[1:]
        lines = [f"{fn.__name__} raised {type(exc).__name__}: {exc}"]
        lines += [f"    {fr.filename}, line {fr.lineno}, in {fr.name}" for fr in tb[-3:]]
        return None, f"raised {type(exc).__name__}", lines


class Verdicts(dict):
    """{function: [(label, passed, short, lines)]}, told to ``report`` (the worker's channel to
    the parent, or None) as each verdict is reached."""

    def __init__(self, functions, report=None):
        super().__init__({f: [] for f in functions})
        self.report, self.case = report, 0

    def add(self, function, verdict):
        self[function].append(verdict)
        if self.report is not None:
            self.report({"case": self.case, "function": function, "verdict": verdict})


def _watch(function, case):
    """Say which function runs on which case (in a worker: the parent's clock restarts)."""
    if WATCH is not None:
        WATCH({"at": [function, case]})


def check_op(module, item, arrays, start=0, skip=(), report=None):
    """{function: [(label, passed, short, lines)]} for an op's forward and backward, from case
    ``start`` on; the functions in ``skip`` (a backward that hung) are not run."""
    fwd_name, bwd_name = item["functions"]
    fwd, bwd = getattr(module, fwd_name, None), getattr(module, bwd_name, None)
    names = item["inputs"]
    results = Verdicts(item["functions"], report)
    for k, case in enumerate(item["cases"]):
        if k < start:
            continue
        results.case = k
        _watch(fwd_name, k)
        label, tol = case["label"], case["dtype"]
        args = [decode(a, arrays) for a in case["args"]]
        kw = {k: decode(v, arrays) for k, v in case["kwargs"].items()}
        dout = arrays[case["dout"]]
        grads = [None if g is None else arrays[g] for g in case["grads"]]
        fwd_ok, cache, out, own_draw, near = False, None, None, False, ""
        if fwd is None or not callable(fwd):
            results.add(fwd_name, (label, False, "not defined", [f"{fwd_name} is not defined"]))
        else:
            given = [_copy(a) for a in args]
            value, short, lines = call(fwd, *given, **fresh_kwargs(kw))
            if short:
                results.add(fwd_name, (label, False, short, lines))
            elif type(value) not in (tuple, list) or len(value) != 2:
                results.add(fwd_name, (label, False, "not (out, cache)", [
                    f"{fwd_name} returned {judge.returned(value).describe()}; expected a pair (out, "
                    f"cache): the output and whatever {bwd_name} needs"]))
            else:
                out, cache = value
                flags = judge.changed_in_place(fwd_name, [names[i] for i, (a, b) in
                                                          enumerate(zip(args, given)) if not _same(a, b)])
                def redraw(seed):
                    again, _, _ = call(fwd, *_copy(args), **fresh_kwargs(dict(kw, rng=seed)))
                    return again[0] if type(again) in (tuple, list) and len(again) == 2 else None
                verdict = (judge_draw(case["draw"], args, kw, out, tol, redraw)
                           if case.get("draw") else None)
                if verdict is None:
                    verdict = check_value(out, arrays[case["out"]], "out", tol) + (False, "")
                    if not verdict[0] and verdict[1].endswith("wrong values"):
                        near = recognised(case, arrays, out, tol, item.get("sentences", ()))
                        if near:
                            verdict[2].append(f"  diagnosis: {near}")
                ok, short, lines, own_draw, near_draw = verdict
                near = near or near_draw
                fwd_ok = ok
                results.add(fwd_name, _with_slips(label, ok, short, lines, flags))
        if bwd_name in skip:
            continue
        _watch(bwd_name, k)
        if bwd is None or not callable(bwd):
            results.add(bwd_name, (label, False, "not defined", [f"{bwd_name} is not defined"]))
            continue
        if out is None:
            _, short, lines = call(bwd, dout.copy(), {})
            if short == "not implemented":
                results.add(bwd_name, (label, False, short, lines))
            else:
                results.add(bwd_name, (label, False, "not run", [
                    f"not run: {fwd_name} did not return (out, cache) on this case, and "
                    f"{bwd_name} needs that cache"]))
            continue
        pristine, given = _copy(cache), dout.copy()
        value, short, lines = call(bwd, given, cache)
        if short:
            results.add(bwd_name, (label, False, short, lines))
            continue
        flags = judge.changed_in_place(bwd_name, cache=not _same(pristine, cache),
                                       dout=not _same(dout, given))
        ok, short, lines, items = _check_grads(value, grads, args, names, bwd_name, tol, own_draw,
                                               fwd, kw, dout)
        claim = None
        if not ok and items is not None and case["check"] and not own_draw:
            consistent, extra = own_forward_check(fwd, args, kw, dout, items, names)
            lines += judge.own_forward_lines(fwd_name, bwd_name, consistent, fwd_ok, extra, tol)
            # the own-forward credit is decided once every visible forward verdict is known
            # (settle_claims): what it needs is kept with the verdict
            claim = {"consistent": consistent, "fwd_passed": fwd_ok, "near": near,
                     "nontrivial": judge.nontrivial([judge.returned(g) for g in items], grads),
                     "short": short,
                     "lines": list(lines), "flags": flags}
        verdict = _with_slips(label, ok, short, lines, flags)
        results.add(bwd_name, verdict + (claim,) if claim else verdict)
    return results


def settle_claims(item, verdicts):
    """The own-forward credit, as the grader decides it (:func:`judge.own_forward_credit`): a
    backward that failed against the expected gradients but agrees with finite differences of
    the student's own forward (wrong on that case), nonzero wherever the expected gradient is,
    keeps its points only where that forward is recognisably the op -- a near miss the grader
    can name on the case, or the expected output on more than half of the function's visible
    cases. ``verdicts``: {function: [verdict per case]}, changed in place."""
    fwd, bwd = item["functions"]
    counted = [v for v in verdicts.get(fwd, []) if v is not None and v[2] not in judge.NOT_COUNTED]
    passed, graded = sum(bool(v[1]) for v in counted), len(counted)
    for k, v in enumerate(verdicts.get(bwd, [])):
        if v is None or len(v) < 5 or not v[4]:
            continue
        label, claim = v[0], v[4]
        if not claim["consistent"] or claim["fwd_passed"]:
            verdicts[bwd][k] = tuple(v[:4])
            continue
        why = judge.own_forward_credit(fwd, item["name"], claim["near"], passed, graded)
        credited, sentence = judge.settle_claim(fwd, bwd, item["name"], why, claim["nontrivial"],
                                                passed, graded)
        if credited:
            label, ok, short, lines = _with_slips(
                label, True, "consistent with your own forward",
                ["For reference, against the correct gradient:"] + claim["lines"], claim["flags"])
            verdicts[bwd][k] = (label, ok, short, [f"credited: {sentence}"] + lines)
        else:
            verdicts[bwd][k] = _with_slips(label, False, claim["short"], claim["lines"] + [sentence],
                                           claim["flags"])


def _with_slips(label, passed, short, lines, flags):
    """One case's verdict: right values with a contract slip (an input changed in place, ...)
    pass, with the slip named; it costs a small part of the points in the grader."""
    slips = [line for line in lines if line.startswith(SLIP)] + [SLIP + f for f in flags]
    lines = [line for line in lines if not line.startswith(SLIP)]
    if passed:
        return label, True, "contract slip" if slips else short, lines + slips
    return label, False, short or ("contract slip" if slips else ""), lines + slips


def _check_grads(value, grads, args, names, bwd_name, tol, own_draw, fwd, kw, dout):
    """(ok, short, lines, items) for a backward's gradients; ``own_draw``: judged under the
    mask the student's forward drew (read off its output)."""
    names = list(names[:len(args)]) + [f"input {i}" for i in range(len(names), len(args))]
    items, slips, short, lines = judge.gradient_items(judge.returned(value), names, bwd_name)
    if items is None:
        return False, short, lines, None
    slips = [SLIP + s for s in slips]
    gnames = [judge.grad_name(x) for x in names]
    grads_got = [value] if len(names) == 1 and not slips else list(value)
    if own_draw:
        # the expected gradients depend on the student's own mask: the kinds, shapes and dtypes
        # are checked here, the values against finite differences of the forward under the
        # same seed (so the same mask)
        ok, shorts, lines = True, [], []
        for p, (g, e) in enumerate(zip(grads_got, grads)):
            v_ok, s, ls = check_value(g, e, gnames[p], tol)
            if not v_ok and not s.endswith("wrong values"):
                ok = False
                shorts.append(s)
                lines += ls
        if not ok:
            return False, "; ".join(dict.fromkeys(shorts)), lines, None
        consistent, lines = own_forward_check(fwd, args, kw, dout, grads_got, names)
        return consistent, ("" if consistent else "wrong values"), lines, grads_got
    ok, shorts, lines = True, [], []
    for p, (g, e) in enumerate(zip(grads_got, grads)):
        reason = judge.no_gradient_reason(names[p], args[p]) if e is None else ""
        v_ok, s, ls = check_value(g, e, gnames[p], tol, none_reason=reason)
        if not v_ok:
            ok = False
            shorts.append(s)
        lines += ls
    return ok, "; ".join(dict.fromkeys(shorts)), slips + lines, grads_got


def check_function(module, item, arrays, start=0, skip=(), report=None):
    """{function: [(label, passed, short, lines)]} for a plain function, from case ``start``."""
    name = item["functions"][0]
    fn = getattr(module, name, None)
    results = Verdicts([name], report)
    for k, case in enumerate(item["cases"]):
        if k < start:
            continue
        results.case = k
        _watch(name, k)
        if fn is None or not callable(fn):
            results.add(name, (case["label"], False, "not defined", [f"{name} is not defined"]))
            continue
        args = [decode(a, arrays) for a in case["args"]]
        kw = {k: decode(v, arrays) for k, v in case["kwargs"].items()}
        given = [_copy(a) for a in args]
        value, short, lines = call(fn, *given, **kw)
        if short:
            results.add(name, (case["label"], False, short, lines))
            continue
        inputs = item["inputs"] + [f"input {i}" for i in range(len(item["inputs"]), len(args))]
        flags = judge.changed_in_place(name, [inputs[i] for i, (a, b) in enumerate(zip(args, given))
                                              if not _same(a, b)])
        ok, short, lines = check_value(value, arrays[case["out"]], "result", "float64")
        results.add(name, _with_slips(case["label"], ok, short, lines, flags))
    return results


# --- a time limit per function: the homework runs in a process of its own ----------------------
#
# check.py starts itself again (``--worker``), with nothing but the standard library: the worker
# loads the homework, says which function runs on which case before running it, and sends each
# verdict as one JSON line. The parent waits at most the assignment's timeout for each line; a
# worker that says nothing for longer is killed, the function it was running is reported as
# timed out, and a new worker goes on from the next thing to check. Where no second Python can
# be started, everything runs in this process, without a time limit, and the output says so.

WATCH = None             # in a worker: the callable that sends a line to the parent
_LAST_BEAT = [0.0]
STARTUP_SECONDS = 60.0   # a worker's Python and NumPy start within this (before the timeout counts)


def _beat():
    """A long check (finite differences) is alive: tell the parent, at most twice a second."""
    if WATCH is not None and time.monotonic() - _LAST_BEAT[0] > 0.5:
        _LAST_BEAT[0] = time.monotonic()
        WATCH({"beat": 1})


def _read_data(data_dir):
    """(check_data.json's content, its arrays by key)."""
    try:
        with open(os.path.join(data_dir, "check_data.json"), encoding="utf-8") as f:
            data = json.load(f)
        with np.load(os.path.join(data_dir, "check_data.npz"), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read check_data.json / check_data.npz in {data_dir!r}: {exc}") from None
    for item in data.get("items", []):           # the near misses' sentences, shared by the cases
        item["sentences"] = data.get("near_sentences", [])
    return data, arrays


def _check_item(module, problems, item, arrays, start=0, skip=(), report=None):
    if module is None:
        results = Verdicts(item["functions"], report)
        for k, c in enumerate(item["cases"][start:], start=start):
            results.case = k
            for f in item["functions"]:
                results.add(f, (c["label"], False, "submission not loaded", problems))
        return results
    with np.errstate(all="ignore"):
        return (check_op if item["kind"] == "op" else check_function)(
            module, item, arrays, start=start, skip=skip, report=report)


def worker(spec):
    """The worker's side: ``spec`` is JSON {homework, data, items: [index...], start: [item,
    case], skip: [function...]}; every item from ``start`` on is checked."""
    global WATCH
    job = json.loads(spec)
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)                        # what the homework prints goes to stderr, not the channel
    sys.stdout = sys.stderr

    def send(message):
        channel.write(json.dumps(message) + "\n")
        channel.flush()
    data, arrays = _read_data(job["data"])
    send({"ready": 1})
    module, problems = load_homework(job["homework"])
    send({"loaded": problems, "ok": module is not None})
    first, start = job["start"]
    for index in job["items"]:
        if index < first:
            continue
        item = data["items"][index]

        def tell(message, index=index):
            send(dict(message, item=index))
        WATCH = tell
        _check_item(module, problems, item, arrays, start if index == first else 0,
                    set(job["skip"]), report=tell)
    send({"done": 1})
    channel.close()
    return 0


def _start_worker(job):
    import subprocess
    if not sys.executable:
        raise OSError("no Python executable is known (sys.executable is empty)")
    command = [sys.executable] + (["-I"] if sys.flags.isolated else []) + \
        [os.path.abspath(__file__), "--worker", json.dumps(job)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            text=True, encoding="utf-8", errors="replace")


def _lines(proc):
    """A queue of the worker's lines (None at the end), filled by a thread: waiting on it with
    a timeout works on every platform."""
    import queue
    import threading
    q = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line)
        q.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return q


def _run_worker(job, timeout):
    """Run one worker: (messages, how it ended: "done", "timeout" or "exit N", last "at" as
    (item, function, case) or None)."""
    import queue
    proc = _start_worker(job)
    q, messages, at, wait = _lines(proc), [], None, STARTUP_SECONDS
    ended = None
    try:
        while ended is None:
            try:
                line = q.get(timeout=wait)
            except queue.Empty:
                ended = "timeout"
                break
            if line is None:
                ended = f"exit {proc.wait()}"
                break
            try:
                message = json.loads(line)
            except ValueError:
                continue
            wait = timeout
            if "at" in message:
                at = (message["item"], *message["at"])
            elif "done" in message:
                ended = "done"
            elif "ready" not in message and "beat" not in message:
                messages.append(message)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return messages, ended, at


def _timed_out(what, timeout, how):
    if how == "timeout":
        return ["timed out", [f"{what} did not finish within {timeout:g} s (the assignment's "
                              "time limit): an endless loop, or far too slow"]]
    return ["process ended", [f"{what} ended the Python process ({how.replace('exit', 'exit status')})"
                              ": sys.exit, os._exit or a crash in your code"]]


def run_items(homework, data_dir, data, indices, timeout):
    """({item index: {function: [verdict per case]}}, load problems) of the items ``indices``,
    each call of the homework's functions limited to ``timeout`` seconds."""
    items = data["items"]
    results = {i: {f: [None] * len(items[i]["cases"]) for f in items[i]["functions"]}
               for i in indices}
    problems, start, skip = [], [indices[0], 0] if indices else [0, 0], set()
    while indices and start[0] <= indices[-1]:
        job = {"homework": os.path.abspath(homework), "data": os.path.abspath(data_dir),
               "items": indices, "start": start, "skip": sorted(skip)}
        messages, ended, at = _run_worker(job, timeout)
        for m in messages:
            if "loaded" in m:
                problems = m["loaded"]
            elif "verdict" in m:
                label, ok, short, lines, *claim = m["verdict"]
                results[m["item"]][m["function"]][m["case"]] = (label, bool(ok), short, lines, *claim)
        if ended == "done":
            break
        if at is None:                       # loading the homework did not finish
            short, lines = _timed_out("loading your homework", timeout, ended)
            for i in indices:
                for f, verdicts in results[i].items():
                    for k, c in enumerate(items[i]["cases"]):
                        verdicts[k] = verdicts[k] or (c["label"], False, short, lines)
            problems = problems + lines
            break
        index, function, k = at
        cases, functions = items[index]["cases"], items[index]["functions"]
        short, lines = _timed_out(f"{function} on this case", timeout, ended)
        results[index][function][k] = (cases[k]["label"], False, short, lines)
        later = [function] + ([functions[1]] if function == functions[0] and len(functions) > 1
                              else [])
        for f in later:
            for j in range(k, len(cases)):
                results[index][f][j] = results[index][f][j] or (cases[j]["label"], False, "not run", [
                    f"not run: {function} timed out or ended the process on case "
                    f"'{cases[k]['label']}'" + (f", and {f} needs its cache" if f != function else "")])
        skip.update(later)
        if function == functions[-1] and len(functions) > 1 and k + 1 < len(cases):
            start = [index, k + 1]           # a backward: its forward goes on with the next case
        else:
            following = [i for i in indices if i > index]
            if not following:
                break
            start = [following[0], 0]
    for i in indices:
        for f, verdicts in results[i].items():
            for k, v in enumerate(verdicts):
                if v is None:
                    verdicts[k] = (items[i]["cases"][k]["label"], False, "not run", ["not run"])
    return results, problems


# --- the whole homework -----------------------------------------------------------------------

def run(homework, data_dir, only=(), timeout=None, separate=True):
    """{"functions": {name: {"passed", "cases": [...]}}, "load_problems": [...]}.

    Each op or function runs in a process of its own, each call limited to ``timeout`` seconds
    (default: the assignment's); ``separate=False``, or a Python that cannot start another,
    runs everything here without a limit. A function whose cases are all hidden has
    ``"passed": None`` and ``"hidden"``: it is graded after the due date."""
    data, arrays = _read_data(data_dir)
    timeout = float(timeout or data.get("timeout") or 10.0)
    notes, problems = [], []
    chosen = {}
    for index, item in enumerate(data["items"]):
        wanted = [f for f in item["functions"] if not only or f in only or item["name"] in only]
        if wanted:
            chosen[index] = wanted
    to_run = [i for i in chosen if data["items"][i]["cases"]]
    results = None
    if separate and to_run:
        try:
            results, problems = run_items(homework, data_dir, data, to_run, timeout)
        except OSError as exc:
            notes.append(f"no time limit: check.py could not start another Python ({exc}), "
                         "so a function that never returns makes it hang (stop it with Ctrl-C)")
    if results is None and to_run:
        module, problems = load_homework(homework)
        results = {i: _check_item(module, problems, data["items"][i], arrays) for i in to_run}
    for i in to_run:
        if data["items"][i]["kind"] == "op":
            settle_claims(data["items"][i], results[i])
    deduction = float(data.get("slip_deduction", judge.SLIP_DEDUCTION))
    functions = {}
    for index, wanted in chosen.items():
        item = data["items"][index]
        for f in wanted:
            if not item["cases"]:
                functions[f] = {"passed": None, "cases": [], "hidden": int(item.get("hidden_cases", 0))}
                continue
            cases = [_case_result(v, deduction) for v in results[index][f]]
            functions[f] = {"passed": all(c["passed"] for c in cases), "cases": cases,
                            "hidden": int(item.get("hidden_cases", 0))}
    skipped = [f"{', '.join(s['functions'])} on case '{s['label']}'" for s in data.get("skipped", [])]
    return {"assignment": data.get("assignment"), "homework": homework, "load_problems": problems,
            "functions": functions, "not_checked_here": skipped, "timeout": timeout,
            "notes": notes}


def _case_result(verdict, deduction):
    """One case's verdict as check.py reports it: each slip named with what it costs, and
    ``share``, the part of the test's points the grader gives (1, less the slip deduction, or 0)."""
    label, ok, short, lines = verdict[:4]
    slips = [line[len(SLIP):] for line in lines if line.startswith(SLIP)]
    lines = [line for line in lines if not line.startswith(SLIP)]
    share = (1.0 - deduction if slips else 1.0) if ok else 0.0
    if ok and slips:
        short = f"{short}, -{deduction:.0%}" if deduction else short
        lines = lines + [f"slip (costs {deduction:.0%} of this test's points): {s}" for s in slips]
    else:
        lines = lines + [SLIP + s for s in slips]
    return {"label": label, "passed": bool(ok), "short": short, "lines": lines, "share": share}


def table(result, details=True):
    lines = [f"checking {result['homework']} on the visible cases"]
    lines += [f"note: {n}" for n in result.get("notes", [])]
    lines += [f"while loading: {p}" for p in result["load_problems"]]
    width = max([len(f) for f in result["functions"]] + [8])
    for f, r in result["functions"].items():
        hidden = r.get("hidden", 0)
        if r["passed"] is None:
            lines.append(f"  {f:<{width}}  hidden: graded after the due date "
                         f"({hidden} hidden case{'s' if hidden != 1 else ''}, none visible)"
                         if hidden else f"  {f:<{width}}  judged by the grader only")
            continue
        n_ok = sum(c["passed"] for c in r["cases"])
        verdict = "PASS" if r["passed"] else "FAIL"
        lines.append(f"  {f:<{width}}  {verdict}  ({n_ok} of {len(r['cases'])} visible cases"
                     + (f"; {hidden} hidden, graded after the due date)" if hidden else ")"))
    if details:
        for f, r in result["functions"].items():
            groups = {}                   # the same message on several cases is said once
            for c in r["cases"]:                # failures, and passes with something to say
                if not c["passed"] or c["short"]:
                    head = c["short"] if not c["passed"] else f"PASS, {c['short']}"
                    groups.setdefault((head, "\n".join(c["lines"])), []).append(c["label"])
            for (short, body), labels in groups.items():
                where = (f"case '{labels[0]}'" if len(labels) == 1 else
                         f"{len(labels)} cases ('" + "', '".join(labels) + "')")
                lines += ["", f"{f} on {where}: {short}"]
                lines += ["  " + line for line in body.splitlines()]
    if result.get("not_checked_here"):
        lines += ["", "judged by the grader only (their inputs cannot be stored here): "
                  + "; ".join(result["not_checked_here"])]
    checked = [r for r in result["functions"].values() if r["passed"] is not None]
    passed = sum(r["passed"] for r in checked)
    only_hidden = len(result["functions"]) - len(checked)
    lines += ["", f"{passed} of {len(checked)} functions pass every visible case"
              + (f"; {only_hidden} {'is' if only_hidden == 1 else 'are'} graded after the due date "
                 "only" if only_hidden else "") + ". The grader also runs hidden cases."]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"] and len(argv) == 2:
        return worker(argv[1])
    parser = argparse.ArgumentParser(description="Check homework on the assignment's visible cases.")
    parser.add_argument("homework", help="your homework.py or homework.ipynb")
    parser.add_argument("--only", nargs="+", default=(), metavar="NAME",
                        help="check only these functions (or ops)")
    parser.add_argument("--brief", action="store_true", help="the verdicts only, without details")
    parser.add_argument("--json", metavar="FILE", help="also write the verdicts as JSON")
    parser.add_argument("--data", metavar="DIR", default=os.path.dirname(os.path.abspath(__file__)),
                        help="the folder of check_data.json (default: this script's folder)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds each call of your functions may take (default: the "
                             "assignment's, in check_data.json)")
    args = parser.parse_args(argv)
    if args.timeout is not None and not args.timeout > 0:
        print(f"check.py: error: --timeout is {args.timeout:g}; expected a number > 0", file=sys.stderr)
        return 2
    try:
        if not os.path.isfile(args.homework):
            raise UsageError(f"{args.homework!r} does not exist; expected your homework.py or .ipynb")
        result = run(args.homework, args.data, set(args.only), timeout=args.timeout)
    except UsageError as exc:
        print(f"check.py: error: {exc}", file=sys.stderr)
        return 2
    print(table(result, details=not args.brief))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.json)
    return 0 if all(r["passed"] is not False for r in result["functions"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
