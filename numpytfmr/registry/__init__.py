"""The one registry of differentiable ops.

``REGISTRY`` maps an op's name to an :class:`OpSpec`: its forward, its backward, and a
maker of example cases. It drives ``numpytfmr check``, the parametrised tests and the
autograder, so adding an op means adding one ``OpSpec`` to the ``OPS`` list of one of
the topic files below (``registry/core.py``, ``registry/attention.py``, ...).

A :class:`Case` holds plain data only (arrays, numbers, strings), so it can be written
to an ``.npz`` and replayed in another process. An integer under the key ``"rng"`` in
``kwargs`` is a seed: :func:`bind` turns it into a fresh ``np.random.Generator`` on
every call, which makes a random forward (dropout) repeatable. The driver that
gradient-checks every case of an op is ``check_op`` in ``run/commands/check.py`` (the
``check`` command's module): the gradient checker recognises ops through this registry, so
the registry does not import the checker.

Each op also declares its catalogue of known wrong backwards (:class:`Mistake`): the
formulas students write instead of the right one (softmax's diagonal-only Jacobian,
LayerNorm's unbiased variance, DPO's ``sigmoid(+margin)``). The gradient checker
recognises a gradient equal to one of them (``checking/catalogue.py``) and names it.
"""
from dataclasses import dataclass, field
import importlib
import inspect
from typing import Callable

import numpy as np

# Topic files, in the order of the notes; each defines a list ``OPS``.
_TOPICS = ("core", "attention", "positional", "recurrent", "posttraining", "efficient")


@dataclass(frozen=True)
class Case:
    """One example input of an op.

    args:   the positional inputs of ``forward`` (arrays, or None for an absent optional one)
    kwargs: the keyword options (an int ``rng`` is a seed, see :func:`bind`)
    label:  a short description shown in reports, e.g. ``"x (2, 3, 7)"`` or ``"fully masked row"``
    check:  False for cases meant for forward comparisons only (e.g. logits of +-1e4,
            where finite differences are meaningless)
    """
    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    check: bool = True


@dataclass(frozen=True)
class Mistake:
    """A known wrong backward of an op, declared with its registration.

    name:     a short label, e.g. ``"diagonal only"``
    of:       the input whose gradient it gets wrong (a positional name of the forward, "x")
    gradient: ``gradient(dout, cache) -> array``: the wrong gradient of that input, computed
              from the reference forward's cache as a student with this mistake computes it
              (for a forward recognised by its output, the checker's copy of the cache also
              holds the op's positional inputs under ``"inputs"``: a variant may need one the
              cache keeps only in part, which a student's own cache has whole)
    text:     one sentence naming the mistake and its fix
    """
    name: str
    of: str
    gradient: Callable
    text: str


@dataclass(frozen=True)
class OpSpec:
    """A registered op.

    name:       the op's name; the public functions are ``{name}_forward``/``{name}_backward``
    forward:    ``out, cache = forward(*args, **kwargs)``
    backward:   ``grads = backward(dout, cache)``
    make_cases: ``make_cases(rng, dtype) -> list[Case]``, at least three shapes, with
                leading batch axes and odd sizes, plus the op's edge cases
    section:    where the notes derive it, e.g. ``"004 eq. 27-28"``
    mode:       the gradient-check mode that suits its cases ("full" or "directional")
    mistakes:   the op's catalogue of known wrong backwards, :class:`Mistake` objects
    options:    ``options(inputs, out) -> [dict]``: the keyword options a forward written
                independently of this package may be computing, the usual ones first (the GELU
                variant, the softmax axis, LayerNorm's eps, a causal mask); the recogniser
                (``checking/recognise.py``) runs the op with each. None: the defaults only
    tune:       ``((name, low, high), ...)``: numeric options the recogniser may solve for
                when none of ``options`` reproduces the output (a scale, eps, beta, alpha),
                searched on a log scale between ``low`` and ``high``
    slips:      ``slips(forward, args, kwargs) -> [(sentence, thunk)]``: the wrong forwards
                students write (LayerNorm's unbiased variance, attention without 1/sqrt(d_k)),
                ``thunk()`` computing the wrong output on that case; the grader names a
                forward whose output equals one. None: no named slips
    extra_cases: ``extra_cases(rng, dtype) -> [Case]``: grading-only cases, behaviours a
                skeleton requires that ``make_cases`` does not reach (mha's KV-cached step,
                a random op's mask on enough elements for its statistics)
    random:     the keyword of a random op's drop probability (dropout's ``p``, LoRA's
                ``dropout``): such an op is judged against the student's own draw
    omit:       options no skeleton shows (the grader never passes them)
    depends:    ``((option, (others, ...)), ...)``: the options dropped with ``option`` when
                an assignment leaves it out
    """
    name: str
    forward: Callable
    backward: Callable
    make_cases: Callable
    section: str = ""
    mode: str = "full"
    mistakes: tuple = ()
    options: Callable = None
    tune: tuple = ()
    slips: Callable = None
    extra_cases: Callable = None
    random: str = ""
    omit: tuple = ()
    depends: tuple = ()


