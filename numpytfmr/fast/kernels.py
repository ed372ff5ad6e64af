"""The elementwise and row-wise kernels of the fast GPT (rows = tokens, shape (N, d)).

Each kernel computes the same numbers as the reference op of the same name (up to the
order of floating-point operations), arranged for speed:

- row means and column sums as BLAS matrix-vector products (``x @ (1/d) 1``, ``1^T G``);
- row dot products with ``einsum`` (no temporary of the size of the rows);
- temporaries updated in place (``out=``, ``+=``) instead of a new array per operation;
- the exact float32 GELU through a rational fit of Mills' ratio, in blocks that stay in the L2
  cache;
- the causal softmax key-major (scores stored as (n_k, n_q)), so its reductions over the
  keys run as elementwise operations on whole rows of memory;
- the softmax and the cross-entropy fused into one pass structure.

Nothing here validates its inputs: the entry points of ``numpytfmr.fast`` check them once.

Kernels that make arrays take them from a :class:`Workspace` (``ws.take(name, shape,
dtype)``): ``FRESH`` makes a new array every time; a ``Workspace`` hands out the same
memory call after call, so a training step stops paying for fresh pages (the first touch
of a new 4 MB array costs about as much as a third of a matrix product that fills it).
"""
import threading

import numpy as np

from ..activations import erfc
from . import parallel


class Workspace:
    """Named arrays kept from one call to the next.

    ``take(name, shape, dtype)`` returns the array kept under ``name`` (a new one when it
    does not exist yet or its shape or dtype changed). Whatever was in it is overwritten
    by its next user: a name must not be taken twice while the first array is in use.
    """
    __slots__ = ("arrays",)

    def __init__(self):
        self.arrays = {}

    def take(self, name, shape, dtype):
        a = self.arrays.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = self.arrays[name] = np.empty(shape, dtype)
        return a

    def clear(self):
        self.arrays.clear()

    def nbytes(self):
        return sum(a.nbytes for a in self.arrays.values())


class _Fresh:
    """The workspace that keeps nothing: ``take`` makes a new array every time."""
    __slots__ = ()

    @staticmethod
    def take(name, shape, dtype):
        return np.empty(shape, dtype)


FRESH = _Fresh()

# ---------------------------------------------------------------------------------------
# BLAS reductions
# ---------------------------------------------------------------------------------------


def column_sums(g, out=None):
    """sum_n g[n, :] for g (N, d): the vector-matrix product 1^T G (gradient of a bias),
    written into ``out`` when given."""
    return np.matmul(np.ones(g.shape[0], g.dtype), g, out=out)


_MEAN_VECTORS = {}


def _mean_vector(d, dtype):
    key = (d, np.dtype(dtype))
    w = _MEAN_VECTORS.get(key)
    if w is None:
        w = _MEAN_VECTORS[key] = np.full(d, 1.0 / d, dtype)
        w.setflags(write=False)
    return w


if hasattr(np, "vecdot"):                     # NumPy >= 2.0: a ufunc, no einsum parsing
    def row_dots(a, b, out=None):
        """sum_j a[n, j] b[n, j], shape (N,), without the temporary a * b."""
        return np.vecdot(a, b, out=out)
else:                                         # pragma: no cover - NumPy 1.x
    def row_dots(a, b, out=None):
        """sum_j a[n, j] b[n, j], shape (N,), without the temporary a * b."""
        return np.einsum("nj,nj->n", a, b, out=out)


def row_means(x, out=None):
    """(1/d) sum_j x[:, j] for x (N, d): each row's dot product with (1/d) 1, shape (N,).
    (One dot per row, as BLAS's dot computes it: the same numbers for a row whatever
    block of rows it is computed in, unlike a matrix-vector product, whose kernels
    change with the number of rows and of BLAS threads.)"""
    return row_dots(x, _mean_vector(x.shape[1], x.dtype), out)


def column_dots(a, b, out=None):
    """sum_n a[n, j] b[n, j], shape (d,): the gradient of a gain gamma (into ``out``)."""
    return np.einsum("nj,nj->j", a, b, out=out)


