"""Grading a submission against the reference: the grading process's side.

For every graded op and case, the submission's forward output is compared with the
reference's, each gradient its backward returns is compared with the reference's (under the
same random upstream gradient), and -- when the backward is wrong -- the submission's backward
is checked against finite differences of its own forward with ``check_gradients``, so the
feedback says whether the forward or the backward is at fault. The submission runs in
separate, sandboxed processes (see :mod:`.channel` and child.py); everything is judged here.

The visible cases of every item run first, in the process that loaded the submission; the
hidden cases run afterwards in a fresh one (sandbox.py isolates each), and the finite-difference
checks of failed hidden backwards after that, in a process of their own: the hidden phase's
requests never depend on a hidden verdict, and what a student sees before the due date comes
from the visible phase alone. A backward that is the gradient of the student's own wrong
forward keeps its points only where that forward is recognisably the op
(:func:`own_forward_credit`). A function that times
out or ends its process loses only its own remaining cases (and a forward its backward's,
which need its cache): the next case runs in a new process. A submission that cannot be read
or loaded still gets every test, at 0 of its points. Test points are whole hundredths that
add up to each item's weight exactly (:func:`split_points`).

Finite differences of the submission's forward would take thousands of round trips, one per
perturbed input. :class:`_StudentOp` instead recognises the checker's coordinate sweep (the
input differs from the base input in one entry, by -2h, -h, h or 2h) and asks the process
for a whole run of coordinates at once (``sweep``); the outputs are cached by the exact bytes
of the perturbed input, so the checker sees exactly the values it would have got call by call.
"""
import ast
import copy
import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction
import hashlib
import math
import os
import re
import time
import zlib

import numpy as np

from ..gradcheck import check_gradients
from ..registry import bind, known_slips
from .cases import (DEFAULTS, contract_names, input_names, items_from_config, load_config,
                    make_graded_cases, own_draw, resolve, rng_dependence)
from .channel import SPENT, ChildFailure, Submission, decode_value, encode_call
from .compare import (check_value, diagnose_values, forward_diagnoses, matching_variants,
                      nonfinite_sentence, option_variants, scaling_variants, solved_options)
from .judge import (DRAWS, FD_STEP, FULL_CHECK_ENTRIES, NOT_COUNTED, changed_in_place,
                    gradient_items, grad_name, no_gradient_reason, nontrivial, own_forward_head,
                    own_forward_lines, redraw_seeds, scaled_output, settle_claim)
from . import judge
from .notebook import SubmissionError, find_submission, read_submission
from .sandbox import DESCRIPTION, choose as choose_isolation

__all__ = ["grade", "make_plan", "Plan", "Report", "TestResult", "split_points", "POINT_DECIMALS",
           "own_forward_credit", "recognised_forward", "near_miss_candidates"]

H = FD_STEP                    # finite-difference step: check_gradients' default (five-point stencil)
_REFINED = H * 0.0625          # the checker's refinement step h/16
_MAX_CRASHES = 3               # process deaths in one function before its remaining cases are skipped
NUMERICAL_CALLS = 3            # forward calls inside one backward call that flag it for review
POINT_DECIMALS = 2             # test points are whole multiples of 0.01


def split_points(weight, shares):
    """Split ``weight`` points into parts proportional to ``shares``, each a whole multiple of
    ``10**-POINT_DECIMALS``, that sum to exactly ``weight`` (rounded to that precision).

    Every part gets the whole units below its exact value; the units left over go, one each, to
    the parts with the largest remainders (the earlier part first on a tie). So ten tests of an
    op worth 10 points get 1.00 each, and three get 3.34, 3.33 and 3.33: never 10.000002.
    """
    scale = 10 ** POINT_DECIMALS
    units = round(Fraction(weight) * scale)
    total = sum(Fraction(x) for x in shares)
    if not shares or total <= 0 or units <= 0:
        return [0.0] * len(shares)
    exact = [Fraction(x) / total * units for x in shares]
    whole = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - whole[i]), i))
    for i in order[:units - sum(whole)]:
        whole[i] += 1
    return [round(w / scale, POINT_DECIMALS) for w in whole]


# --- results -----------------------------------------------------------------------------

@dataclass
class TestResult:
    """One Gradescope test: one function on one case."""
    name: str
    number: str
    item: str
    function: str
    label: str
    hidden: bool
    max_score: float
    passed: bool = False
    short: str = "not run"
    lines: list = field(default_factory=list)
    deduction: float = 0.0          # the share of max_score a contract slip costs a passed test
    slips: list = field(default_factory=list)    # the contract slips behind the deduction
    credit: str = ""                # the credit rule that passed it, in words (or "")

    @property
    def score(self):
        return round(self.max_score * (1 - self.deduction), POINT_DECIMALS) if self.passed else 0.0

    def set(self, passed, short, lines=(), deduction=0.0, slips=(), credit=""):
        self.passed, self.short, self.lines = bool(passed), short, list(lines)
        self.deduction = deduction if passed else 0.0
        self.slips = list(slips) if passed else []
        self.credit = credit if passed else ""

    def notes(self):
        """Why a passed test has the points it has, when that is not simply "right": each
        deduction (which slip, how many points) and the credit rule applied. [] otherwise."""
        out = []
        if self.passed and self.credit:
            out.append(f"credited: {self.credit}")
        if self.passed and self.deduction:
            lost = round(self.max_score - self.score, POINT_DECIMALS)
            what = "; ".join(self.slips) or "a contract slip"
            out.append(f"-{lost:.2f} point{'' if lost == 1 else 's'} ({self.deduction:.0%} of "
                       f"{self.max_score:.2f}) for a contract slip: {what}")
        return out

    def output(self):
        head = ("PASS" + (f" ({self.short})" if self.short else "")) if self.passed \
            else f"FAIL: {self.short}"
        return "\n".join([f"{self.function} on case '{self.label}': {head}"] + self.notes()
                         + list(self.lines))


