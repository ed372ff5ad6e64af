"""Registry entries for memory-efficient attention (efficient.py).

Flash-attention cases use block sizes smaller than the sequence (and not dividing it), so
the running maximum, the rescaling and the skipped tiles are all exercised. Sliding-window
cases use blocks smaller than the window and than n, so that tiles overlap in their keys.
Linear-attention inputs are kept at least 0.05 away from 0, the point where phi = elu + 1
changes formula (its second derivative jumps there, which would spoil finite differences);
causal cases use chunks smaller than n (and not dividing it), so the running state is
exercised.
"""
import copy

import numpy as np

from ..attention import attention_forward, causal_mask, padding_mask, unbroadcast
from ..efficient import (
    flash_attention_backward, flash_attention_forward,
    linear_attention_backward, linear_attention_forward,
    sliding_window_attention_backward, sliding_window_attention_forward, sliding_window_mask,
)
from . import Case, OpSpec, wrong
from .attention import attention_slips


def _normal(rng, dtype, *shape):
    return rng.standard_normal(shape).astype(dtype)


def _away_from_zero(rng, dtype, *shape):
    x = rng.standard_normal(shape)
    return (np.sign(x) * (0.05 + np.abs(x))).astype(dtype)


def _flash_cases(rng, dtype):
    r = lambda *s: _normal(rng, dtype, *s)  # noqa: E731
    blocked = causal_mask(5).copy()
    blocked[2] = False                                   # query 2 may attend to nothing
    neg_inf_bias = np.where(causal_mask(4), 0.0, -np.inf)
    neg_inf_bias[1] = -np.inf                            # the notes' M, one row all -inf
    distance = -0.5 * np.abs(np.arange(5)[:, None] - np.arange(6)[None, :])
    return [
        Case((r(2, 7, 5), r(2, 7, 5), r(2, 7, 5)), {"block_size": 3},
             "plain (2, 7, 5), block 3 (n=7 not divisible)"),
        Case((r(3, 5), r(5, 5), r(5, 5)), {}, "one tile (default block 128)"),
        Case((r(2, 6, 5), r(2, 6, 5), r(2, 6, 5)), {"mask": causal_mask(6), "block_size": 4},
             "causal, block 4"),
        Case((r(3, 4, 3), r(3, 5, 3), r(3, 5, 2)),
             {"mask": padding_mask(np.array([5, 0, 2]), 5), "block_size": 2},
             "padding mask, lengths (5, 0, 2): sequence 1 fully masked"),
        Case((r(2, 5, 3), r(2, 5, 3), r(2, 5, 3)), {"mask": blocked, "block_size": 2},
             "causal with a fully masked row"),
        Case((r(2, 4, 3), r(2, 4, 3), r(2, 4, 2)), {"bias": neg_inf_bias.astype(dtype),
                                                   "block_size": 3},
             "-inf bias (notes' M), one row all -inf"),
        Case((r(5, 4), r(6, 4), r(6, 4)), {"bias": distance.astype(dtype), "block_size": 4},
             "finite distance bias, n_q=5 != n_k=6"),
        Case((r(2, 6, 6), r(2, 4, 6), r(2, 4, 3)), {"block_size": 3}, "d_k=6 != d_v=3"),
        Case((r(2, 2, 4), r(2, 5, 4), r(2, 5, 4)), {"mask": causal_mask(2, 5), "block_size": 2},
             "n_q=2 != n_k=5, cached-step causal mask"),
        Case((r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 3, 4)), {"mask": causal_mask(3),
                                                             "block_size": 2},
             "leading axes (2, 2)"),
        Case((r(2, 2, 3, 4), r(2, 1, 4, 4), r(2, 1, 4, 3)), {"block_size": 3},
             "K, V broadcast over a head axis"),
        Case((r(7, 3), r(7, 3), r(7, 3)), {"mask": sliding_window_mask(7, window=2),
                                           "block_size": 2},
             "sliding window 2, block 2 (whole tiles masked)"),
        Case((r(3, 7), r(4, 7), r(4, 7)), {"scale": 0.5, "block_size": 3},
             "scale=0.5 (temperature 2)"),
    ]


