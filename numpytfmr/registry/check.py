"""The registry's driver: gradient-check every case of a registered op.

``numpytfmr check``, the parametrised tests and the autograder's reference run call
:func:`check_op`.
"""

import numpy as np

from ..gradcheck import check_gradients
from . import bind, input_names

__all__ = ["check_op", "input_names"]


def check_op(spec, *, seed=0, mode=None):
    """Gradient-check every case of one registered op (an :class:`OpSpec`).

    Returns a list of ``(case, result)`` pairs; cases marked ``check=False`` (forward-only
    edge cases such as logits of 1e4) are skipped.
    """
    names = input_names(spec.forward)
    cases = spec.make_cases(np.random.default_rng(seed), np.float64)
    out = []
    for i, case in enumerate(cases):
        if not case.check:
            continue
        result = check_gradients(bind(spec.forward, case.kwargs), spec.backward, case.args,
                                 seed=seed + i, mode=mode or spec.mode,
                                 names=names[:len(case.args)])
        out.append((case, result))
    return out
