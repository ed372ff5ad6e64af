"""A battery of student code: forwards and backwards written the way students write them.

Each module here implements one or a few of the registered ops from scratch, in plain NumPy,
without importing numpytfmr: its own variable names, its own cache, its own structure
(loops where a student would loop, ``keepdims`` one way or the other). For every known wrong
backward in an op's catalogue (``numpytfmr/registry/*.py``) a module gives a backward with
that single mistake, and for every op a correct backward (a control).

Each module has ``CASES``: a list of :class:`Student` items. ``tests/test_student_battery.py``
runs ``check_gradients`` on each and counts the mistakes the checker names.
"""
from dataclasses import dataclass, field

__all__ = ["Student", "MODULES"]

MODULES = ("linear_layer", "activations", "softmaxes", "norms", "lookup_dropout", "feedforward",
           "attention", "multihead", "rope", "gru", "lora", "preference", "efficient")


@dataclass
class Student:
    """One student's forward and backward on one input.

    op:       the registered op the code implements
    mistake:  the catalogue's name of the single mistake in ``backward`` (None: a correct
              backward, a control that must pass with no diagnosis)
    accepted: other catalogue names that name the same mistake (the same formula under an
              op that computes the same thing, e.g. flash attention's "D left out" is
              attention's "without the subtraction")
    """
    op: str
    mistake: object
    forward: object
    backward: object
    inputs: tuple
    names: tuple
    accepted: frozenset = field(default_factory=frozenset)

    @property
    def label(self):
        return f"{self.op}: {self.mistake or 'correct'}"