def _sliding_window_cases(rng, dtype):
    r = lambda *s: _normal(rng, dtype, *s)  # noqa: E731
    return [
        Case((r(2, 9, 4), r(2, 9, 4), r(2, 9, 4)), {"window": 2, "block_size": 3},
             "causal window 2, block 3, n=9"),
        Case((r(8, 3), r(8, 3), r(8, 2)), {"window": 3, "block_size": 2},
             "causal window 3 > block 2, d_v=2"),
        Case((r(2, 7, 3), r(2, 7, 3), r(2, 7, 3)), {"window": 1, "causal": False,
                                                    "block_size": 3},
             "non-causal window 1 (symmetric band)"),
        Case((r(3, 4), r(7, 4), r(7, 4)), {"window": 2, "block_size": 2},
             "n_q=3 < n_k=7 (queries at the last positions)"),
        Case((r(2, 2, 5, 3), r(2, 1, 5, 3), r(2, 1, 5, 3)), {"window": 1, "block_size": 2},
             "leading axes (2, 2), K, V broadcast over a head axis"),
        Case((r(6, 3), r(6, 3), r(6, 3)), {"window": 0, "block_size": 4}, "window 0: itself only"),
        Case((r(5, 4), r(5, 4), r(5, 4)), {"window": 9, "scale": 0.5},
             "window >= n: causal attention, scale=0.5"),
    ]


def _linear_cases(rng, dtype):
    r = lambda *s: _away_from_zero(rng, dtype, *s)  # noqa: E731
    return [
        Case((r(2, 5, 7), r(2, 5, 7), r(2, 5, 7)), {}, "non-causal (2, 5, 7)"),
        Case((r(2, 6, 5), r(2, 6, 5), r(2, 6, 3)), {"causal": True}, "causal (2, 6, 5), d_v=3"),
        Case((r(3, 4), r(5, 4), r(5, 3)), {}, "non-causal n_q=3 != n_k=5"),
        Case((r(2, 2, 4), r(2, 5, 4), r(2, 5, 4)), {"causal": True},
             "causal n_q=2 < n_k=5 (queries at the last positions)"),
        Case((r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 3, 4)), {"causal": True},
             "causal, leading axes (2, 2)"),
        Case((r(2, 2, 3, 4), r(2, 1, 5, 4), r(2, 1, 5, 3)), {},
             "non-causal, K, V broadcast over a head axis"),
        Case((r(7, 3), r(7, 3), r(7, 3)), {"causal": True, "eps": 0.1}, "causal n=7, eps=0.1"),
        Case((r(2, 7, 3), r(2, 7, 3), r(2, 7, 2)), {"causal": True, "chunk_size": 3},
             "causal in chunks of 3 (n=7 not divisible)"),
        Case((r(2, 3, 4), r(2, 8, 4), r(2, 8, 3)), {"causal": True, "chunk_size": 2},
             "causal chunks of 2, n_q=3 < n_k=8 (a state before the first query)"),
    ]


# ---------------------------------------------------------------------------------------
# Known wrong backwards (the catalogue the gradient checker names)
# ---------------------------------------------------------------------------------------

_QKV = ("Q", "K", "V")


def _with(backward, **values):
    """``backward`` on a copy of the cache with some entries replaced."""
    def changed(dout, cache):
        cache = copy.copy(cache)
        for key, value in values.items():
            cache[key] = value(cache) if callable(value) else value
        return backward(dout, cache)
    return changed


def _masked_only(cache):
    if cache["mask"] is None:
        raise ValueError("no mask")
    return None


def _unscaled(backward):
    def changed(dout, cache):
        return tuple(None if g is None else g / cache["scale"] for g in backward(dout, cache))
    return changed