def add_rows(x, y):
    """x += y in place, x (N, d), y (N, d) or a row (d,) broadcast to every row: row blocks
    on the workers (``parallel.for_rows``)."""
    full = y.ndim == x.ndim

    def rows(a, b):
        x[a:b] += y[a:b] if full else y
    parallel.for_rows(rows, x.shape[0], x.size // max(x.shape[0], 1))
    return x


def multiply_rows(x, y):
    """x *= y in place, x and y (N, d) (y may be a bool mask): row blocks on the workers."""
    def rows(a, b):
        x[a:b] *= y[a:b]
    parallel.for_rows(rows, x.shape[0], x.size // max(x.shape[0], 1))
    return x


# ---------------------------------------------------------------------------------------
# LayerNorm and RMSNorm (004 eq. 27-28), row block by row block (``parallel.for_rows``)
# ---------------------------------------------------------------------------------------

def _residual_rows(x, y, bias, a, b):
    """x[a:b] += y[a:b] (+ bias, added to y first: x + (y + bias), the sublayer's output
    with its bias, added to the residual stream)."""
    if y is None:
        return
    yb = y[a:b]
    if bias is not None:
        yb += bias
    x[a:b] += yb


def _norm_arrays(x, ws, name, r_name):
    """A norm's outputs: xhat and h like x, and the per-row factor (N,)."""
    return (ws.take(name + "xhat", x.shape, x.dtype), ws.take(name + "h", x.shape, x.dtype),
            ws.take(name + r_name, x.shape[:1], x.dtype))


def inverse_root_mean(r, d, eps):
    """In place: r <- 1 / sqrt(r / d + eps), r (N,) a sum of squares per row."""
    r *= 1.0 / d
    r += eps
    np.sqrt(r, out=r)
    np.divide(1.0, r, out=r)
    return r


def layernorm(x, gamma, beta, eps, ws=FRESH, name="", residual=None, bias=None):
    """h = gamma * (x - mu) / sigma + beta for x (N, d); returns h, xhat, rstd (N, 1).

    With ``residual`` (N, d): first x += residual (+ ``bias``, added into ``residual``),
    in place, block by block in the same pass (the residual stream's update and the next
    norm read the rows once)."""
    N, d = x.shape
    xhat, h, rstd = _norm_arrays(x, ws, name, "rstd")

    def rows(a, b):
        _residual_rows(x, residual, bias, a, b)
        xb, xh, r = x[a:b], xhat[a:b], rstd[a:b]
        np.subtract(xb, row_means(xb)[:, None], out=xh)
        inverse_root_mean(row_dots(xh, xh, out=r), d, eps)     # 1 / sigma
        xh *= r[:, None]                                  # xhat = (x - mu) / sigma
        hb = np.multiply(xh, gamma, out=h[a:b])
        if beta is not None:
            hb += beta
    parallel.for_rows(rows, N, d)
    return h, xhat, rstd[:, None]


def layernorm_backward_into(dh, xhat, rstd, gamma, dx, *, accumulate, has_beta=True, ws=FRESH,
                            dgamma=None, dbeta=None, consume=False):
    """The gradients of :func:`layernorm` given dh (overwritten): returns (dgamma, dbeta or
    None, dx), dx added into ``dx`` when ``accumulate`` (a residual stream's gradient);
    dgamma and dbeta written into the arrays given, if any. ``consume``: xhat is not read
    again and serves as the scratch array (still in cache, unlike a scratch of its own).

        dgamma = sum_n dh xhat,  dbeta = sum_n dh,  dxhat = dh gamma,
        dx = (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) / sigma

    The sums over the rows (dgamma, dbeta) run first, whole; then the rows, in blocks.
    """
    N, d = xhat.shape
    dgamma = column_dots(dh, xhat, dgamma)
    dbeta = column_sums(dh, dbeta) if has_beta else None
    t = xhat if consume else ws.take("norm.t", xhat.shape, xhat.dtype)

    def rows(a, b):
        g, xh, tb = dh[a:b], xhat[a:b], t[a:b]
        g *= gamma                                        # dxhat
        mean = row_means(g)                               # mean(dxhat)
        m2 = row_dots(g, xh)
        m2 *= 1.0 / d                                     # mean(dxhat xhat)
        np.multiply(xh, m2[:, None], out=tb)
        g -= tb
        g -= mean[:, None]
        g *= rstd[a:b]
        if accumulate:
            dx[a:b] += g
    parallel.for_rows(rows, N, d)
    return dgamma, dbeta, (dx if accumulate else dh)


def rmsnorm(x, gamma, eps, ws=FRESH, name="", residual=None, bias=None):
    """h = gamma * x / rms(x); returns h, xhat, rrms (N, 1) (``residual``, ``bias`` as in
    :func:`layernorm`)."""
    N, d = x.shape
    xhat, h, rrms = _norm_arrays(x, ws, name, "rrms")

    def rows(a, b):
        _residual_rows(x, residual, bias, a, b)
        xb, r = x[a:b], rrms[a:b]
        inverse_root_mean(row_dots(xb, xb, out=r), d, eps)     # 1 / rms
        xh = np.multiply(xb, r[:, None], out=xhat[a:b])
        np.multiply(xh, gamma, out=h[a:b])
    parallel.for_rows(rows, N, d)
    return h, xhat, rrms[:, None]


def rmsnorm_backward_into(dh, xhat, rrms, gamma, dx, *, accumulate, ws=FRESH, dgamma=None,
                          consume=False):
    """The gradients of :func:`rmsnorm` given dh (overwritten): returns (dgamma, None, dx),
    dx = (dxhat - xhat mean(dxhat xhat)) / rms added into ``dx`` when ``accumulate``
    (``consume`` as in :func:`layernorm_backward_into`)."""
    N, d = xhat.shape
    dgamma = column_dots(dh, xhat, dgamma)
    t = xhat if consume else ws.take("norm.t", xhat.shape, xhat.dtype)

    def rows(a, b):
        g, xh, tb = dh[a:b], xhat[a:b], t[a:b]
        g *= gamma
        m2 = row_dots(g, xh)
        m2 *= 1.0 / d
        np.multiply(xh, m2[:, None], out=tb)
        g -= tb
        g *= rrms[a:b]
        if accumulate:
            dx[a:b] += g
    parallel.for_rows(rows, N, d)
    return dgamma, None, (dx if accumulate else dh)


# ---------------------------------------------------------------------------------------
# The error function of the float64 exact GELU: the reference's erfc (Cody's rational
# approximations, activations.erfc); training runs float32 and takes the Mills-ratio path.
# ---------------------------------------------------------------------------------------

_INV_SQRT_2 = 0.70710678118654752440
_INV_SQRT_2PI = 0.39894228040143267794
_MINUS_HALF_LOG2_E = -0.72134752044448170368          # -log2(e) / 2: exp(-t/2) = 2^(-t log2(e)/2)


# ---------------------------------------------------------------------------------------
# Activations: each returns (out, local derivative) or the pieces its backward needs
# ---------------------------------------------------------------------------------------

# Phi for float32 through Mills' ratio R(y) = Phi(-y) / phi(y), y = |x|, as a rational
# function P(y) / Q(y) of degrees 3 and 4 (Q monic): a minimax fit of the relative error
# weighted by 1 / (1 + y^2) on 0 <= y <= 12.5 (GELU's own condition number grows as y^2):
# under 5e-8 for y < 1 (0.4 float32 eps), 3.5e-8 (1 + y^2) beyond, and 1.2e-5 at y = 14,
# where the float32 eps times that condition number is 2.3e-5; past 14, Phi(-y) < 1e-44 is
# a few float32 subnormals, and y is capped at 16 (phi(x) is 0 there, and P and Q stay far
# from overflowing). Coefficients from the constant term up.
_MILLS_P = (35.960962004785536, 24.302593230867885, 7.620480136786871, 0.9995930869134799)
_MILLS_Q = (28.692697355066446, 42.28405680209187, 25.47244910625568, 7.607651774006055)
_MILLS_Y_CAP = 16.0
# the constants as float32 scalars: the numbers a float32 array's operation rounds a Python
# float to anyway, without the conversion in every call (a third of a pass over 8 K numbers)
_MILLS_P32, _MILLS_Q32 = (tuple(np.float32(v) for v in cs) for cs in (_MILLS_P, _MILLS_Q))
_GELU_SCALARS32 = (np.float32(_MINUS_HALF_LOG2_E), np.float32(_INV_SQRT_2PI))
# elements per block: a block of x (then the output), dydx and the five scratch arrays (28
# bytes an element, 900 KB) stay in a 1 MB L2 cache through the 28 passes of the formula
GELU_BLOCK = 1 << 15


def gelu_float32(a, bias=None, need_grad=True, ws=FRESH, name=""):
    """Exact GELU of a float32 (N, f) pre-activation (plus ``bias``, added here, block by
    block): returns (x Phi(x), Phi(x) + x phi(x)) with x = a + bias (the derivative None
    unless ``need_grad``). The output is written over ``a`` (a contiguous copy of it if it
    is not contiguous), block by block while the block is in cache: no separate output
    array to bring in from memory. The blocks are shared among the workers
    (``parallel``), each with scratch arrays of its own.

        y = |x|,  phi = exp(-x^2/2) / sqrt(2 pi),  R = P(y) / Q(y)
        Phi(-y) = phi R,   Phi(x) = |[x > 0] - Phi(-y)|
    """
    flat = a.reshape(-1)
    dydx = ws.take(name + "dydx", flat.shape, flat.dtype) if need_grad else None
    step = GELU_BLOCK
    tiled = None
    if bias is not None and a.size <= GELU_BLOCK:
        x = flat.reshape(a.shape)                          # one block: add the bias at once
        x += bias
        bias = None
    if bias is not None:
        # whole rows per block, so the bias lines up with every row of the block
        f = a.shape[-1]
        rows = max(1, GELU_BLOCK // f)
        step = rows * f
        tiled = np.tile(bias, min(rows, a.shape[0]))
    n_blocks = -(-flat.size // step)

    def blocks(first, last):
        _gelu_blocks(flat, dydx, tiled, step, first * step, min(last * step, flat.size))
    k = parallel.workers() if flat.size >= parallel.MIN_ELEMENTS else 1
    parallel.run(blocks, parallel.row_blocks(n_blocks, k, align=1))
    return flat.reshape(a.shape), None if dydx is None else dydx.reshape(a.shape)


def gelu_float32_rows(a, bias=None):
    """:func:`gelu_float32` of a small contiguous float32 array (a decoding step's few rows)
    in the calling thread, without its derivative: x Phi(x) written over ``a`` (returned),
    x = a + bias. The same numbers as :func:`gelu_float32`, none of its splitting."""
    if bias is not None:
        a += bias
    flat = a.reshape(-1)
    _gelu_blocks(flat, None, None, GELU_BLOCK, 0, flat.size)
    return a


_SCRATCH = threading.local()


def _gelu_scratch(n):
    """This thread's four scratch arrays of n float32 and the cap array (16 everywhere: an
    array, as np.minimum is slow with a scalar), kept from call to call: a decoding step's
    GELU is a few thousand elements, where making five arrays costs as much as a pass."""
    kept = _SCRATCH.__dict__.setdefault("gelu", {})
    bufs = kept.get(n)
    if bufs is None:
        if len(kept) > 8:
            kept.clear()
        bufs = kept[n] = tuple(np.empty(n, np.float32) for _ in range(4)) + (
            np.full(n, _MILLS_Y_CAP, np.float32),)
        bufs[4].setflags(write=False)
    return bufs


def _gelu_blocks(flat, dydx, tiled, step, lo, hi):
    """:func:`gelu_float32` on flat[lo:hi], in blocks of ``step`` elements (``tiled``: the
    bias repeated over a block's rows, or None)."""
    n = min(hi - lo, step)
    s_buf, e_buf, r_buf, q_buf, cap = _gelu_scratch(n)
    p0, p1, p2, p3 = _MILLS_P32
    q0, q1, q2, q3 = _MILLS_Q32
    minus_half_log2_e, inv_sqrt_2pi = _GELU_SCALARS32
    with np.errstate(over="ignore", under="ignore"):
        for start in range(lo, hi, step):
            blk = slice(start, min(start + step, hi))
            xb = flat[blk]
            k = xb.size
            if tiled is not None:
                xb += tiled[:k]
            s, e, r, q = (buf[:k] if k < n else buf for buf in (s_buf, e_buf, r_buf, q_buf))
            np.abs(xb, out=s)
            np.minimum(s, cap[:k], out=s)                  # y = min(|x|, 16)
            np.multiply(s, p3, out=r)                      # P(y) = ((p3 y + p2) y + p1) y + p0
            r += p2
            r *= s
            r += p1
            r *= s
            r += p0
            np.add(s, q3, out=q)                # Q(y) = (((y + q3) y + q2) y + q1) y + q0
            q *= s
            q += q2
            q *= s
            q += q1
            q *= s
            q += q0
            r /= q                                         # R = P / Q
            np.multiply(xb, xb, out=e)
            e *= minus_half_log2_e                         # -x^2/2 in powers of 2:
            np.exp2(e, out=e)                              # (float32 exp2 is faster than exp)
            e *= inv_sqrt_2pi                              # phi(x)
            r *= e                                         # Phi(-|x|) = phi R
            # (the 0/1 step written as float32: bool - float32 is a slow mixed loop)
            np.greater(xb, 0.0, out=s)
            s -= r
            np.abs(s, out=s)                               # Phi(x) = |[x > 0] - Phi(-|x|)|
            if dydx is not None:
                db = dydx[blk]
                np.multiply(xb, e, out=db)
                db += s                                    # Phi(x) + x phi(x)
            xb *= s                                        # x Phi(x), over x


def gelu_float64(a, bias=None):
    """Exact GELU in float64 through erfc: (x Phi(x), Phi(x) + x phi(x))."""
    if bias is not None:
        a += bias
    with np.errstate(under="ignore"):
        cdf = erfc(a * -_INV_SQRT_2)
        cdf *= 0.5
        xc = np.clip(a, -40.0, 40.0)
        pdf = xc * xc
        pdf *= -0.5
        np.exp(pdf, out=pdf)
        pdf *= _INV_SQRT_2PI
        out = a * cdf
        pdf *= a
        pdf += cdf
    return out, pdf


_SQRT_8_OVER_PI = 1.5957691216057307118
_GELU_CUBIC = 0.044715


def gelu_tanh(a, bias=None):
    """GPT-2's GELU, x sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3), and its derivative."""
    if bias is not None:
        a += bias
    with np.errstate(under="ignore", over="ignore"):
        xc = np.clip(a, -50.0, 50.0)
        x2 = xc * xc
        v = x2 * _GELU_CUBIC
        v += 1.0
        v *= xc
        v *= _SQRT_8_OVER_PI                               # v = 2u
        s, s_c = _sigmoid_pair(v)
        out = a * s
        # d/dx = s + x s (1 - s) dv/dx,   dv/dx = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        x2 *= 3.0 * _GELU_CUBIC
        x2 += 1.0
        x2 *= _SQRT_8_OVER_PI
        s_c *= s
        s_c *= a
        s_c *= x2
        s_c += s
    return out, s_c


def _sigmoid_pair(v):
    """sigmoid(v), 1 - sigmoid(v) without overflow or cancellation."""
    e = np.abs(v)
    np.negative(e, out=e)
    np.exp(e, out=e)
    pos = v >= 0
    d = e + 1.0
    s = np.where(pos, 1.0, e).astype(v.dtype, copy=False)
    s_c = np.where(pos, e, 1.0).astype(v.dtype, copy=False)
    s /= d
    s_c /= d
    return s, s_c


def relu(a, bias=None):
    """max(x, 0) and its derivative [x > 0]."""
    if bias is not None:
        a += bias
    mask = a > 0
    return a * mask, mask


def silu(g):
    """x sigmoid(x) and the pieces of its derivative: returns (out, s, s_c)."""
    with np.errstate(under="ignore"):
        s, s_c = _sigmoid_pair(g)
    return g * s, s, s_c


def activation(name, a, bias, need_grad=True, ws=FRESH, key=""):
    """(out, local derivative) of a FFN activation on the pre-activation a (+ bias); the
    float32 GELU skips its derivative unless ``need_grad`` and takes its outputs from ``ws``."""
    if name == "gelu":
        if a.dtype == np.float32:
            return gelu_float32(a, bias, need_grad, ws, key)
        return gelu_float64(a, bias)
    if name == "gelu_tanh":
        return gelu_tanh(a, bias)
    return relu(a, bias)


# ---------------------------------------------------------------------------------------
# Causal attention, key-major
# ---------------------------------------------------------------------------------------

_BIAS_CACHE = {}


def causal_bias_t(n_q, group, heads, width, dtype):
    """Key-major additive causal mask of the LAST n_q keys, for a scores buffer of
    ``heads`` blocks of n_q * group query columns side by side (and pad columns up to
    ``width``): (n_q, width), 0 where key k <= query q (and in the pad), else -inf. The
    keys before the last n_q are seen by every query and need no mask.

    Column q * group + g of a block is query q of the g-th head of a group (the rows of
    the stacked queries, see ``numpytfmr.fast.gpt``).
    """
    key = (n_q, group, heads, width, np.dtype(dtype))
    b = _BIAS_CACHE.get(key)
    if b is None:
        if len(_BIAS_CACHE) > 64:
            _BIAS_CACHE.clear()
        k = np.arange(n_q)[:, None]
        q = np.arange(n_q)[None, :]
        one = np.repeat(np.where(k <= q, 0.0, -np.inf), group, axis=1)
        b = np.zeros((n_q, width), dtype)
        b[:, :heads * n_q * group] = np.tile(one, heads)
        b.setflags(write=False)
        _BIAS_CACHE[key] = b
    return b


def causal_softmax_t(St, bias_t):
    """In place: St (n_k, n_cols) key-major scores, one column per query (of every head
    side by side) -> attention weights A^T.

        A_qk = exp(S_qk - m_q) / sum_k' exp(S_qk' - m_q)  over allowed keys k <= n_past + q

    ``bias_t`` (n_q, n_cols) masks the last n_q keys (``causal_bias_t``); None: no key is
    masked. Every query sees at least key 0, so no column is empty.
    """
    if bias_t is not None:
        St[St.shape[0] - bias_t.shape[0]:] += bias_t     # masked keys: -inf
    # max over the keys of each query: a NaN score still spreads through exp and the sum
    m = np.fmax.reduce(St, axis=0)
    St -= m
    np.exp(St, out=St)
    s = np.ones(St.shape[0], St.dtype) @ St            # sum over the keys: 1^T A^T (BLAS)
    np.divide(1.0, s, out=s)
    St *= s
    return St


def softmax_backward_t(dAt, At):
    """In place: dS^T = A^T * (dA^T - sum_k dA_k A_k) (the softmax Jacobian-vector product),
    key-major (n_k, n_cols) as :func:`causal_softmax_t`."""
    dAt -= np.einsum("kq,kq->q", dAt, At)
    dAt *= At
    return dAt


# ---------------------------------------------------------------------------------------
# RoPE (003 §7.3): rotate planes in place
# ---------------------------------------------------------------------------------------

def rope_planes(x, layout):
    """The two halves of every plane of x (..., d): (x[2k], x[2k+1]) or (x[k], x[k+d/2])."""
    if layout == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def rope_rotate(src, dst, cos, sin, layout):
    """dst = R(theta) src plane by plane (dst may be src):

        first' = first cos - second sin,   second' = second cos + first sin
    """
    f, s = rope_planes(src, layout)
    nf = f * cos
    t = s * sin
    nf -= t
    ns = s * cos
    np.multiply(f, sin, out=t)
    ns += t
    df, ds = rope_planes(dst, layout)
    df[...] = nf
    ds[...] = ns


# ---------------------------------------------------------------------------------------
# Embedding gradient: scatter-add of rows
# ---------------------------------------------------------------------------------------

# Rows of an id's first SCATTER_LEVELS occurrences are added level by level (one fancy
# add per level: within a level every id appears once); the rest of a frequent id's rows
# are summed as one segment.
SCATTER_LEVELS = 8


def scatter_add_rows(table_grad, ids, rows):
    """table_grad[ids[n]] += rows[n] for every n (repeated ids accumulate)."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    counts = np.diff(np.append(starts, ids.size))
    uniq = sorted_ids[starts]
    srows = rows[order]
    most = int(counts.max())
    for k in range(min(SCATTER_LEVELS, most)):
        seen = counts > k                              # ids with a (k+1)-th occurrence
        table_grad[uniq[seen]] += srows[starts[seen] + k]
    if most > SCATTER_LEVELS:                          # the rest, summed per id
        rank = np.arange(ids.size) - np.repeat(starts, counts)
        rest = rank >= SCATTER_LEVELS
        rest_ids = sorted_ids[rest]
        first = np.flatnonzero(np.concatenate(([True], rest_ids[1:] != rest_ids[:-1])))
        table_grad[rest_ids[first]] += np.add.reduceat(srows[rest], first, axis=0)


# ---------------------------------------------------------------------------------------
# Softmax + cross-entropy, fused (003 §2.1.2, §3.7)
# ---------------------------------------------------------------------------------------

def cross_entropy_fused(z, targets, valid, n_valid, eps):
    """Mean cross-entropy of logits z (N, K) and its gradient, z overwritten with dlogits.

        l_n = log sum_k exp(z_nk) - (1 - eps) z_{n,y_n} - (eps/K) sum_k z_nk
        dz_n = (softmax(z_n) - q'_n) / N_valid,   q'_n = (1 - eps) onehot(y_n) + eps/K

    targets: (N,) ids (any value where not valid); valid: (N,) bool or None (all valid).
    Returns the loss as a Python float (accumulated in float64). The rows run in blocks on
    the workers (``parallel.for_rows``); the per-row losses are summed here, whole.
    """
    N, K = z.shape
    per = np.empty(N, np.float64)
    inv_n = 1.0 / max(n_valid, 1)
    if valid is None:
        w = np.full(N, inv_n, z.dtype)
    else:
        w = valid.astype(z.dtype) * inv_n
    ones = np.ones(K, z.dtype)

    def rows(a, b):
        zb, t = z[a:b], targets[a:b]
        r = np.arange(b - a)
        m = np.fmax.reduce(zb, axis=1)
        zb -= m[:, None]                               # z - max: exp never overflows
        zt = zb[r, t].astype(np.float64)
        zsum = row_means(zb).astype(np.float64) if eps > 0 else None
        with np.errstate(under="ignore"):
            np.exp(zb, out=zb)
        s = row_dots(zb, ones)                         # sum_k exp(z_k - max)
        pb = per[a:b]
        np.log(s.astype(np.float64), out=pb)
        pb -= (1.0 - eps) * zt
        if eps > 0:
            pb -= eps * zsum
        wb = w[a:b]
        zb *= (wb / s)[:, None]                        # p = e / s, times 1/N_valid
        zb[r, t] -= (1.0 - eps) * wb                   # minus the one-hot part of q'
        if eps > 0:
            zb -= (eps / K * wb)[:, None]              # minus the uniform part
    parallel.for_rows(rows, N, K)
    if valid is None:
        return float(per.sum()) * inv_n
    return float(per[valid].sum()) * inv_n