@dataclass
class Report:
    """The outcome of grading one submission."""
    submission: str
    tests: list
    seed: int
    hidden_seed: object
    elapsed: float = 0.0
    warnings: list = field(default_factory=list)
    load_error: object = None
    review: list = field(default_factory=list)   # flags for the instructor's review
    isolation: str = "none"        # how the submission's processes were isolated (sandbox.py)
    start_seconds: float = 0.0     # spent starting them (the isolation's cost)
    processes: int = 0             # how many were started
    cpu_seconds: float = 0.0       # their CPU time (channel.SPENT), known once they ended
    # The same figures for loading and the visible cases alone: what a student sees before the
    # due date depends on nothing the hidden cases did (how many processes they needed, how
    # long they took), so that no hidden verdict shows through them.
    visible_processes: int = 0
    visible_start_seconds: float = 0.0
    visible_elapsed: float = 0.0

    def _isolation_line(self, processes, seconds, what="", cpu=None):
        line = f"isolation: {DESCRIPTION[self.isolation]}"
        if processes:
            line += f"; {processes} process{'es' if processes > 1 else ''} started in {seconds:.2f} s{what}"
            if cpu is not None:
                line += f", {cpu:.2f} s of CPU time in all"
        return line

    @property
    def isolation_line(self):
        """The line of the full report (hidden cases included), with the processes' CPU time."""
        return self._isolation_line(self.processes, self.start_seconds, cpu=self.cpu_seconds)

    @property
    def visible_isolation_line(self):
        """The line students see before the due date: the visible cases' processes only."""
        if self.visible_processes == self.processes or self.hidden_seed is None:
            return self._isolation_line(self.processes, self.start_seconds)
        return self._isolation_line(self.visible_processes, self.visible_start_seconds,
                                    " for loading and the visible tests")

    @property
    def score(self):
        return round(math.fsum(t.score for t in self.tests), POINT_DECIMALS)

    @property
    def max_score(self):
        return round(math.fsum(t.max_score for t in self.tests), POINT_DECIMALS)

    def function_scores(self):
        """{function: (score, max_score)} in the order the functions were graded."""
        out = {}
        for t in self.tests:
            got, most = out.get(t.function, (0.0, 0.0))
            out[t.function] = (got + t.score, most + t.max_score)
        return {f: (round(a, POINT_DECIMALS), round(b, POINT_DECIMALS)) for f, (a, b) in out.items()}

    @property
    def passed(self):
        return bool(self.tests) and all(t.passed for t in self.tests)

    def summary(self):
        n_ok = sum(t.passed for t in self.tests)
        return (f"score {self.score:g} / {self.max_score:g} ({n_ok} of {len(self.tests)} tests "
                f"passed) in {self.elapsed:.1f} s")

    def visible_summary(self):
        """The summary a student sees before the due date: the visible tests only, with no word
        on how many hidden tests there are or how they went."""
        shown = [t for t in self.tests if not t.hidden]
        if len(shown) == len(self.tests):
            return self.summary()
        got = round(math.fsum(t.score for t in shown), POINT_DECIMALS)
        most = round(math.fsum(t.max_score for t in shown), POINT_DECIMALS)
        return (f"visible tests: {got:g} / {most:g} ({sum(t.passed for t in shown)} of "
                f"{len(shown)} passed); hidden tests are graded too and shown after the due date")

    def gradescope(self, per_case=False):
        """The Gradescope ``results.json`` content (a dict).

        One test per function (and one more for its hidden cases, visible after the due date),
        each case a line of its output with the failures' details; ``per_case`` gives one test
        per case instead. A submission that could not be read or loaded is one test, holding
        the reason once, at 0 of every point.
        """
        out = [self.visible_summary(), self.visible_isolation_line]
        if self.load_error:
            out.append(self.load_error)
        out += [f"warning: {w}" for w in self.warnings]
        if self.load_error:
            tests = [{"name": "submission", "number": "1", "score": 0.0,
                      "max_score": self.max_score, "status": "failed",
                      "output": self.load_error + "\n\nEvery test of the assignment scores 0 until "
                                "the submission loads: " + ", ".join(self.function_scores()),
                      "visibility": "visible"}]
        elif per_case:
            tests = [{"name": t.name, "number": t.number, "score": round(t.score, POINT_DECIMALS),
                      "max_score": round(t.max_score, POINT_DECIMALS),
                      "status": "passed" if t.passed else "failed", "output": t.output(),
                      "visibility": "after_due_date" if t.hidden else "visible"} for t in self.tests]
        else:
            tests = self._function_tests()
        return {
            "score": self.score,
            "max_score": self.max_score,
            # the visible phase's time: the hidden phase's would tell how hidden cases went
            "execution_time": round(self.visible_elapsed if self.hidden_seed is not None
                                    else self.elapsed, 2),
            "output": "\n".join(out),
            "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": tests,
            "extra_data": {"submission": self.submission, "seed": self.seed,
                           "hidden_cases": self.hidden_seed is not None,
                           "isolation": self.isolation, "start_seconds": round(self.start_seconds, 3),
                           "cpu_seconds": round(self.cpu_seconds, 3),
                           "review": list(self.review),
                           "processes": self.processes, "seconds": round(self.elapsed, 2)},
        }

    def _function_tests(self):
        """One Gradescope test per function and visibility, its cases listed in the output."""
        groups = {}
        for t in self.tests:
            groups.setdefault((t.function, t.hidden), []).append(t)
        tests = []
        for k, ((function, hidden), group) in enumerate(groups.items(), start=1):
            score = round(math.fsum(t.score for t in group), POINT_DECIMALS)
            most = round(math.fsum(t.max_score for t in group), POINT_DECIMALS)
            n_ok = sum(t.passed for t in group)
            lines = [f"{function}: {n_ok} of {len(group)} {'hidden ' if hidden else ''}cases passed"]
            lines += [f"  {'PASS' if t.passed else 'FAIL'}  {t.label}  ({t.score:.2f}/{t.max_score:.2f})"
                      + (f": {t.short}" if not t.passed else
                         f": {'; '.join(t.notes())}" if t.notes() else "") for t in group]
            seen = set()
            for t in group:       # failures, and passes with a deduction or a credit
                if not t.lines or (t.passed and not t.notes()):
                    continue
                body = "\n".join(t.lines)
                lines += ["", f"case '{t.label}': " + (f"PASS ({t.short})" if t.passed else t.short)]
                lines += ["  (same as above)"] if body in seen else ["  " + x for x in t.lines]
                seen.add(body)
            tests.append({"name": f"{function} [hidden: {len(group)} case{'s' if len(group) > 1 else ''}]" if hidden else function,
                          "number": str(k), "score": score, "max_score": most,
                          "status": "passed" if n_ok == len(group) else "failed",
                          "output": "\n".join(lines),
                          "visibility": "after_due_date" if hidden else "visible"})
        return tests

    def table(self, details=True):
        """A readable report for the terminal."""
        lines = [f"grading {self.submission} (seed {self.seed}"
                 + (", with hidden cases" if self.hidden_seed is not None else "") + ")"]
        lines.append(self.isolation_line)
        lines += [f"warning: {w}" for w in self.warnings]
        if self.load_error:                 # said once, with each function's points
            lines.append(self.load_error)
            lines.append("so every test scores 0:")
            lines += [f"  {f}: {a:.2f}/{b:.2f}" for f, (a, b) in self.function_scores().items()]
            lines += ["", self.summary()]
            return "\n".join(lines)
        w_fn = max([len("function")] + [len(t.function) for t in self.tests])
        w_case = min(48, max([len("case")] + [len(t.label) for t in self.tests]))
        lines.append(f"{'#':>6}  {'function':<{w_fn}}  {'case':<{w_case}}  {'points':>11}  result")
        for t in self.tests:
            label = t.label if len(t.label) <= w_case else t.label[:w_case - 3] + "..."
            pts = f"{t.score:.2f}/{t.max_score:.2f}"
            res = (f"PASS  {t.short}" if t.short else "PASS") if t.passed else f"FAIL  {t.short}"
            lines.append(f"{t.number:>6}  {t.function:<{w_fn}}  {label:<{w_case}}  {pts:>11}  {res}")
        if details:
            seen = set()
            # "not implemented" and "not defined" say all there is in the table already; a
            # passed test is detailed when a deduction or a credit changed its points
            failed = [t for t in self.tests if (t.notes() if t.passed else t.lines)
                      and not (len(t.lines) == 1 and t.short in ("not implemented", "not defined"))]
            if failed:
                lines += ["", "details of the failures, deductions and credits:"]
            for t in failed:
                body = "\n".join(t.lines)
                lines.append("")
                head = f"PASS ({t.short})" if t.passed else t.short
                lines.append(f"[{t.number}] {t.function} on case '{t.label}': {head}")
                lines += ["  " + n for n in t.notes()]
                if body in seen:
                    lines.append("  (same as above)")
                    continue
                seen.add(body)
                lines += ["  " + line for line in t.lines]
        if self.review:
            lines += ["", "for the instructor's review (not counted in the score):"]
            lines += [f"  {r}" for r in self.review]
        lines += ["", self.summary()]
        return "\n".join(lines)


# --- feedback on failed calls ---------------------------------------------------------------

