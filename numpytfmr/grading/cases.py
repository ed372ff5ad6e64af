"""What is graded: items (an op's forward/backward pair, or a plain function), their cases,
and the grading configuration.

Ops come from the op registry (``numpytfmr/registry``): their cases are the registry's, made
by ``make_cases(np.random.default_rng(seed), np.float64)``, plus one float32 case that checks
dtypes. Plain functions of the contract (``causal_mask``, ``split_heads``, ...) have their
cases in :func:`helpers` below. Hidden cases are the same makers at a second seed that
students do not see.

A grading configuration (``grading.json``, written by ``numpytfmr make-assignment``)::

    {"assignment": "homework", "seed": 0, "hidden_seed": 918273, "timeout": 10,
     "memory_mb": 2048, "float32_case": true,
     "functions": [{"name": "softmax", "weight": 10, "cases": "all"}, ...]}

``cases`` is "all" or a list of case numbers (0-based, in the registry's order, followed by
the grading-only cases of :data:`EXTRA_CASES`) or labels. ``drop`` (optional) lists options
the instructor left out of the assignment (``make-assignment --drop lora_linear:dropout``):
the skeleton omits them and every case that uses one of them is skipped; a case that passes
a dropped option at its default value is kept, without that option.

Random ops (dropout, LoRA with dropout) are graded against the submission's own draw: see
:func:`own_draw`.
"""
from dataclasses import dataclass, field
import json
import math
import os

import numpy as np

from ..registry import Case, registry
from .judge import DRAWS, SLIP_DEDUCTION, drop_probability, mask_statistics, read_draw
from .judge import rng_dependence as judge_rng_dependence

__all__ = ["Item", "GradedCase", "helpers", "resolve", "contract_names", "load_config",
           "DEFAULTS", "make_graded_cases", "input_names", "droppable_options", "EXTRA_CASES",
           "all_cases", "DrawCheck", "own_draw"]

FORWARD_SHARE = 0.4         # of an op's weight, when the instructor does not split it
DEFAULTS = {"seed": 0, "hidden_seed": None, "timeout": 10.0, "memory_mb": 2048,
            "float32_case": True, "weight": 10.0,
            "slip_deduction": SLIP_DEDUCTION}


@dataclass(frozen=True)
class Helper:
    """A plain function of the contract: its reference and a maker of cases (rng -> [Case])."""
    name: str
    reference: object
    make_cases: object
    exact: bool = False      # compare exactly (bool/int results)
    omit: tuple = ()         # options no skeleton shows (the grader never passes them)


@dataclass
class Item:
    """One graded name: an op (``functions = (name_forward, name_backward)``) or a helper."""
    name: str
    kind: str                       # "op" or "function"
    functions: tuple
    spec: object                    # OpSpec or Helper
    weight: float = DEFAULTS["weight"]
    cases: object = "all"
    drop: tuple = ()                # options left out of the assignment (with their dependents)
    weights: dict = None            # {function: points}: the pair's split, when not the default
    hidden: object = "auto"         # which cases are hidden: see hidden_indices

    def function_weights(self):
        """Points of each function: an op's forward gets FORWARD_SHARE of the item's weight and
        its backward the rest, unless ``weights`` names them."""
        if self.kind != "op":
            return {self.functions[0]: self.weight}
        if self.weights:
            return {fn: float(self.weights[fn]) for fn in self.functions}
        fwd, bwd = self.functions
        return {fwd: FORWARD_SHARE * self.weight, bwd: (1 - FORWARD_SHARE) * self.weight}


@dataclass
class GradedCase:
    index: int                      # position in the maker's list (-1 for the float32 case)
    case: Case
    label: str
    hidden: bool = False
    dtype: str = "float64"
    seed: int = 0
    extra: dict = field(default_factory=dict)


# --- plain functions --------------------------------------------------------------------

def _causal_cases(rng):
    return [Case((4,), {}, "n_q = 4"), Case((3, 5), {}, "n_q = 3, n_k = 5 (a cached step)"),
            Case((1, 6), {}, "one query, 6 keys"), Case((7,), {}, "n_q = 7")]


