"""Registered ops of the positional-encoding chapter (003 ch. 7): RoPE."""
import copy

import numpy as np

from ..positional import rope_backward, rope_forward, rope_frequencies
from . import Case, Mistake, OpSpec


def _rope_cases(rng, dtype):
    def x(*shape):
        return rng.standard_normal(shape).astype(dtype)

    yarn = {"type": "yarn", "factor": 4.0, "original_max_positions": 16}
    return [
        Case((x(5, 8),), {"positions": np.arange(5)}, "x (5, 8), interleaved"),
        Case((x(5, 8),), {"positions": np.arange(5), "layout": "half"}, "x (5, 8), half"),
        Case((x(2, 3, 7, 6),), {"positions": np.arange(7), "layout": "half"},
             "x (2, 3, 7, 6), odd n, half"),
        Case((x(3, 5, 8),), {"positions": np.arange(11, 16)},
             "x (3, 5, 8), positions 11..15 (after a cache of 11)"),
        Case((x(2, 2, 1, 6),), {"positions": np.array([9]), "layout": "half"},
             "x (2, 2, 1, 6), one cached step at position 9"),
        Case((x(2, 3, 5, 6),), {"positions": np.array([[[0, 1, 2, 3, 4]], [[3, 4, 5, 6, 7]]])},
             "x (2, 3, 5, 6), per-sequence positions (2, 1, 5)"),
        Case((x(2, 5, 8),), {"positions": np.arange(5), "freqs": rope_frequencies(8, scaling=yarn)},
             "x (2, 5, 8), YaRN freqs s=4 L=16"),
        Case((x(4, 6),), {"positions": np.arange(4),
                          "freqs": rope_frequencies(6, scaling={"type": "ntk", "factor": 2.0}),
                          "layout": "half"},
             "x (4, 6), NTK freqs s=2, half"),
        Case((x(3, 4, 6),), {"positions": np.arange(4) / 2.5, "base": 100.0},
             "x (3, 4, 6), fractional positions i/2.5, base 100"),
    ]


_OTHER_LAYOUT = {"interleaved": "half", "half": "interleaved"}


def _rope_with(**change):
    """rope_backward on a copy of the cache with entries changed (functions of the cache)."""
    def backward(dout, cache):
        cache = copy.copy(cache)                        # keeps the OpCache's tag
        cache.update({k: f(cache) for k, f in change.items()})
        return rope_backward(dout, cache)
    return backward


# Known wrong backwards (the catalogue the gradient checker names)
_ROPE = (
    Mistake("rotated by +theta", "x",
            _rope_with(sin=lambda c: -c["sin"]),           # R(-theta) with -theta: +theta
            "the backward rotates dout by +theta like the forward; the transpose of a rotation "
            "is the rotation by -theta: dx = R(-theta) dout (cos, -sin)"),
    Mistake("not rotated back", "x", lambda dout, c: dout.copy(),
            "dx = dout treats RoPE as the identity; it rotates every plane, so dx = R(-theta) "
            "dout"),
    Mistake("pairs of the other layout", "x",
            _rope_with(layout=lambda c: _OTHER_LAYOUT[c["layout"]]),
            "dout is rotated back over the planes of the other layout (interleaved pairs "
            "(2k, 2k+1) against halves (k, k + d/2)): pair the features as the forward does"))

def _rope_options(inputs, out):
    """Positions 0..n-1 along the second-to-last axis, in either layout."""
    positions = np.arange(np.shape(inputs[0])[-2])
    return [{"positions": positions, "layout": layout} for layout in ("interleaved", "half")]


OPS = [
    OpSpec("rope", rope_forward, rope_backward, _rope_cases, section="003 §7.3", mode="full",
           mistakes=_ROPE, options=_rope_options),
]