_FLASH = (
    wrong("D left out", "D_i = rowsum(dO_i * O_i) is the softmax backward's subtraction, which "
          "flash attention keeps with the log-sum-exp: dS = P * (dP - D)",
          _with(flash_attention_backward, out=lambda c: np.zeros_like(c["out"])), _QKV, ("Q", "K"))
    + wrong("P recomputed without the mask", "the tile's weights are recomputed from the scores, "
            "and masked scores must be -inf there as in the forward: apply the mask before "
            "P = exp(S - L)", _with(flash_attention_backward, mask=_masked_only), _QKV, _QKV)
    + wrong("P not normalised", "P = exp(S - L) with L the row's log-sum-exp: without "
            "subtracting L the recomputed weights do not sum to 1",
            _with(flash_attention_backward, lse=lambda c: np.zeros_like(c["lse"])), _QKV, _QKV)
    + wrong("no scale", "S = Q K^T * scale, so dQ_i += dS K_j * scale and dK_j += dS^T Q_i * "
            "scale: the scale is missing", _unscaled(flash_attention_backward), _QKV, ("Q", "K")))


def _sliding_no_subtraction(dout, c):
    """The band's weights (dense, from the same mask), and a softmax backward without its
    subtraction."""
    Q, K, V, scale = c["Q"], c["K"], c["V"], c["scale"]
    mask = sliding_window_mask(Q.shape[-2], K.shape[-2], window=c["window"], causal=c["causal"])
    A = attention_forward(Q, K, V, mask=mask, scale=scale)[1]["weights"]
    dS = A * (dout @ V.swapaxes(-1, -2))
    return (unbroadcast(dS @ K * scale, Q.shape), unbroadcast(dS.swapaxes(-1, -2) @ Q * scale, K.shape),
            unbroadcast(A.swapaxes(-1, -2) @ dout, V.shape))


_SLIDING = (
    wrong("without the subtraction", "the softmax backward of each band tile is missing its "
          "subtraction: dS = A * (dA - sum(dA * A, axis=-1, keepdims=True))",
          _sliding_no_subtraction, _QKV, ("Q", "K"))
    + wrong("no scale", "S = Q K^T * scale, so dQ and dK carry the scale",
            _unscaled(sliding_window_attention_backward), _QKV, ("Q", "K")))


def _positive(c, key):
    return np.abs(c[key]) + 1.0                        # phi'(x) = 1 for every x > 0


_LINEAR_ATTENTION = (
    wrong("phi' left out", "phi = elu + 1 is applied to Q and K, so dQ = dphi_Q * phi'(Q) with "
          "phi'(x) = 1 for x > 0 and exp(x) for x <= 0",
          _with(linear_attention_backward, Q=lambda c: _positive(c, "Q"),
                K=lambda c: _positive(c, "K")), _QKV, ("Q", "K"))
    + wrong("denominator held constant", "out = num / den and den depends on Q and K too: "
            "dden = -rowsum(dout * out) / den adds dden * z to dphi_Q and the sum of dden * "
            "phi_Q to dphi_K", _with(linear_attention_backward,
                                     out=lambda c: np.zeros_like(c["out"])), _QKV, ("Q", "K")))


# The options a forward written independently of the package may compute (the recogniser of
# checking/recognise.py runs the op with each, the usual ones first)

def _flash_options(inputs, out):
    n_q, n_k = np.shape(inputs[0])[-2], np.shape(inputs[1])[-2]
    return [{}] + ([{"mask": causal_mask(n_q, n_k)}] if n_k >= n_q > 1 else [])


def _sliding_options(inputs, out):
    n_k = np.shape(inputs[1])[-2]
    return [{"window": w, "causal": c} for c in (True, False) for w in range(min(n_k, 16))]


def _linear_attention_options(inputs, out):
    return [{"causal": False}, {"causal": True}]


OPS = [
    OpSpec("flash_attention", flash_attention_forward, flash_attention_backward, _flash_cases,
           "001 §2.1 'Memory-Efficient Implementations'", mistakes=_FLASH,
           options=_flash_options, tune=(("scale", 1e-3, 1e3),), slips=attention_slips),
    OpSpec("sliding_window_attention", sliding_window_attention_forward,
           sliding_window_attention_backward, _sliding_window_cases,
           "001 §2.1 'Sparse or Limited Attention'", mistakes=_SLIDING,
           options=_sliding_options),
    OpSpec("linear_attention", linear_attention_forward, linear_attention_backward, _linear_cases,
           "001 §2.1 'Linear Attention'", mistakes=_LINEAR_ATTENTION,
           options=_linear_attention_options, tune=(("eps", 1e-12, 1.0),)),
]