def _padding_cases(rng):
    return [Case((np.array([3, 1, 4]), 4), {}, "lengths (3,), n_k = 4"),
            Case((np.array([[2, 5], [0, 1]]), 5), {}, "lengths (2, 2), a zero length")]


def _split_cases(rng):
    return [Case((rng.standard_normal((2, 5, 12)), 3), {}, "x (2, 5, 12), 3 heads"),
            Case((rng.standard_normal((5, 6)), 2), {}, "x (5, 6), 2 heads"),
            Case((rng.standard_normal((2, 2, 3, 8)), 4), {}, "x (2, 2, 3, 8), 4 heads")]


def _merge_cases(rng):
    return [Case((rng.standard_normal((2, 3, 5, 4)),), {}, "x (2, 3, 5, 4)"),
            Case((rng.standard_normal((3, 2, 6)),), {}, "x (3, 2, 6)"),
            Case((rng.standard_normal((1, 2, 4, 3, 5)),), {}, "x (1, 2, 4, 3, 5)")]


def _sinusoidal_cases(rng):
    return [Case((6, 8), {}, "6 positions, d_model 8"),
            Case((5, 6), {"base": 100.0}, "5 positions, d_model 6, base 100"),
            Case((1, 4), {}, "one position")]


def _lora_merge_cases(rng):
    def m(*shape):
        return rng.standard_normal(shape)
    return [Case((m(7, 5), m(7, 3), m(3, 5)), {"alpha": 6.0}, "W (7, 5), r 3, alpha 6"),
            Case((m(4, 6), m(4, 1), m(1, 6)), {"alpha": 2.0}, "r 1"),
            Case((m(5, 5), m(5, 4), m(4, 5)), {"alpha": 8.0, "rank_stabilized": True}, "rsLoRA, r 4")]


def _alibi_cases(rng):
    return [Case((8,), {}, "8 heads"), Case((6,), {}, "6 heads (not a power of two)"),
            Case((1,), {}, "one head")]


def _rel_error_cases(rng):
    a = rng.standard_normal((3, 4))
    return [Case((a, a + 1e-3 * rng.standard_normal((3, 4))), {}, "close arrays"),
            Case((np.zeros(3), np.zeros(3)), {}, "both zero"),
            Case((np.array([1.0, -2.0]), np.array([1.5, 2.0])), {}, "opposite signs")]


def _helpers():
    import numpytfmr as nt
    table = [
        Helper("causal_mask", nt.causal_mask, _causal_cases, exact=True),
        Helper("padding_mask", nt.padding_mask, _padding_cases, exact=True),
        Helper("split_heads", nt.split_heads, _split_cases),
        Helper("merge_heads", nt.merge_heads, _merge_cases),
        Helper("sinusoidal_encoding", nt.sinusoidal_encoding, _sinusoidal_cases, omit=("dtype",)),
        Helper("lora_merge", nt.lora_merge, _lora_merge_cases),
        Helper("alibi_slopes", nt.alibi_slopes, _alibi_cases),
        Helper("rel_error", nt.rel_error, _rel_error_cases),
    ]
    return {h.name: h for h in table}


_HELPERS = None


def helpers():
    """The plain functions that can be graded: name -> :class:`Helper`."""
    global _HELPERS
    if _HELPERS is None:
        _HELPERS = _helpers()
    return _HELPERS



# --- names ----------------------------------------------------------------------------------

def contract_names():
    """Every gradable function name -> the item name it belongs to."""
    names = {}
    for op in registry():
        names[f"{op}_forward"] = op
        names[f"{op}_backward"] = op
    for h in helpers():
        names[h] = h
    return names