def describe_error(fn, err, *, memory_mb=None, notebook=False):
    """(short, lines) for an error report of the submission process."""
    err = err if isinstance(err, dict) else {}
    kind = err.get("kind")
    if kind == "not_defined":
        return "not defined", [f"{fn} is not defined in the submission"]
    if kind == "not_implemented":
        return "not implemented", [f"not implemented: {fn} raises NotImplementedError"]
    if kind == "protocol":
        return "grader error", [f"grader error: {err.get('message', '')}"]
    if kind == "too_large":
        return "answer too large", [f"{fn}: {err.get('message', '')}"]
    etype, message = str(err.get("type", "?")), str(err.get("message", ""))
    if kind == "memory":
        limit = f" (the memory limit is {memory_mb} MiB)" if memory_mb else ""
        lines = [f"{fn} ran out of memory{limit}: MemoryError: {message}"]
        short = "out of memory"
    else:
        lines = [f"{fn} raised {etype}: {message}" if message else f"{fn} raised {etype}"]
        short = f"raised {etype}"
        if err.get("base"):
            lines.append(f"  ({etype} is not an Exception: sys.exit(), KeyboardInterrupt or a "
                         "BaseException subclass -- none of them ends the grading)")
    frames = err.get("frames")
    frames = frames if isinstance(frames, list) else []
    if frames:
        lines.append("  your code (most recent call last):")
        for frame in frames:
            try:
                filename, lineno, name, text = frame
            except (TypeError, ValueError):
                continue
            lines.append(f"    {filename}, line {lineno}, in {name}")
            if text:
                lines.append(f"      {text}")
    return short, lines


def describe_failure(fn, failure, timeout):
    """(short, lines) for a :class:`ChildFailure` while ``fn`` ran."""
    if failure.kind == "timeout":
        return "timed out", [f"timed out: {fn} did not finish within {timeout:g} s (an infinite "
                             "loop, or far too slow?); its process was killed"]
    if failure.kind == "died":
        return "process ended", [f"{fn}: {failure.message}"]
    return "malformed answer", [f"{fn}: {failure.message}"]


class StudentError(Exception):
    """A call into the submission failed or returned something unusable (for the FD check)."""

    def __init__(self, short, lines):
        super().__init__("\n".join(lines))
        self.short, self.lines = short, list(lines)


# --- the submission's op, for check_gradients ----------------------------------------------

