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

``cases`` is "all" or a list of case numbers (0-based, in the registry's order) or labels.
"""
from dataclasses import dataclass, field
import json
import math
import os

import numpy as np

from ..registry import Case, registry

__all__ = ["Item", "GradedCase", "helpers", "resolve", "contract_names", "load_config",
           "DEFAULTS", "make_graded_cases", "input_names"]

DEFAULTS = {"seed": 0, "hidden_seed": None, "timeout": 10.0, "memory_mb": 2048,
            "float32_case": True, "weight": 10.0}


@dataclass(frozen=True)
class Helper:
    """A plain function of the contract: its reference and a maker of cases (rng -> [Case])."""
    name: str
    reference: object
    make_cases: object
    exact: bool = False      # compare exactly (bool/int results)


@dataclass
class Item:
    """One graded name: an op (``functions = (name_forward, name_backward)``) or a helper."""
    name: str
    kind: str                       # "op" or "function"
    functions: tuple
    spec: object                    # OpSpec or Helper
    weight: float = DEFAULTS["weight"]
    cases: object = "all"


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
        Helper("sinusoidal_encoding", nt.sinusoidal_encoding, _sinusoidal_cases),
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


def resolve(name, weight=None, cases="all"):
    """The :class:`Item` for ``name``: an op name, one of its two functions, or a helper."""
    ops = registry()
    base = name
    for suffix in ("_forward", "_backward"):
        if name.endswith(suffix) and name[: -len(suffix)] in ops:
            base = name[: -len(suffix)]
    weight = DEFAULTS["weight"] if weight is None else float(weight)
    if base in ops:
        return Item(base, "op", (f"{base}_forward", f"{base}_backward"), ops[base], weight, cases)
    if base in helpers():
        return Item(base, "function", (base,), helpers()[base], weight, cases)
    known = ", ".join(list(ops) + list(helpers()))
    raise ValueError(f"unknown function {name!r}; gradable names are the ops ({known}), their "
                     "_forward/_backward functions, and the helpers")


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
               "functions", "names"}
    unknown = set(source) - allowed
    if unknown:
        raise ValueError(f"grading config: unknown key(s) {', '.join(sorted(unknown))}; expected "
                         f"some of {', '.join(sorted(allowed))}")
    functions = source.get("functions", [])
    if not isinstance(functions, list):
        raise ValueError("grading config: 'functions' must be a list")
    for f in functions:
        if isinstance(f, str):
            continue
        if not isinstance(f, dict) or "name" not in f:
            raise ValueError(f"grading config: each entry of 'functions' is a name or an object "
                             f"with a 'name'; got {f!r}")
        weight = f.get("weight", DEFAULTS["weight"])
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight < 0:
            raise ValueError(f"grading config: weight of {f['name']!r} is {weight!r}; expected a "
                             "number >= 0")
    return dict(source)


def items_from_config(config):
    items = []
    for f in config.get("functions", []):
        if isinstance(f, str):
            items.append(resolve(f))
        else:
            items.append(resolve(f["name"], f.get("weight"), f.get("cases", "all")))
    return items


def _select(cases, wanted, item):
    if wanted in (None, "all"):
        return list(enumerate(cases))
    if not isinstance(wanted, list):
        raise ValueError(f"grading config: 'cases' of {item.name!r} must be \"all\" or a list")
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
    return chosen


def make_graded_cases(item, *, seed, hidden_seed=None, float32_case=True):
    """The cases of one item: visible ones at ``seed``, hidden ones at ``hidden_seed``."""
    def make(s, dtype):
        rng = np.random.default_rng(s)
        if item.kind == "op":
            return item.spec.make_cases(rng, dtype)
        return item.spec.make_cases(rng)

    out = []
    for i, case in _select(make(seed, np.float64), item.cases, item):
        out.append(GradedCase(i, case, case.label or f"case {i}", hidden=False, seed=seed))
    if float32_case and item.kind == "op":
        chosen = _select(make(seed, np.float32), item.cases, item)
        if chosen:
            i, case = chosen[0]
            out.append(GradedCase(i, case, f"float32: {case.label or f'case {i}'}", dtype="float32",
                                  seed=seed))
    if hidden_seed is not None:
        for i, case in _select(make(hidden_seed, np.float64), item.cases, item):
            out.append(GradedCase(i, case, f"hidden: {case.label or f'case {i}'}", hidden=True,
                                  seed=hidden_seed))
    return out