def resolve(name, weight=None, cases="all", drop=(), weights=None, hidden="auto"):
    """The :class:`Item` for ``name``: an op name, one of its two functions, or a helper.

    drop: options to leave out (see :func:`droppable_options`); the options that only make
    sense with a dropped one (LoRA's ``rng`` and ``train`` with ``dropout``) go with it.
    weights: {function: points} for one or both functions of an op; a function it does not
    name keeps its default share of ``weight``. The item's weight is then their sum.
    hidden: which cases are graded as hidden (see :func:`hidden_indices`).
    """
    ops = registry()
    base = name
    for suffix in ("_forward", "_backward"):
        if name.endswith(suffix) and name[: -len(suffix)] in ops:
            base = name[: -len(suffix)]
    weight = DEFAULTS["weight"] if weight is None else float(weight)
    if base in ops:
        item = Item(base, "op", (f"{base}_forward", f"{base}_backward"), ops[base], weight, cases)
    elif base in helpers():
        item = Item(base, "function", (base,), helpers()[base], weight, cases)
    else:
        known = ", ".join(list(ops) + list(helpers()))
        raise ValueError(f"unknown function {name!r}; gradable names are the ops ({known}), their "
                         "_forward/_backward functions, and the helpers")
    item.drop = _expand_drop(item, drop)
    item.hidden = hidden
    if weights:
        unknown = set(weights) - set(item.functions)
        if unknown or item.kind != "op":
            raise ValueError(f"weights of {', '.join(sorted(unknown or weights))} given for "
                             f"{item.name}, whose functions are {', '.join(item.functions)}")
        for fn, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ValueError(f"the weight of {fn} is {w!r}; expected a number >= 0")
        split = item.function_weights()
        item.weights = {fn: float(weights.get(fn, split[fn])) for fn in item.functions}
        item.weight = round(sum(item.weights.values()), 6)
    return item


def _reference(item):
    return item.spec.forward if item.kind == "op" else item.spec.reference


def droppable_options(item):
    """The options of ``item`` an instructor may leave out: name -> default value.

    Keyword options with a default, and the trailing positional inputs that default to None
    (LoRA's bias ``b``, the four biases of ``mha``). Options no skeleton shows (never graded)
    are not listed.
    """
    import inspect
    params = list(inspect.signature(_reference(item)).parameters.values())
    omit = set(item.spec.omit)
    out = {}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for p in reversed(positional):                 # the trailing run of inputs defaulting to None
        if p.default is not None:
            break
        out[p.name] = None
    out = dict(reversed(list(out.items())))
    for p in params:
        if p.kind == p.KEYWORD_ONLY and p.default is not p.empty and p.name not in omit:
            out[p.name] = p.default
    return out