def _digest(a):
    if a is None:
        return b"N"
    if isinstance(a, np.ndarray):
        h = hashlib.blake2b(digest_size=16)
        h.update(a.dtype.str.encode())
        h.update(repr(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
        return h.digest()
    return repr(a).encode()


class _Handle:
    """Stands for a cache kept in the submission process (or one still to be made)."""

    def __init__(self, cache_id=None, args=None):
        self.cache_id, self.args = cache_id, args


class _StudentOp:
    """The submission's forward and backward as callables for ``check_gradients``."""

    def __init__(self, grader, fwd, bwd, kwargs, deadline):
        self.grader, self.fwd, self.bwd, self.kwargs = grader, fwd, bwd, kwargs
        self.deadline = deadline
        self.base = None
        self.base_key = None
        self.memo = {}
        self.call_time = 1e-3

    def _call(self, args, keep):
        ans, arrays = self.grader.request(
            "call", self.fwd, args, self.kwargs, self.deadline, pair=True, keep=keep)
        if not ans.get("ok"):
            short, lines = self.grader.error_text(self.fwd, ans.get("error"))
            raise StudentError(short, lines)
        value = decode_value(ans.get("value"), arrays)
        if ans.get("not_pair"):
            raise StudentError("not (out, cache)", [f"{self.fwd} returned {value.describe()}; "
                                                    "expected a pair (out, cache)"])
        if not value.is_number:
            raise StudentError("unusable output", [f"{self.fwd} returned {value.describe()} as out"
                                                   + (f": {value.why}" if value.why else "")])
        self.call_time = max(float(ans.get("elapsed", 1e-3) or 1e-3), 1e-5)
        return value.array, ans.get("cache_id")

    def forward(self, *args):
        key = tuple(_digest(a) for a in args)
        if self.base is None:
            self.base = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            self.base_key = key
        if key != self.base_key:
            out = self.memo.get(key)
            if out is None and self._sweep(args, key):
                out = self.memo.get(key)
            if out is not None:
                return out.copy(), _Handle(args=args)
        out, cache_id = self._call(args, keep=key == self.base_key)
        return out, _Handle(cache_id, args)

    def backward(self, dout, cache):
        if not isinstance(cache, _Handle):
            raise StudentError("grader error", ["grader error: unknown cache"])
        if cache.cache_id is None:
            _, cache.cache_id = self._call(cache.args, keep=True)
        ans, arrays = self.grader.request("backward", self.bwd, None, None, self.deadline,
                                          cache_id=cache.cache_id, dout=dout)
        if not ans.get("ok"):
            short, lines = self.grader.error_text(self.bwd, ans.get("error"))
            raise StudentError(short, lines)
        value = decode_value(ans.get("value"), arrays)
        return _plain_gradients(value, self.bwd)

    def _sweep(self, args, key):
        """Fetch a run of single-entry perturbations like ``args`` in one request."""
        base = self.base
        if len(args) != len(base):
            return False
        changed = [p for p, (a, b) in enumerate(zip(args, base)) if _digest(a) != _digest(b)]
        if len(changed) != 1:
            return False
        p = changed[0]
        a, b = args[p], base[p]
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype == np.float64):
            return False
        where = np.flatnonzero(a.reshape(-1) != b.reshape(-1))
        if where.size != 1:
            return False
        j = int(where[0])
        x_flat = b.reshape(-1)
        value = a.reshape(-1)[j]
        step = next((s for s in (H, _REFINED) for k in (-2, -1, 1, 2) if x_flat[j] + k * s == value), None)
        if step is None:
            return False
        left = self.deadline - time.monotonic()
        budget = max(0.05, min(1.0, 0.5 * left))
        count = int(np.clip(budget / (4.0 * self.call_time), 1, 512))
        coords = list(range(j, min(x_flat.size, j + count)))
        steps = [k * step for k in (-2, -1, 1, 2)]
        values = np.array([[x_flat[c] + t for t in steps] for c in coords], dtype=np.float64)
        ans, arrays = self.grader.request("sweep", self.fwd, base, self.kwargs, self.deadline,
                                          input=p, coords=coords, values=values, budget=budget)
        n_done = int(ans.get("n_done", 0) or 0) if ans.get("ok") else 0
        outs = arrays.get("outs")
        if n_done <= 0 or not isinstance(outs, np.ndarray) or outs.dtype != np.float64 \
                or outs.shape[0] != n_done or n_done > values.size:
            return False
        digests = [_digest(x) for x in base]
        for n in range(n_done):
            i, k = divmod(n, len(steps))
            xp = b.copy()
            xp.reshape(-1)[coords[i]] = values[i, k]
            digests[p] = _digest(xp)
            self.memo[tuple(digests)] = outs[n]
        return key in self.memo


def _nontrivial(value, ref_grads):
    """Whether a backward's answer is nonzero wherever the correct gradient is (see
    :func:`.judge.nontrivial`)."""
    return nontrivial(value.items if value.kind in ("tuple", "list") else [value], ref_grads)


def _changed(fn, ans):
    """The slips of ``fn`` that changed something in place, from the submission process's
    answer: the inputs it names (``changed``), the cache and ``dout`` of a backward."""
    names = ans.get("changed")
    names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    return changed_in_place(fn, names, cache=ans.get("changed_cache") is True,
                            dout=ans.get("changed_dout") is True)


def _plain_gradients(value, fn):
    """A backward's answer as check_gradients expects it (arrays, None, tuples)."""
    def one(v):
        if v.kind == "none":
            return None
        if v.is_number:
            return v.array
        raise StudentError("unusable gradient", [f"{fn} returned {v.describe()} as a gradient"
                                                 + (f": {v.why}" if v.why else "")])
    if value.kind in ("tuple", "list"):
        return tuple(one(v) for v in value.items)
    return one(value)


# --- the own-forward credit ----------------------------------------------------------------------

@dataclass
class _Claim:
    """A backward test that failed against the reference gradient and may be the gradient of
    the student's own forward: what :meth:`_ItemGrader.settle_claims` needs to decide."""
    test: object
    gc: object
    names: list
    fwd_passed: bool
    near_miss: str                  # the forward's named near miss on this case, or ""
    nontrivial: bool                # nonzero wherever the correct gradient is
    short: str
    lines: list
    slips: list
    check_lines: list = field(default_factory=list)
    consistent: bool = False        # agrees with finite differences of the student's forward
    checked: bool = False


def own_forward_credit(item, near_miss, passed, graded):
    """Why a backward that is the gradient of the student's own forward (wrong on this case)
    keeps its points, in words; None when it does not (:func:`.judge.own_forward_credit`;
    ``near_miss``: see :func:`recognised_forward`)."""
    return judge.own_forward_credit(item.functions[0], item.name, near_miss, passed, graded)


def recognised_forward(item, gc, got, expected, names, seen_options=None):
    """The near miss of the reference op that gives the output ``got`` on case ``gc``, in
    words, or "": ``got`` equals the expected output times a constant (a scale, or a sign),
    or the reference with one named change (:mod:`.mistakes`: a known slip; a factor from the
    shapes on one input; an option left out, scaled or changed; a numeric option solved for).
    Compared at the case's tolerance. An output unrelated to the op matches none of them."""
    tol = "float32" if gc.dtype == "float32" else "float64"
    got = np.asarray(got, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if got.shape != e.shape or not got.size or not np.isfinite(got).all() or not np.isfinite(e).all():
        return ""
    scaled = scaled_output(got, e, tol)
    if scaled:
        return scaled
    found = matching_variants(got, near_miss_candidates(item, gc, names, seen_options), limit=1, tol=tol)
    if found:
        return found[0]
    solved = solved_options(got, e, item.spec.forward, args=gc.case.args, kwargs=gc.case.kwargs, tol=tol)
    return solved[0] if solved else ""


def near_miss_candidates(item, gc, names, seen_options=None):
    """The named variants of op ``item`` on case ``gc`` that :func:`recognised_forward` tries,
    as ``(sentence, thunk)`` pairs (``thunk()`` is the variant's output): the known slips of
    :mod:`.mistakes`, one input times a factor from the shapes, one option left out, scaled,
    flipped or changed. (The self-check, which holds no reference, can be given their outputs.)"""
    args, kwargs = gc.case.args, gc.case.kwargs

    def ref(*a, **kw):
        return bind(item.spec.forward, kw)(*a)
    ndim = next((a.ndim for a in args if isinstance(a, np.ndarray)), None)
    return (known_slips(item.name, ref, args, kwargs)
            + scaling_variants(ref, args, kwargs, names)
            + option_variants(ref, args, kwargs, seen_options, ndim))


def _recognised_op(args, got):
    """What a plain function's wrong output is, when it is a registered op (or close to one),
    in words: the checker's recognition by behaviour (:func:`..checking.recognise.recognise`),
    run on the case's inputs with the reference ops only; "" when no op fits."""
    from ..checking.recognise import recognise
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    if len(arrays) != len(args):
        return ""
    try:
        rec = recognise(None, args, np.asarray(got, dtype=np.float64))
    except Exception:  # noqa: BLE001 -- a diagnosis is a hint; it never fails a grade
        return ""
    if rec is None:
        return ""
    return rec.difference() if rec.close else f"your function computes {rec.describe()}"


# --- grading one item -----------------------------------------------------------------------------

class _ItemGrader:
    """Grades one item (an op or a helper) over its cases, in the submission process of the
    current phase (visible or hidden), which the items share.

    A function that times out, or whose process dies ``_MAX_CRASHES`` times, loses its remaining
    cases ("not run"), and so does a backward whose forward is lost (it needs the forward's
    cache); every other test goes on in a new process. A hanging backward therefore costs the
    backward's tests only: the forward keeps its credit.
    """

    def __init__(self, ctx, item, number, cases):
        self.ctx, self.item, self.number, self.cases = ctx, item, number, cases
        self.crashes = {}          # function -> process deaths while it ran
        self.skips = {}            # function -> why its remaining cases are not run
        self.tests = []
        self.claims = []           # backward tests that may earn the own-forward credit
        self.seen_options = {}
        if item.kind == "op":
            for gc in cases:
                for k, v in gc.case.kwargs.items():
                    if isinstance(v, str):
                        self.seen_options.setdefault(k, set()).add(v)

    # -- the process ---------------------------------------------------------------------

    @property
    def session(self):
        """The process of the current phase, shared by the items (see :func:`grade`)."""
        return self.ctx["session"]

    @session.setter
    def session(self, value):
        self.ctx["session"] = value

    def _ensure_session(self):
        if self.session is not None and self.session.alive:
            return self.session
        self.session = None
        session = Submission(self.ctx["chunks"], timeout=self.ctx["timeout"], limits=self.ctx["limits"],
                             protect=self.ctx["protect"], isolation=self.ctx["isolation"],
                             modules=self.ctx["modules"])
        self.ctx["start_seconds"].append(session.start_seconds)
        if session.load_error:
            session.close()
            short, lines = self.error_text("the submission, while loading,", session.load_error)
            raise StudentError(short, lines)
        self.session = session
        return session

    def request(self, op, fn, args, kwargs, deadline, *, dout=None, values=None, **extra):
        """One request to the submission process; ChildFailure when it does not answer. Starting
        a new process is the grader's time, not the submission's: the time limit then runs
        from the moment it is ready."""
        fresh = self.session is None or not self.session.alive
        session = self._ensure_session()
        if fresh:
            deadline = max(deadline, time.monotonic() + self.ctx["timeout"])
        arrays = {}
        meta = {"op": op, "fn": fn}
        if args is not None:
            enc_args, enc_kwargs, arrays = encode_call(args, kwargs)
            meta["args"], meta["kwargs"] = enc_args, enc_kwargs
        if dout is not None:
            arrays["dout"] = np.asarray(dout)
        if values is not None:
            arrays["values"] = values
        meta.update(extra)
        return session.request(meta, arrays, deadline, f"running {fn}")

    def error_text(self, fn, err):
        return describe_error(fn, err or {}, memory_mb=self.ctx["memory_mb"])

    def _lost(self, failure, fn, label):
        """Book-keeping after the process failed to answer while ``fn`` ran: the next request
        starts a new process; ``fn`` itself is not run again after a timeout or repeated deaths."""
        self.session = None
        if failure.kind == "timeout":
            self.skips[fn] = (f"not run: {fn} timed out on case '{label}' (limit "
                              f"{self.ctx['timeout']:g} s), so its remaining cases were skipped")
        else:
            self.crashes[fn] = self.crashes.get(fn, 0) + 1
            if self.crashes[fn] >= _MAX_CRASHES:
                self.skips[fn] = (f"not run: the submission process ended {self.crashes[fn]} times "
                                  f"while {fn} ran, so its remaining cases were skipped")

    # -- tests -------------------------------------------------------------------------------

    def make_tests(self):
        """The item's tests, case by case (forward then backward), with their points: the
        forward tests share the forward's points and the backward tests the backward's
        (:meth:`~.cases.Item.function_weights`), split by :func:`split_points` so that they add up
        to each function's weight exactly."""
        item = self.item
        points = {fn: iter(split_points(w, [1] * len(self.cases)))
                  for fn, w in item.function_weights().items()}
        groups = []
        for gc in self.cases:
            group = []
            for fn in item.functions:
                t = TestResult(name=f"{fn} [{gc.label}]", number=f"{self.number}.{len(self.tests) + 1}",
                               item=item.name, function=fn, label=gc.label, hidden=gc.hidden,
                               max_score=next(points[fn]))
                self.tests.append(t)
                group.append(t)
            groups.append(tuple(group))
        return groups

    def run(self, hidden=False):
        """Grade the visible cases (``hidden`` False) or the hidden ones, in a process of
        their own; return the item's tests."""
        item = self.item
        defined = self.ctx["defined"]
        if not self.tests:
            self.groups = self.make_tests()
        for gc, tests in zip(self.cases, self.groups):
            if gc.hidden != hidden:
                continue
            if self.ctx["load_error"]:
                for t in tests:
                    t.set(False, "submission not loaded", self.ctx["load_error"].splitlines())
                continue
            missing = [t for t in tests if t.function not in defined]
            for t in missing:
                t.set(False, "not defined", [f"{t.function} is not defined in the submission"])
            todo = []
            for t in tests:
                if t in missing:
                    continue
                if t.function in self.skips:
                    t.set(False, "not run", [self.skips[t.function]])
                elif item.kind == "op" and t.function == item.functions[1] and item.functions[0] in self.skips:
                    fwd, bwd = item.functions
                    t.set(False, "not run", [f"not run: {bwd} needs the cache of {fwd}, whose remaining "
                                             f"cases were skipped ({fwd} timed out or ended its process)"])
                else:
                    todo.append(t)
            if not todo:
                continue
            try:
                if item.kind == "op":
                    self._op_case(gc, *tests, run_backward=tests[1] in todo)
                else:
                    self._helper_case(gc, tests[0])
            except StudentError as exc:           # the submission could not be loaded again
                for t in todo:
                    t.set(False, exc.short, exc.lines)
                for fn in item.functions:
                    self.skips[fn] = "not run: " + exc.lines[0]
        if not hidden and item.kind == "op":
            self.settle_claims(False)
        return self.tests

    def _dout(self, out, gc):
        rng = np.random.default_rng([0x67726164, gc.seed, zlib.crc32(self.item.name.encode()),
                                     gc.index + 1, int(gc.hidden), 32 if gc.dtype == "float32" else 64])
        out = np.asarray(out)
        d = np.asarray(rng.standard_normal(out.shape)).astype(out.dtype)
        if out.dtype.kind == "f":
            d = np.where(np.isfinite(out), d, 0).astype(out.dtype)
        return d

    def _op_case(self, gc, fwd_t, bwd_t, run_backward=True):
        spec, item = self.item.spec, self.item
        args, kwargs = gc.case.args, gc.case.kwargs
        fwd, bwd = item.functions
        names = input_names(spec)[:len(args)]
        names += [f"input {i}" for i in range(len(names), len(args))]
        try:
            ref_out, dout, ref_grads = self._reference(gc)
        except Exception as exc:  # noqa: BLE001 -- a registry problem, not the student's
            for t in (fwd_t, bwd_t):
                t.set(False, "grader error", [f"grader error: the reference failed on this case: "
                                              f"{type(exc).__name__}: {exc}"])
            return
        defined = self.ctx["defined"]
        timeout = self.ctx["timeout"]
        deadline = time.monotonic() + timeout
        tol = gc.dtype
        cache_id, out_ok, fwd_passed, draw, near = None, False, False, None, ""

        # --- forward ---------------------------------------------------------------------
        if fwd in defined:
            try:
                ans, arrays = self.request("call", fwd, args, kwargs, deadline, pair=True, keep=True)
            except ChildFailure as f:
                fwd_t.set(False, *describe_failure(fwd, f, timeout))
                self._lost(f, fwd, gc.label)
                if bwd in defined:
                    bwd_t.set(False, "not run", [f"not run: {fwd} did not finish on this case (its cache "
                                                 f"is what {bwd} needs)"])
                return
            if not ans.get("ok"):
                fwd_t.set(False, *self.error_text(fwd, ans.get("error")))
            else:
                value = decode_value(ans.get("value"), arrays)
                if ans.get("not_pair"):
                    fwd_t.set(False, "not (out, cache)", [
                        f"{fwd} returned {value.describe()}; expected a pair (out, cache): the output "
                        f"and whatever {bwd} needs"])
                else:
                    cache_id = ans.get("cache_id")
                    draw = own_draw(item, gc, value, dout)     # random ops: the student's own mask
                    if draw is not None and draw.out is not None:
                        ref_out, ref_grads = draw.out, draw.grads
                    v = check_value(value, ref_out, "out", tol=tol)
                    out_ok = value.kind == "array" or (value.is_number and ref_out.ndim == 0)
                    lines = list(v.lines)
                    if draw is not None:
                        lines += draw.lines
                        near = draw.near_miss
                    judged = draw is not None and draw.ok and v.ok and draw.mask is not None
                    if judged or (gc.hidden and self._draw_statistics_case(gc)):
                        # A hidden case asks for the more draws whatever its verdict, so that
                        # the requests the submission sees tell it nothing of that verdict.
                        more_ok, more = self._draws_depend_on_rng(
                            gc, draw.mask if judged else None, deadline)
                        if judged:
                            draw.ok = more_ok
                            lines += more
                            draw.short = "" if draw.ok else "mask ignores rng"
                    if draw is None and not v.ok and v.short.endswith("wrong values"):
                        near = self._near_miss(gc, v, names)
                        if tol == "float64":
                            lines += [f"  diagnosis: {s}" for s in self._forward_diagnoses(gc, v, names)]
                        elif near:
                            lines.append(f"  diagnosis: {near}")
                    slips = _changed(fwd, ans) + [v.slip] * bool(v.slip)
                    fwd_passed = v.ok and (draw is None or draw.ok)
                    short = v.short or ("" if draw is None or draw.ok else draw.short)
                    self._verdict(fwd_t, fwd_passed, short, lines, slips)

        # --- backward --------------------------------------------------------------------
        if bwd not in defined or not run_backward:
            return
        if cache_id is None:
            if self._backward_not_implemented(bwd, dout, deadline, gc):
                bwd_t.set(False, "not implemented", [f"not implemented: {bwd} raises NotImplementedError"])
            elif fwd in defined:
                bwd_t.set(False, "not run", [f"not run: {fwd} did not return (out, cache) on this case, "
                                             f"and {bwd} needs that cache"])
            else:
                bwd_t.set(False, "not run", [f"not run: {fwd} is not defined, and {bwd} needs the cache "
                                             "it returns"])
            return
        deadline = time.monotonic() + timeout     # the grader's own judging is not the student's time
        try:
            ans, arrays = self.request("backward", bwd, None, None, deadline, cache_id=cache_id, dout=dout)
        except ChildFailure as f:
            bwd_t.set(False, *describe_failure(bwd, f, timeout))
            self._lost(f, bwd, gc.label)
            return
        if not ans.get("ok"):
            bwd_t.set(False, *self.error_text(bwd, ans.get("error")))
            return
        value = decode_value(ans.get("value"), arrays)
        verdicts, lines, shorts, comparable, slips = self._check_gradients(
            value, ref_grads, args, names, dout, tol,
            (bind(spec.forward, kwargs), ref_out) if draw is None else (None, None))
        slips += _changed(bwd, ans)
        calls = ans.get("forward_calls", 0)
        if isinstance(calls, int) and calls >= NUMERICAL_CALLS:
            self._review(f"{bwd} called a forward function {calls} times on case '{gc.label}': it "
                         "may differentiate numerically instead of by the chain rule")
        passed = all(verdicts) and bool(verdicts)
        short = "; ".join(dict.fromkeys(shorts))
        if not passed and comparable and out_ok and gc.case.check:
            # The CS231n way: a backward right for the student's own forward may keep its
            # points (see own_forward_credit). Visible cases are checked here; a hidden case's
            # check runs after the hidden phase, in a process of its own (grade), so that the
            # requests of the hidden phase do not depend on any hidden verdict.
            claim = _Claim(bwd_t, gc, names, fwd_passed, near, _nontrivial(value, ref_grads),
                           short, lines, slips)
            if not gc.hidden:
                claim.check_lines, claim.consistent = self._self_check(gc, names, fwd_passed, deadline)
                claim.checked = True
            self.claims.append(claim)
            lines = lines + claim.check_lines
        self._verdict(bwd_t, passed, short, lines, slips)

    def _reference(self, gc):
        """``(ref_out, dout, ref_grads)`` of an op's case: the reference's answers under the
        case's upstream gradient, computed once per plan (a class's forked workers each keep
        theirs) and copied for every submission, so that nothing one grading does reaches
        another's."""
        spec, args, kwargs = self.item.spec, gc.case.args, gc.case.kwargs
        key = ("answers", _item_key(self.item), gc.index, gc.label, gc.hidden, gc.dtype, gc.seed)
        memo = self.ctx["memo"]
        if key not in memo:
            ref_out, ref_cache = bind(spec.forward, kwargs)(*args)
            ref_out = np.asarray(ref_out)
            dout = self._dout(ref_out, gc)
            raw = spec.backward(dout.copy(), ref_cache)
            memo[key] = (ref_out, dout, list(raw) if len(args) > 1 else [raw])
        return _fresh(memo[key])

    def _verdict(self, t, passed, short, lines, slips, credit=""):
        """Set test ``t``. Right values with contract slips (an input changed in place, a
        1-tuple for a bare array, a float64 result for float32 input) pass, less the
        configured deduction; the feedback names each slip. ``credit``: the rule that passes
        a test whose values differ from the reference's, in words."""
        slips = list(dict.fromkeys(slips))
        if passed and slips:
            d = self.ctx["slip_deduction"]
            short = f"{short}; contract slip, -{d:.0%}" if short else \
                (f"contract slip, -{d:.0%}" if d else "contract slip")
            t.set(True, short, lines + [
                f"slip (costs {d:.0%} of this test's points): {s}" for s in slips], deduction=d,
                slips=slips, credit=credit)
        else:
            t.set(passed, short or ("contract slip" if slips else ""), lines + slips, credit=credit)

    # -- the own-forward credit ----------------------------------------------------------------

    def settle_claims(self, hidden):
        """Decide the own-forward credit of the phase's backward tests (see
        :func:`own_forward_credit`), once every forward verdict the rule counts is known: the
        visible cases' for a visible test (no hidden verdict reaches a visible score), every
        case's for a hidden one. Hidden claims are checked against finite differences first,
        in the process of the diagnoses (see :func:`grade`)."""
        fwd, bwd = self.item.functions
        forward_tests = [t for t in self.tests if t.function == fwd and (hidden or not t.hidden)
                         and t.short not in NOT_COUNTED]
        passed = sum(t.passed for t in forward_tests)
        for claim in [c for c in self.claims if c.gc.hidden == hidden]:
            self.claims.remove(claim)
            if not claim.checked:
                if fwd in self.skips or bwd in self.skips:
                    claim.check_lines = [f"{own_forward_head(fwd, bwd)}: not run "
                                         f"({(self.skips.get(fwd) or self.skips[bwd])[9:]})"]
                else:
                    deadline = time.monotonic() + self.ctx["timeout"]
                    try:
                        claim.check_lines, claim.consistent = self._self_check(
                            claim.gc, claim.names, claim.fwd_passed, deadline)
                    except StudentError as exc:
                        claim.check_lines = [f"{own_forward_head(fwd, bwd)}: could not run --"] + ["  " + x for x in exc.lines]
                claim.checked = True
            lines = claim.lines + claim.check_lines
            if not claim.consistent or claim.fwd_passed:
                self._verdict(claim.test, False, claim.short, lines, claim.slips)
                continue
            why = own_forward_credit(self.item, claim.near_miss, passed, len(forward_tests))
            credited, sentence = settle_claim(fwd, bwd, self.item.name, why, claim.nontrivial,
                                              passed, len(forward_tests))
            if credited:
                self._verdict(claim.test, True, "consistent with your own forward",
                              ["For reference, against the correct gradient:"] + lines,
                              claim.slips, credit=sentence)
            else:
                self._verdict(claim.test, False, claim.short, lines + [sentence], claim.slips)

    def _near_miss(self, gc, v, names):
        """The near miss that gives a wrong forward output on this case, in words, or "" (see
        :func:`recognised_forward`)."""
        if self.item.kind != "op":
            return ""
        return recognised_forward(self.item, gc, v.got, v.expected, names, self.seen_options)

    def _draw_statistics_case(self, gc):
        """Whether a case of a random op is one whose mask is drawn again from other generators
        (the larger cases, with an integer seed): decided by the case alone."""
        return bool(redraw_seeds(self.item.name, gc.case.args, gc.case.kwargs))

    def _review(self, line):
        if line not in self.ctx["review"]:
            self.ctx["review"].append(line)

    def _draws_depend_on_rng(self, gc, mask, deadline):
        """(ok, lines): more draws of this case's mask, from other generators, must differ as
        independent Bernoulli draws do (cases.rng_dependence). Only for the larger cases."""
        fwd = self.item.functions[0]
        args, kwargs = gc.case.args, gc.case.kwargs
        seeds = redraw_seeds(self.item.name, args, kwargs)
        if not seeds:
            return True, []
        reader = DRAWS[self.item.name][0]
        answers = []
        for seed in seeds:
            try:
                answers.append(self.request("call", fwd, args, dict(kwargs, rng=seed),
                                            deadline, pair=True, keep=False))
            except ChildFailure as f:
                self._lost(f, fwd, gc.label)
                return True, []
        if mask is None:
            return True, []
        masks = [mask]
        for ans, arrays in answers:
            value = decode_value(ans.get("value"), arrays) if ans.get("ok") and not ans.get("not_pair") else None
            got = getattr(value, "array", None)
            if got is None or np.shape(got) != np.shape(mask):
                return True, []
            m, _ = reader(args, kwargs, np.asarray(got, dtype=np.float64), gc.dtype)
            if m is None or isinstance(m, str):
                return True, []
            masks.append(m)
        return rng_dependence(self.item, gc, masks)

    def _backward_not_implemented(self, bwd, dout, deadline, gc):
        """Whether ``bwd`` raises NotImplementedError straight away (called with an empty cache)."""
        try:
            ans, _ = self.request("backward", bwd, None, None, deadline, cache_id=0, empty_cache=True,
                                  dout=dout)
        except ChildFailure as f:
            self._lost(f, bwd, gc.label)
            return False
        err = ans.get("error")
        return isinstance(err, dict) and err.get("kind") == "not_implemented"

    def _check_gradients(self, value, ref_grads, args, names, dout, tol, case=(None, None)):
        """Compare the gradients a backward returned with the reference's. ``case`` is the
        reference forward with the case's options bound and its output, for the diagnoses."""
        forward, ref_out = case
        bwd = self.item.functions[1]
        items, slips, short, lines = gradient_items(value, names, bwd)
        if items is None:
            return [False], lines, [short], False, slips
        verdicts, lines, shorts = [], [], []
        comparable = True
        for p, (got, exp) in enumerate(zip(items, ref_grads)):
            reason = no_gradient_reason(names[p], args[p]) if exp is None else ""
            v = check_value(got, None if exp is None else np.asarray(exp), grad_name(names[p]), tol=tol,
                            none_reason=reason)
            verdicts.append(v.ok)
            if v.slip:
                slips.append(v.slip)
            if v.ok:
                continue
            shorts.append(v.short)
            lines += v.lines
            if got.kind == "refused" or got.kind in ("tuple", "list"):
                comparable = False
            if v.short.endswith("wrong values") and tol == "float64":
                sentences = []
                bad = nonfinite_sentence(v.got, v.expected, args)
                if bad:
                    sentences.append(bad)
                sentences += diagnose_values(v.got, v.expected, dout, forward=forward, inputs=args,
                                             position=p, names=names, out=ref_out)
                lines += [f"  diagnosis: {s}" for s in sentences]
        return verdicts, lines, shorts, comparable, slips

    def _forward_diagnoses(self, gc, v, names):
        spec = self.item.spec
        args, kwargs = gc.case.args, gc.case.kwargs
        sentences = []
        bad = nonfinite_sentence(v.got, v.expected, args)
        if bad:
            sentences.append(bad)
        else:
            forward = spec.forward if self.item.kind == "op" else None
            sentences += forward_diagnoses(v.got, v.expected, forward, args, kwargs, names)
            sentences += matching_variants(
                v.got, near_miss_candidates(self.item, gc, names, self.seen_options))
        if not sentences:
            sentences.append("no simple pattern found (factor, sign, transpose, option, known slip): "
                             "compare your output with the expected one at the first mismatch")
        return sentences

    def _self_check(self, gc, names, fwd_passed, deadline):
        """Check the submission's backward against finite differences of its own forward:
        (feedback lines, whether they agree)."""
        fwd, bwd = self.item.functions
        head = own_forward_head(fwd, bwd, gc.dtype)
        args = gc.case.args
        if gc.dtype == "float32":            # finite differences need float64: the same case in it
            args = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype == np.float32
                         else a for a in args)
        proxy = _StudentOp(self, fwd, bwd, gc.case.kwargs, deadline)
        # every entry of a small case; random directions (and a few entries) of a large one,
        # whose entry-by-entry sweep would outlast the time limit
        size = sum(a.size for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f")
        mode = "directional" if size > FULL_CHECK_ENTRIES else self.item.spec.mode
        try:
            with np.errstate(all="ignore"):
                res = check_gradients(proxy.forward, proxy.backward, args, h=H, seed=gc.index,
                                      mode=mode, names=names)
        except StudentError as exc:
            return [f"{head}: could not run --"] + ["  " + line for line in exc.lines], False
        except ChildFailure as f:
            self.session = None
            return [f"{head}: could not finish -- {f.message}"], False
        except Exception as exc:  # noqa: BLE001 -- e.g. the output changed shape when perturbed
            return [f"{head}: could not run -- {type(exc).__name__}: {exc}"], False
        report = [line for line in str(res).splitlines() if not line.startswith("reproduce:")]
        return own_forward_lines(fwd, bwd, res.passed, fwd_passed, report, gc.dtype), res.passed

    # -- plain functions -------------------------------------------------------------------------

    def _helper_case(self, gc, t):
        spec = self.item.spec
        fn = self.item.functions[0]
        args, kwargs = gc.case.args, gc.case.kwargs
        try:
            expected = np.asarray(spec.reference(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001
            t.set(False, "grader error", [f"grader error: the reference failed on this case: "
                                          f"{type(exc).__name__}: {exc}"])
            return
        deadline = time.monotonic() + self.ctx["timeout"]
        try:
            ans, arrays = self.request("call", fn, args, kwargs, deadline, pair=False, keep=False)
        except ChildFailure as f:
            t.set(False, *describe_failure(fn, f, self.ctx["timeout"]))
            self._lost(f, fn, gc.label)
            return
        if not ans.get("ok"):
            t.set(False, *self.error_text(fn, ans.get("error")))
            return
        value = decode_value(ans.get("value"), arrays)
        v = check_value(value, expected, "result", tol="float64")
        lines = list(v.lines)
        if not v.ok and v.short.endswith("wrong values") and expected.dtype.kind == "f":
            bad = nonfinite_sentence(v.got, v.expected, args)
            sentences = [bad] if bad else diagnose_values(v.got, v.expected)
            if not bad:
                names = input_names(spec)[:len(args)]
                names += [f"input {i}" for i in range(len(names), len(args))]

                def ref(*a, **kw):
                    return (spec.reference(*a, **kw),)
                sentences += matching_variants(
                    v.got, scaling_variants(ref, args, kwargs, names) + option_variants(ref, args, kwargs))
                recognised = _recognised_op(args, v.got)
                if recognised:
                    sentences.insert(0, recognised)
            lines += [f"  diagnosis: {s}" for s in sentences]
        slips = _changed(fn, ans) + [v.slip] * bool(v.slip)
        self._verdict(t, v.ok, v.short, lines, slips)


# --- the whole submission -----------------------------------------------------------------------

def _settings(config, seed, hidden_seed, timeout, memory_mb):
    s = dict(DEFAULTS)
    for key in DEFAULTS:
        if key in config:
            s[key] = config[key]
    for key, value in (("seed", seed), ("hidden_seed", hidden_seed), ("timeout", timeout),
                       ("memory_mb", memory_mb)):
        if value is not None:
            s[key] = value
    if not isinstance(s["seed"], int) or isinstance(s["seed"], bool) or s["seed"] < 0:
        raise ValueError(f"seed is {s['seed']!r}; expected a non-negative integer")
    if s["hidden_seed"] is not None and (not isinstance(s["hidden_seed"], int) or s["hidden_seed"] < 0):
        raise ValueError(f"hidden_seed is {s['hidden_seed']!r}; expected a non-negative integer or null")
    if not (isinstance(s["timeout"], (int, float)) and s["timeout"] > 0):
        raise ValueError(f"timeout is {s['timeout']!r}; expected a positive number of seconds")
    if not (isinstance(s["memory_mb"], int) and s["memory_mb"] >= 256):
        raise ValueError(f"memory_mb is {s['memory_mb']!r}; expected an integer >= 256")
    d = s["slip_deduction"]
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1:
        raise ValueError(f"slip_deduction is {d!r}; expected a number from 0 to 1 (the share of a "
                         "test's points a contract slip costs)")
    return s


@dataclass
class Plan:
    """What a grading run grades, fixed once for a submission or a whole class.

    config: the grading configuration (a dict); settings: seed, hidden_seed, timeout,
    memory_mb, float32_case; items: the :class:`~.cases.Item` list, or None when the
    submission decides (the contract functions it defines); protect: the (path, why) pairs
    every submission process keeps out of reach (see child.py).
    """
    config: dict
    settings: dict
    items: object
    protect: tuple = ()
    # what every submission's grading computes alike (the graded cases, the reference's
    # answers), computed once and copied for each (see graded_cases, _ItemGrader._reference)
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    def warm(self):
        """Draw the graded cases and compute the reference's answers now: a class does it before
        its workers fork, so that they share them."""
        for item in self.items or ():
            cases = self.graded_cases(item)
            if item.kind == "op":
                grader = _ItemGrader({"memo": self.memo}, item, 0, cases)
                for gc in cases:
                    try:
                        grader._reference(gc)
                    except Exception:  # noqa: BLE001 -- reported when the case is graded
                        pass

    def graded_cases(self, item):
        """The graded cases of ``item`` under this plan's seeds: drawn once, a fresh copy each
        call."""
        key = ("cases", _item_key(item))
        if key not in self.memo:
            s = self.settings
            self.memo[key] = make_graded_cases(item, seed=s["seed"], hidden_seed=s["hidden_seed"],
                                               float32_case=bool(s["float32_case"]))
        return [dataclasses.replace(gc, case=dataclasses.replace(
                    gc.case, args=_fresh(gc.case.args), kwargs=_fresh(gc.case.kwargs)),
                    extra=_fresh(gc.extra)) for gc in self.memo[key]]

    def fingerprint(self):
        """A digest of everything that decides the grades (seeds, cases, weights, limits)."""
        from .. import __version__
        h = hashlib.sha256()
        items = None if self.items is None else [
            [i.name, i.kind, list(i.functions), i.function_weights(), i.cases,
             list(getattr(i, "drop", ())), i.hidden]
            for i in self.items]
        h.update(repr((__version__, sorted(self.settings.items()), items)).encode())
        return h.hexdigest()


def _fresh(value):
    """A copy of ``value`` with every array (and random generator) in its lists, tuples and
    dicts copied; other objects are shared."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, np.random.Generator):
        return copy.deepcopy(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    return value


def _item_key(item):
    """What decides an item's cases and answers under a plan."""
    return repr((item.name, item.kind, item.cases, tuple(item.drop), item.hidden))


def reference_paths():
    """The folders of the reference: this package (its source and whatever sits in it)."""
    return [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]


def make_plan(*, only=None, config=None, seed=None, hidden_seed=None, timeout=None, memory_mb=None,
              protect=()):
    """The :class:`Plan` of a grading run; ValueError (or OSError for an unreadable config file)
    on bad settings. ``protect``: more (path, why) pairs to keep from the submissions."""
    cfg = load_config(config)
    settings = _settings(cfg, seed, hidden_seed, timeout, memory_mb)
    configured = {item.name: item for item in items_from_config(cfg)}
    if only:
        items, seen = [], set()
        for name in only:
            item = resolve(name)
            if item.name not in seen:
                seen.add(item.name)
                items.append(configured.get(item.name, item))   # the config's weight and cases
    elif configured:
        items = list(configured.values())
    else:
        items = None
    guarded = [(p, "the reference implementation (numpytfmr)") for p in reference_paths()]
    if isinstance(config, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(config))
        guarded += [(path, "the grading configuration"),
                    (os.path.dirname(path), "the grading configuration's folder")]
    guarded += [(os.path.abspath(os.fspath(p)), str(why)) for p, why in protect]
    return Plan(config=cfg, settings=settings, items=items, protect=tuple(guarded))


def _names_in_source(chunks):
    """Names a submission defines, read from its source without running it: top-level
    ``def``s, assignments and ``from ... import`` names (a ``def`` pattern if it does not parse)."""
    names = set()
    for chunk in chunks or []:
        source = chunk.get("source", "") if isinstance(chunk, dict) else ""
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            names.update(re.findall(r"^[ \t]*def[ \t]+([A-Za-z_]\w*)[ \t]*\(", source, re.M))
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.ImportFrom):
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _items_defined(names):
    known = contract_names()
    order = {name: i for i, name in enumerate(known)}
    found = sorted({known[n] for n in names if n in known},
                   key=lambda n: order.get(f"{n}_forward", order.get(n, 0)))
    return [resolve(n) for n in found]


def grade(submission, *, only=None, config=None, seed=None, hidden_seed=None, timeout=None,
          memory_mb=None, log=None, protect=(), isolation=None, plan=None):
    """Grade a submission (.py, .ipynb or a folder holding one); return a :class:`Report`.

    only:   names to grade (ops like "softmax", functions like "softmax_forward" or
            "causal_mask"); default: the config's functions, else every function of the
            contract the submission defines
    config: a grading configuration (path or dict, see :mod:`.cases`)
    seed / hidden_seed / timeout (seconds per case) / memory_mb override the config.
    log:    a callable taking progress lines, or None
    protect: more (path, why) pairs the submission's process may not read (e.g. the other
            submissions of a class); the reference and the config's folder always are
    isolation: a :class:`~.sandbox.Isolation` for the submission's processes (default: the
            strongest this machine offers, see sandbox.py)
    plan:   a :class:`Plan` from :func:`make_plan` instead of only/config/seeds/limits/protect

    A submission that cannot be read or loaded still gets every test, at 0 of its points, with
    the reason as the message: the graded functions are the config's (or ``only``), else those
    its source defines.
    """
    start, spent = time.monotonic(), SPENT["processes"]
    if plan is None:
        plan = make_plan(only=only, config=config, seed=seed, hidden_seed=hidden_seed,
                         timeout=timeout, memory_mb=memory_mb, protect=protect)
    cfg, s, items = plan.config, plan.settings, plan.items

    label = str(submission)
    chunks, load_error, defined, warnings = None, None, set(), []
    try:
        path = find_submission(submission, cfg.get("assignment"))
        label = path
        chunks = read_submission(path)
    except SubmissionError as exc:
        load_error = f"the submission could not be read: {exc}"
    # CPU seconds of one process (it serves one item); the wall-clock limit per case is the
    # real bound, this one catches what escapes it (e.g. threads).
    limits = {"cpu_seconds": int(float(s["timeout"]) * 40) + 5,
              "memory_bytes": int(s["memory_mb"]) << 20, "file_bytes": 16 << 20}
    isolation = isolation or choose_isolation()
    modules = ("numpy",) + tuple(m for m in cfg.get("allow_modules", ()) if m != "numpy")
    probe, start_seconds = None, []
    if chunks is not None:
        try:
            probe = Submission(chunks, timeout=float(s["timeout"]), limits=limits,
                               protect=plan.protect, isolation=isolation, modules=modules)
            start_seconds.append(probe.start_seconds)
            defined = set(probe.defined)
            warnings = [_cell_warning(w) for w in probe.warnings]
            if probe.load_error:
                short, lines = describe_error("the submission, while loading,", probe.load_error,
                                              memory_mb=s["memory_mb"])
                load_error = "\n".join(["the submission could not be loaded:"] + lines)
                probe.close()
                probe = None
        except ChildFailure as f:
            if f.kind == "timeout":
                load_error = (f"the submission could not be loaded: it did not finish loading within "
                              f"{s['timeout']:g} s (an infinite loop or long computation at import?); "
                              "its process was killed")
            else:
                load_error = f"the submission could not be loaded: {f.message}"
    if items is None:
        items = _items_defined(defined if load_error is None else _names_in_source(chunks))

    tests = []
    if not items:
        t = TestResult(name="submission", number="1", item="", function="submission", label="-",
                       hidden=False, max_score=0.0)
        t.set(False, "nothing to grade", [load_error or
                                          "no function of the contract was found in the submission "
                                          "(name them as in the assignment, e.g. softmax_forward)"])
        tests.append(t)
    ctx = {"chunks": chunks, "defined": defined, "timeout": float(s["timeout"]), "limits": limits,
           "memory_mb": s["memory_mb"], "load_error": load_error, "session": probe,
           "protect": plan.protect, "isolation": isolation, "start_seconds": start_seconds,
           "slip_deduction": float(s["slip_deduction"]), "review": [], "modules": modules,
           "memo": plan.memo}
    graders = [_ItemGrader(ctx, item, k, plan.graded_cases(item))
               for k, item in enumerate(items, start=1)]
    visible = None
    try:
        # Every visible case first, in the process that loaded the submission; then the hidden
        # ones in a fresh process, so no process that saw a hidden input answers a visible
        # test. Within a phase the items share the process; a new one starts after any failure.
        # Then the diagnoses of hidden backwards (finite differences of the student's own
        # forward, for the own-forward credit) in a process of their own: the hidden phase's
        # requests are the same whatever its verdicts, and nothing a student sees before the
        # due date (the visible tests, the figures of the visible phase) depends on either.
        for hidden in (False, True):
            for grader in graders:
                grader.run(hidden)
            if ctx["session"] is not None:
                ctx["session"].close()
                ctx["session"] = None
            if not hidden:
                visible = (len(start_seconds), math.fsum(start_seconds), time.monotonic() - start)
        for grader in graders:
            if grader.item.kind == "op":
                grader.settle_claims(True)
    finally:
        if ctx["session"] is not None:
            ctx["session"].close()
    for grader in graders:
        tests += grader.tests
        if log is not None:
            ok = sum(t.passed for t in grader.tests)
            log(f"{grader.item.name}: {ok} of {len(grader.tests)} tests passed")
    return Report(submission=label, tests=tests, seed=s["seed"], hidden_seed=s["hidden_seed"],
                  elapsed=time.monotonic() - start, warnings=warnings, load_error=load_error,
                  review=ctx["review"], isolation=isolation.mode, start_seconds=math.fsum(start_seconds),
                  processes=len(start_seconds), cpu_seconds=SPENT["processes"] - spent,
                  visible_processes=visible[0],
                  visible_start_seconds=visible[1], visible_elapsed=visible[2])


def _cell_warning(w):
    if not isinstance(w, dict):
        return str(w)
    short, lines = describe_error(str(w.get("where", "a cell")), w)
    return " ".join(line.strip() for line in lines[:1]) + " (the next cells still ran)"
