# A probe for hidden verdicts, appended to correct.py: attention_forward ends its process when
# it is called again on an input it has seen (finite differences of the forward, the grader's
# follow-up on a wrong backward, do that), or, with EXIT_ON_HIDDEN_INPUT, on an input only the
# hidden cases have (4-d Q); with WRONG_ON_HIDDEN the backward is wrong exactly there. Whatever
# the flags, what a student sees before the due date must be the same.
import os

WRONG_ON_HIDDEN = False
EXIT_ON_HIDDEN_INPUT = False
_seen = set()
_last = {"hidden": False}
_right_attention_forward = attention_forward
_right_attention_backward = attention_backward


def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    key = (Q.dtype.str, Q.shape, Q.tobytes())
    if key in _seen:
        os._exit(3)                        # the follow-up of a failed case: tell the world
    _seen.add(key)
    _last["hidden"] = Q.ndim == 4
    if EXIT_ON_HIDDEN_INPUT and _last["hidden"]:
        os._exit(4)
    return _right_attention_forward(Q, K, V, mask=mask, bias=bias, scale=scale)


def attention_backward(dout, cache):
    dQ, dK, dV = _right_attention_backward(dout, cache)
    if WRONG_ON_HIDDEN and _last["hidden"]:
        dQ = 2 * dQ
    return dQ, dK, dV