def _expand_drop(item, drop):
    """The options left out of ``item``: the given ones, their dependents and the omitted ones."""
    import inspect
    depends = dict(getattr(item.spec, "depends", ()))
    if isinstance(drop, str):
        drop = [drop]
    drop = list(drop or ())
    allowed = droppable_options(item)
    out = []
    for name in drop:
        if not isinstance(name, str) or name not in allowed:
            choices = ", ".join(allowed) or "none"
            raise ValueError(f"{item.name}: cannot drop {name!r}; the options that can be dropped "
                             f"are: {choices}")
        for n in (name,) + tuple(depends.get(name, ())):
            if n not in out:
                out.append(n)
    positional = [p.name for p in inspect.signature(_reference(item)).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    dropped_pos = [n for n in positional if n in out]
    if dropped_pos:
        tail = positional[positional.index(dropped_pos[0]):]
        missing = [n for n in tail if n not in out]
        if missing:
            raise ValueError(f"{item.name}: dropping {dropped_pos[0]!r} also needs the inputs "
                             f"after it dropped ({', '.join(missing)}): only trailing inputs "
                             "can be left out")
    return tuple(out) + tuple(n for n in item.spec.omit if n not in out)


def _same_value(value, default):
    if isinstance(value, np.ndarray) or isinstance(default, np.ndarray):
        return False
    if value is None or default is None:
        return value is default
    try:
        return bool(value == default) and isinstance(value, str) == isinstance(default, str)
    except Exception:  # noqa: BLE001 -- incomparable values are different
        return False


def _without(case, item):
    """``case`` with the dropped options of ``item`` removed, or None when it needs one."""
    if not item.drop:
        return case
    import inspect
    params = inspect.signature(_reference(item)).parameters
    positional = [n for n, p in params.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    args, kwargs = list(case.args), dict(case.kwargs)
    for name in item.drop:
        if name in kwargs:
            if not _same_value(kwargs[name], params[name].default):
                return None
            del kwargs[name]
        elif name in positional:
            i = positional.index(name)
            if i < len(args):
                if args[i] is not None:
                    return None
    keep = len(args)
    while keep and positional[keep - 1] in item.drop:
        keep -= 1
    return Case(tuple(args[:keep]), kwargs, case.label, case.check)


def input_names(spec):
    """Names of the positional parameters of an op's reference forward."""
    import inspect
    fn = spec.forward if hasattr(spec, "forward") else spec.reference
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


# --- configuration ----------------------------------------------------------------------------

def load_config(source):
    """A grading configuration from a path, a dict or None; unknown keys are refused."""
    if source is None:
        return {}
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as f:
            try:
                source = json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f"grading config {os.fspath(source)!r}: invalid JSON ({exc.msg}, "
                                 f"line {exc.lineno})") from None
    if not isinstance(source, dict):
        raise ValueError("grading config: expected a JSON object")
    allowed = {"assignment", "seed", "hidden_seed", "timeout", "memory_mb", "float32_case",
               "functions", "names", "submission", "allow_modules", "late", "gradescope_tests",
               "slip_deduction"}
    unknown = set(source) - allowed
    if unknown:
        raise ValueError(f"grading config: unknown key(s) {', '.join(sorted(unknown))}; expected "
                         f"some of {', '.join(sorted(allowed))}")
    _check_course_keys(source)
    functions = source.get("functions", [])
    if not isinstance(functions, list):
        raise ValueError("grading config: 'functions' must be a list")
    for f in functions:
        if isinstance(f, str):
            continue
        if not isinstance(f, dict) or "name" not in f:
            raise ValueError(f"grading config: each entry of 'functions' is a name or an object "
                             f"with a 'name'; got {f!r}")
        drop = f.get("drop", [])
        if not isinstance(drop, list) or not all(isinstance(d, str) for d in drop):
            raise ValueError(f"grading config: 'drop' of {f['name']!r} is {drop!r}; expected a "
                             "list of option names")
        weight = f.get("weight", DEFAULTS["weight"])
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight < 0:
            raise ValueError(f"grading config: weight of {f['name']!r} is {weight!r}; expected a "
                             "number >= 0")
    return dict(source)


def _check_course_keys(config):
    """The keys of a course's logistics: the submitted file's name, the modules allowed besides
    NumPy and the standard library, the late policy and the Gradescope test layout."""
    from .course import late_policy
    sub = config.get("submission")
    if sub is not None and (not isinstance(sub, str) or not sub.strip() or "/" in sub
                            or not sub.endswith((".py", ".ipynb"))):
        raise ValueError(f"grading config: 'submission' is {sub!r}; expected a file name ending "
                         "in .py or .ipynb, e.g. \"homework.py\"")
    mods = config.get("allow_modules", [])
    if not isinstance(mods, list) or not all(isinstance(m, str) and m.replace("_", "a").isalnum()
                                             and not m[:1].isdigit() for m in mods):
        raise ValueError(f"grading config: 'allow_modules' is {mods!r}; expected a list of "
                         "top-level module names, e.g. [\"scipy\"]")
    if config.get("late") is not None:
        late_policy(config["late"])
    tests = config.get("gradescope_tests", "function")
    if tests not in ("function", "case"):
        raise ValueError(f"grading config: 'gradescope_tests' is {tests!r}; expected \"function\" "
                         "(one Gradescope test per function) or \"case\" (one per case)")


def items_from_config(config):
    items = []
    for f in config.get("functions", []):
        if isinstance(f, str):
            items.append(resolve(f))
        else:
            items.append(resolve(f["name"], f.get("weight"), f.get("cases", "all"),
                                 f.get("drop", ()), f.get("weights"), f.get("hidden", "auto")))
    return items


def _select(cases, wanted, item):
    """(index, case) pairs of the wanted cases, without the ones that need a dropped option."""
    if wanted in (None, "all"):
        chosen = list(enumerate(cases))
    elif not isinstance(wanted, list):
        raise ValueError(f"grading config: 'cases' of {item.name!r} must be \"all\" or a list")
    else:
        chosen = []
        labels = {c.label: i for i, c in enumerate(cases)}
        for w in wanted:
            if isinstance(w, int) and not isinstance(w, bool) and 0 <= w < len(cases):
                chosen.append((w, cases[w]))
            elif isinstance(w, str) and w in labels:
                chosen.append((labels[w], cases[labels[w]]))
            else:
                raise ValueError(f"grading config: {item.name!r} has no case {w!r}; its cases are "
                                 + "; ".join(f"{i}: {c.label}" for i, c in enumerate(cases)))
    out = []
    for i, case in chosen:
        kept = _without(case, item)
        if kept is not None:
            out.append((i, kept))
        elif wanted not in (None, "all"):
            raise ValueError(f"grading config: case {i} of {item.name!r} ({case.label}) uses an "
                             f"option the assignment drops ({', '.join(item.drop)})")
    return out


def all_cases(item, rng, dtype=np.float64):
    """Every case of ``item``: the registry's (or the helper's), then the grading-only ones."""
    if item.kind == "op":
        cases = list(item.spec.make_cases(rng, dtype))
        if item.spec.extra_cases is not None:
            cases += item.spec.extra_cases(rng, dtype)
        return cases
    return list(item.spec.make_cases(rng))


def make_graded_cases(item, *, seed, hidden_seed=None, float32_case=True):
    """The cases of one item: visible ones at ``seed``, hidden ones at ``hidden_seed``.

    Cases that need an option the assignment drops are left out (see :func:`resolve`).
    """
    def make(s, dtype):
        return all_cases(item, np.random.default_rng(s), dtype)

    out = []
    chosen = _select(make(seed, np.float64), item.cases, item)
    if not chosen:
        raise ValueError(f"{item.name}: no case is left to grade (the dropped options "
                         f"{', '.join(item.drop)} are used by every case)")
    hidden = set() if hidden_seed is None else hidden_indices(item, chosen)
    redraw = hidden_seed is not None and item.hidden == "redraw"
    for i, case in chosen:
        if i not in hidden:
            out.append(GradedCase(i, case, case.label or f"case {i}", hidden=False, seed=seed))
    if float32_case and item.kind == "op":
        first = [(i, c) for i, c in _select(make(seed, np.float32), item.cases, item) if i not in hidden]
        if first:
            i, case = first[0]
            out.append(GradedCase(i, case, f"float32: {case.label or f'case {i}'}", dtype="float32",
                                  seed=seed))
    if hidden or redraw:
        for i, case in _select(make(hidden_seed, np.float64), item.cases, item):
            if i in hidden or redraw:
                out.append(GradedCase(i, case, f"hidden: {case.label or f'case {i}'}", hidden=True,
                                      seed=hidden_seed))
    return out


def hidden_indices(item, chosen):
    """The indices of the cases graded as hidden (drawn at the hidden seed, shown after the due
    date), from ``item.hidden``:

    "auto"    the last third of the item's cases (the registry lists edge cases last), so the
              hidden ones have their own shapes and edge cases; none of a single case
    "none"    no hidden case;  "all": every case
    "redraw"  every case visible, and each again with other values at the hidden seed
    [...]     these cases, by index or label
    """
    indices = [i for i, _ in chosen]
    spec = item.hidden
    if spec in ("none", False, None, "redraw"):
        return set()
    if spec in ("all", True):
        return set(indices)
    if spec == "auto":
        return set(indices[len(indices) - len(indices) // 3:])
    if not isinstance(spec, list):
        raise ValueError(f"grading config: 'hidden' of {item.name!r} is {spec!r}; expected "
                         "\"auto\", \"none\", \"all\", \"redraw\" or a list of cases")
    labels = {c.label: i for i, c in chosen}
    out = set()
    for w in spec:
        if isinstance(w, int) and not isinstance(w, bool) and w in indices:
            out.add(w)
        elif isinstance(w, str) and w in labels:
            out.add(labels[w])
        else:
            raise ValueError(f"grading config: {item.name!r} has no graded case {w!r} to hide; its "
                             "cases are " + "; ".join(f"{i}: {c.label}" for i, c in chosen))
    return out


# --- grading-only cases ------------------------------------------------------------------------
# Behaviours a skeleton requires that the registry's cases do not reach (mha's KV-cache step,
# per-sequence RoPE positions and given frequencies, GEGLU with the exact GELU, random ops on
# enough elements for the statistics of the student's own mask): each op declares them beside
# its registration (``OpSpec.extra_cases``).

EXTRA_CASES = {name: spec.extra_cases for name, spec in registry().items() if spec.extra_cases}



# --- random ops: graded against the submission's own draw ----------------------------------------
#
# The mask a submission draws depends on how it uses the generator (``rng.random(shape) >= p``,
# ``< 1 - p``, ``rng.binomial``, ...), all equally valid. So the mask is read off the
# submission's forward output, the reference is re-run with that mask (a generator that replays
# it), and the output, the gradients and the mask's statistics are judged against that.

@dataclass
class DrawCheck:
    """The verdict on a random case: see :func:`own_draw`."""
    ok: bool
    short: str = ""
    lines: list = field(default_factory=list)
    near_miss: str = ""             # the op with one named change that gives the output, if any
    out: object = None              # the reference output under the submission's mask
    grads: object = None            # the reference gradients under it (one per input)
    mask: object = None             # the mask read off the output (bool, the input's shape)


class _Replay(np.random.Generator):
    """A generator whose ``random`` returns uniforms that reproduce a given keep-mask."""

    def __init__(self, mask, p):
        super().__init__(np.random.PCG64(0))
        self._u = np.where(mask, (1.0 + p) / 2.0, p / 2.0)      # >= p exactly where kept
        self.calls = 0

    def random(self, size=None, dtype=np.float64, out=None):
        self.calls += 1
        if size is None or tuple(np.atleast_1d(size)) != self._u.shape:
            raise ValueError(f"replayed draw of shape {self._u.shape} asked for size {size!r}")
        return self._u.astype(dtype)


def own_draw(item, gc, value, dout):
    """Grade a random case against the submission's own draw.

    Returns None when the case draws nothing (any other op; p = 0; train=False) or when the
    forward's answer is not an array of the output's shape (the usual comparison reports it).
    Otherwise a :class:`DrawCheck`: the mask is read off the submission's output (dropout:
    kept where ``out = x/(1-p)``, dropped where ``out == 0``; LoRA: the mask of each row's
    branch input that reproduces the row), the reference is re-run with that mask (``out``
    and ``grads``, the gradients under the upstream gradient ``dout``), and the mask's kept
    fraction is tested against Bernoulli(1 - p) with an exact binomial test. ``ok`` is False
    when no mask reproduces the output (``out`` is then None) or the statistics fail.
    """
    from ..registry import bind
    args, kwargs = gc.case.args, gc.case.kwargs
    p = drop_probability(item.name, kwargs) if item.kind == "op" else None
    if p is None:
        return None
    reader = DRAWS[item.name][0]
    got = getattr(value, "array", value) if getattr(value, "is_number", True) else None
    if not isinstance(got, np.ndarray) or got.dtype.kind not in "biuf":
        return None
    expected_out, _ = bind(item.spec.forward, kwargs)(*args)
    if got.shape != np.shape(expected_out):
        return None
    got = got.astype(np.float64)
    if not np.isfinite(got).all():
        return None
    mask, lines, near = read_draw(item.name, args, kwargs, got, gc.dtype)
    if isinstance(mask, str):
        return None
    if mask is None:
        return DrawCheck(False, "out: no dropout mask gives it", lines, near_miss=near)
    replay = _Replay(mask, p)
    out, cache = item.spec.forward(*args, **dict(kwargs, rng=replay))
    again, _ = reader(args, kwargs, np.asarray(out, dtype=np.float64), gc.dtype)
    replayed = again is not None and not isinstance(again, str) and np.array_equal(again, mask)
    if replay.calls != 1 or not replayed:     # the reference draws otherwise: compare as before
        return None
    raw = item.spec.backward(np.array(dout, copy=True), cache)
    grads = list(raw) if len(args) > 1 else [raw]
    ok, lines = mask_statistics(mask, args[0], p)
    return DrawCheck(ok, "" if ok else "mask statistics", lines, out=np.asarray(out), grads=grads,
                     mask=mask)


def rng_dependence(item, gc, masks):
    """(ok, lines) of :func:`.judge.rng_dependence` for the masks of case ``gc`` of ``item``
    drawn from ``1 + judge.RNG_DRAWS`` different generators."""
    p = float(gc.case.kwargs[DRAWS[item.name][1]])
    return judge_rng_dependence(masks, gc.case.args[0], p)
