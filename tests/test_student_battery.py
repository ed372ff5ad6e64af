"""The checker names the mistakes in students' own code (numpytfmr/checking/recognise.py and
catalogue.py, on the battery of tests/students/).

Every student module implements an op from scratch in plain NumPy (its own forward, its own
cache) and, for each known wrong backward of the op's catalogue, a backward with that single
mistake. The checker must recognise the op from what the forward computes and name the
mistake with the catalogue's sentence: at least 90 % of them, none named wrongly, and no
correct backward (the controls) gets a diagnosis. The rate and the misses are printed.
"""
import functools
import importlib

import numpy as np
import pytest

from numpytfmr.checking import recognise
from numpytfmr.gradcheck import check_gradients
from numpytfmr.registry import registry
from students import MODULES

STUDENTS = [s for name in MODULES for s in importlib.import_module(f"students.{name}").CASES]
BUGGY = [s for s in STUDENTS if s.mistake]
CONTROLS = [s for s in STUDENTS if not s.mistake]


@functools.lru_cache(maxsize=None)
def _result(i):
    s = STUDENTS[i]
    return check_gradients(s.forward, s.backward, s.inputs, names=s.names, seed=i)


def _verdict(i):
    """(named, wrong names): every failing input whose gradient the mistake gets wrong (its
    catalogue entries, ``Mistake.of``) has a sentence naming the student's mistake / the
    catalogue names some other mistake for some input."""
    s, res = STUDENTS[i], _result(i)
    right = {s.mistake} | set(s.accepted)
    covered = {m.of for m in registry()[s.op].mistakes if m.name == s.mistake}
    failing = [row.position for row in res.rows if row.verdict == "FAIL"]
    named = any(s.names[p] in covered for p in failing)
    wrong = set()
    for p in failing:
        known = {d.mistake for d in res.diagnoses.get(p, []) if d.kind == "known_mistake"}
        if s.names[p] in covered:
            named &= bool(known & right)
        wrong |= known - right
    return named, wrong


def test_the_battery_covers_every_op_and_every_mistake_of_its_catalogue():
    declared = {(op, m.name) for op, spec in registry().items() for m in spec.mistakes}
    written = {(s.op, s.mistake) for s in BUGGY}
    assert written <= declared, sorted(written - declared)
    missing = sorted(declared - written)
    assert not missing, missing
    assert {s.op for s in CONTROLS} >= {op for op, _ in written}


@pytest.mark.parametrize("i", [STUDENTS.index(s) for s in CONTROLS],
                         ids=[s.label for s in CONTROLS])
def test_correct_student_backwards_pass_with_no_diagnosis(i):
    res = _result(i)
    assert res.passed and res.diagnoses == {}, f"{STUDENTS[i].label}\n{res}"


def test_the_battery_of_student_mistakes_is_named():
    by_op, misses, wrong_names, uncaught = {}, [], [], []
    for s in BUGGY:
        i = STUDENTS.index(s)
        if _result(i).passed:
            uncaught.append(s.label)
            continue
        named, wrong = _verdict(i)
        hits, total = by_op.get(s.op, (0, 0))
        by_op[s.op] = (hits + named, total + 1)
        if not named:
            misses.append(s.label)
        if wrong:
            wrong_names.append((s.label, sorted(wrong)))
    hits = sum(h for h, _ in by_op.values())
    print(f"\nstudent battery: {hits}/{len(BUGGY)} named")
    for op, (h, t) in by_op.items():
        print(f"  {op}: {h}/{t}")
    print("  missed: " + ("; ".join(misses) or "none"))
    assert not uncaught, uncaught
    assert not wrong_names, wrong_names
    assert hits >= 0.9 * len(BUGGY), f"{hits}/{len(BUGGY)} named; missed: {misses}"


_LISTED = [("softmax", "diagonal only"), ("layernorm", "unbiased variance"),
           ("layernorm", "not divided by sigma"), ("layernorm", "dgamma = sum(dout)"),
           ("gelu", "tanh derivative for the exact GELU"), ("gelu", "product rule without the x term"),
           ("attention", "without the subtraction"), ("dpo_loss", "sigmoid(+margin)")]


@pytest.mark.parametrize("op, mistake", _LISTED, ids=[f"{o}: {m}" for o, m in _LISTED])
def test_the_mistakes_the_issue_lists_are_named_with_the_op_recognised(op, mistake):
    i = next(STUDENTS.index(s) for s in BUGGY if (s.op, s.mistake) == (op, mistake))
    named, wrong = _verdict(i)
    text = " | ".join(d for ds in _result(i).diagnoses.values() for d in ds)
    assert named and not wrong, text
    assert f"your forward computes {op}" in text, text


def test_the_gelu_sentences_say_which_formula():
    for mistake, words in (("tanh derivative for the exact GELU", "the tanh approximation's derivative"),
                           ("product rule without the x term", "the x * phi(x) term")):
        i = next(STUDENTS.index(s) for s in BUGGY if (s.op, s.mistake) == ("gelu", mistake))
        text = " | ".join(_result(i).diagnoses[0])
        assert "your forward computes gelu (approximate='none')" in text and words in text, text


def test_a_passing_check_never_recognises(monkeypatch):
    calls = []
    real = recognise.recognise_all
    monkeypatch.setattr(recognise, "recognise_all", lambda *a, **k: calls.append(1) or real(*a, **k))
    for s in CONTROLS[:6]:
        assert check_gradients(s.forward, s.backward, s.inputs, names=s.names).passed
    assert calls == []
    s = next(s for s in BUGGY if s.op == "softmax")
    assert not check_gradients(s.forward, s.backward, s.inputs, names=s.names).passed
    assert calls == [1]                     # once for the whole check, on failure