def wrong(name, text, backward, names, inputs):
    """The :class:`Mistake` ``name`` for each of ``inputs``, from one wrong ``backward``.

    backward: ``backward(dout, cache) -> grads`` like the op's own (one gradient per input,
              in the order of ``names``), computing the mistake; each Mistake takes the
              gradient of its input from it.
    """
    def item(i):
        def gradient(dout, cache):
            g = backward(dout, cache)[i]
            if g is None:
                raise ValueError(f"the variant {name!r} has no gradient for {names[i]}")
            return g
        return gradient
    return tuple(Mistake(name, x, item(names.index(x)), text) for x in inputs)


def bind(fn, kwargs):
    """Return ``f(*args)`` calling ``fn(*args, **kwargs)``, with an int ``rng`` made a fresh Generator."""
    def call(*args):
        kw = dict(kwargs)
        if isinstance(kw.get("rng"), (int, np.integer)):
            kw["rng"] = np.random.default_rng(int(kw["rng"]))
        return fn(*args, **kw)
    return call


_REGISTRY = None


def _topics():
    for topic in _TOPICS:
        try:
            yield importlib.import_module(f"{__name__}.{topic}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{topic}":
                raise


def registry():
    """Return the registry: an ordered ``dict`` name -> :class:`OpSpec`."""
    global _REGISTRY
    if _REGISTRY is None:
        ops = {}
        for module in _topics():
            for spec in module.OPS:
                if spec.name in ops:
                    raise RuntimeError(f"op {spec.name!r} is registered twice")
                ops[spec.name] = spec
        _REGISTRY = ops
    return _REGISTRY


def output_with(forward, kwargs):
    """``out(*args, **changes)``: ``forward``'s output with the case's ``kwargs`` updated by
    ``changes`` (what a slip's thunk computes with an option changed)."""
    def out(*args, **changes):
        return forward(*args, **dict(kwargs, **changes))[0]
    return out


def known_slips(name, forward, args, kwargs):
    """The op ``name``'s named wrong forwards on one case: ``[(sentence, thunk)]`` (its
    ``OpSpec.slips``; empty for an op without, or a name that is not an op)."""
    spec = registry().get(name)
    if spec is None or spec.slips is None:
        return []
    return spec.slips(forward, args, kwargs)


def spec_of(forward):
    """The :class:`OpSpec` whose forward is ``forward`` (the decorated reference op), or None."""
    return next((spec for spec in registry().values() if spec.forward is forward), None)


def get(name):
    """Return the :class:`OpSpec` called ``name``, or raise a ValueError listing the known ones."""
    ops = registry()
    if name not in ops:
        raise ValueError(f"unknown op {name!r}; registered ops: {', '.join(ops)}")
    return ops[name]


def input_names(fn):
    """The names of ``fn``'s positional parameters, used to label gradient rows."""
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
