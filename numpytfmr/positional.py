"""Positional encodings (003 ch. 7, 000 §2.3, 001 §3, 004 "Position representations").

* ``sinusoidal_encoding``: the fixed absolute encoding added to token embeddings
  (003 §7.2, 000 §2.3.2, 004 "through sinusoids").
* ``rope_frequencies``, ``rope_forward``/``rope_backward``: rotary position embedding,
  a rotation of each 2-D plane of a query or key by ``theta = position * alpha_k``
  (003 §7.3, 000 §2.3.3, 001 §3), with the context-extension rescalings of the
  frequencies: position interpolation (003 §7.4), NTK-aware base change (003 §7.5) and
  YaRN "by-parts" interpolation (003 §7.6.1); ``yarn_attention_scale`` is YaRN's
  temperature (003 §7.6.2).
* ``alibi_slopes``, ``alibi_bias``: a linear distance penalty added to the attention
  logits (004 eq. 13, with ALiBi's per-head slopes).

Learned absolute positions (004 eq. 12, ``x_i + P_i``) need no op of their own: they are
the embedding lookup ``embedding_forward(np.arange(n), P)`` added to the token embeddings.
"""
import math

import numpy as np

from .contract import backward_of, broadcasts_to, count, flag, float_array, one_of, op, real

__all__ = ["sinusoidal_encoding", "rope_frequencies", "yarn_correction_range",
           "yarn_attention_scale", "rope_forward", "rope_backward", "alibi_slopes",
           "alibi_bias"]

_DTYPES = {np.dtype(np.float32): np.float32, np.dtype(np.float64): np.float64}


def _dtype_arg(dtype, where):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in _DTYPES:
        raise TypeError(f"{where}: dtype is {dtype!r}; expected np.float32 or np.float64")
    return dt


# ---------------------------------------------------------------------------
# Sinusoidal absolute encoding
# ---------------------------------------------------------------------------

def sinusoidal_encoding(n_positions, d_model, *, base=10000.0, dtype=np.float64):
    """Sinusoidal positional encoding (003 §7.2, 000 §2.3.2, 004 "through sinusoids").

        PE[p, 2i]   = sin(p / base^(2i / d_model))
        PE[p, 2i+1] = cos(p / base^(2i / d_model))      (same exponent 2i as its sine)

    Positions start at 0. Sine and cosine of one ``i`` share the frequency
    ``omega_i = base^(-2i/d_model)``, so each pair is a point on the unit circle and a
    shift by ``k`` positions is the block-diagonal rotation of 003 §7.2.2. An odd
    ``d_model`` keeps the same rule: the last column is the sine of an unpaired
    frequency.

    n_positions, d_model: positive ints     ->  PE: (n_positions, d_model), ``dtype``
    """
    where = "sinusoidal_encoding"
    n_positions = count(n_positions, "n_positions", where)
    d_model = count(d_model, "d_model", where)
    base = real(base, "base", where, low=1.0, low_open=True)
    dt = _dtype_arg(dtype, where)
    # omega_i for the even column 2i; the odd column 2i+1 reuses omega_i
    omega = base ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)   # (ceil(d/2),)
    angle = np.arange(n_positions, dtype=np.float64)[:, None] * omega          # (n, ceil(d/2))
    pe = np.empty((n_positions, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe.astype(dt, copy=False)


# ---------------------------------------------------------------------------
# RoPE frequencies and their context-extension rescalings
# ---------------------------------------------------------------------------

_SCALING_KEYS = {
    "linear": {"factor"},
    "ntk": {"factor"},
    "yarn": {"factor", "original_max_positions", "beta_fast", "beta_slow", "truncate"},
}
_KEY_ALIASES = {"rope_type": "type", "original_max_position_embeddings": "original_max_positions"}


def _even_dim(d, where, name="d"):
    d = count(d, name, where)
    if d % 2:
        raise ValueError(f"{where}: {name} is {d}; expected an even number (RoPE rotates pairs "
                         "of dimensions)")
    return d


def _read_scaling(scaling, where):
    """Check a ``scaling`` dict and return it with aliases resolved and defaults filled in."""
    if not isinstance(scaling, dict):
        raise TypeError(f"{where}: scaling is a {type(scaling).__name__}; expected None or a dict "
                        "such as {'type': 'linear', 'factor': 2.0}")
    spec = {}
    for key, value in scaling.items():
        key = _KEY_ALIASES.get(key, key)
        if key in spec:
            raise ValueError(f"{where}: scaling gives {key!r} twice (under two names)")
        spec[key] = value
    if "type" not in spec:
        raise ValueError(f"{where}: scaling has no 'type'; expected one of "
                         f"{', '.join(map(repr, _SCALING_KEYS))}")
    kind = one_of(*_SCALING_KEYS)(spec.pop("type"), "scaling['type']", where)
    unknown = set(spec) - _SCALING_KEYS[kind]
    if unknown:
        raise ValueError(f"{where}: scaling of type {kind!r} has unknown key(s) "
                         f"{', '.join(map(repr, sorted(unknown)))}; expected keys "
                         f"{', '.join(map(repr, sorted(_SCALING_KEYS[kind])))}")
    if "factor" not in spec:
        raise ValueError(f"{where}: scaling of type {kind!r} needs a 'factor' (the extension "
                         "factor s = L'/L >= 1)")
    spec["factor"] = real(spec["factor"], "scaling['factor']", where, low=1.0)
    if kind == "yarn":
        if "original_max_positions" not in spec:
            raise ValueError(f"{where}: scaling of type 'yarn' needs 'original_max_positions' "
                             "(the training context L)")
        spec["original_max_positions"] = count(
            spec["original_max_positions"], "scaling['original_max_positions']", where)
        spec["beta_fast"] = real(spec.get("beta_fast", 32.0), "scaling['beta_fast']", where,
                                 low=0.0, low_open=True)
        spec["beta_slow"] = real(spec.get("beta_slow", 1.0), "scaling['beta_slow']", where,
                                 low=0.0, low_open=True)
        if spec["beta_fast"] <= spec["beta_slow"]:
            raise ValueError(f"{where}: scaling has beta_fast={spec['beta_fast']} and beta_slow="
                             f"{spec['beta_slow']}; expected beta_fast > beta_slow (rotation counts "
                             "of the fast and the slow end of the ramp)")
        truncate = spec.get("truncate", True)
        if not isinstance(truncate, (bool, np.bool_)):
            raise TypeError(f"{where}: scaling['truncate'] is {truncate!r}; expected True or False")
        spec["truncate"] = bool(truncate)
    return kind, spec


def yarn_correction_range(d, *, base=10000.0, original_max_positions, beta_fast=32.0,
                          beta_slow=1.0, truncate=True):
    """The planes where YaRN's ramp starts and ends (003 §7.6.1; YaRN paper, "NTK-by-parts").

    Plane ``k`` turns ``r_k = L alpha_k / (2 pi)`` times within the training window
    ``L``. Solving ``r_k = N`` for ``k`` gives the (fractional) plane that turns exactly
    ``N`` times:

        k(N) = d ln(L / (2 pi N)) / (2 ln base)

    ``low = k(beta_fast)`` (planes before it turn more than ``beta_fast`` times) and
    ``high = k(beta_slow)`` (planes after it turn fewer than ``beta_slow`` times). With
    ``truncate`` (the reference code's default) ``low`` is rounded down and ``high`` up;
    ``low`` is clipped at 0 and ``high`` at ``d - 1``.

    Returns ``(low, high)`` as floats. For d=128, base 1e4, L=4096: ``(20.0, 46.0)``.
    """
    where = "yarn_correction_range"
    d = _even_dim(d, where)
    base = real(base, "base", where, low=1.0, low_open=True)
    L = count(original_max_positions, "original_max_positions", where)
    beta_fast = real(beta_fast, "beta_fast", where, low=0.0, low_open=True)
    beta_slow = real(beta_slow, "beta_slow", where, low=0.0, low_open=True)

    def plane_turning(n_rot):
        return d * math.log(L / (2 * math.pi * n_rot)) / (2 * math.log(base))

    low, high = plane_turning(beta_fast), plane_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return float(max(low, 0)), float(min(high, d - 1))


def rope_frequencies(d, *, base=10000.0, scaling=None):
    """RoPE frequencies ``alpha_k`` (003 §7.3, 000 §2.3.3, 001 §3) and their rescalings.

        alpha_k = base^(-2k/d),   k = 0 .. d/2 - 1

    ``scaling`` (``s >= 1`` is the extension factor ``L'/L``):

    * ``None``: the plain frequencies above.
    * ``{"type": "linear", "factor": s}``: position interpolation, every angle divided
      by ``s``: ``alpha_k / s`` (003 §7.4).
    * ``{"type": "ntk", "factor": s}``: NTK-aware base change ``b' = b s^(d/(d-2))``
      (003 §7.5). Plane 0 keeps ``alpha_0 = 1``; the last plane is divided by exactly
      ``s``. Needs ``d >= 4``.
    * ``{"type": "yarn", "factor": s, "original_max_positions": L, "beta_fast": 32,
      "beta_slow": 1}`` (``beta_*`` optional, defaults shown; optional ``"truncate"``,
      default True): YaRN "by-parts" (003 §7.6.1, correcting its direction). Planes that
      turn more than ``beta_fast`` times within ``L`` (high frequency) keep ``alpha_k``;
      planes that turn fewer than ``beta_slow`` times (low frequency) get ``alpha_k / s``;
      in between

          alpha_k' = (1 - ramp_k) alpha_k + ramp_k alpha_k / s,
          ramp_k   = clip((k - low) / (high - low), 0, 1)

      with ``(low, high) = yarn_correction_range(...)``. As in the paper's reference
      code the ramp is linear in the plane index ``k`` between those planes. YaRN's
      temperature is separate: :func:`yarn_attention_scale`.

    The keys ``"rope_type"`` and ``"original_max_position_embeddings"`` are accepted as
    the Hugging Face spellings of ``"type"`` and ``"original_max_positions"``.

    Returns ``alpha``: (d/2,) float64.
    """
    where = "rope_frequencies"
    d = _even_dim(d, where)
    base = real(base, "base", where, low=1.0, low_open=True)
    k = np.arange(d // 2, dtype=np.float64)
    if scaling is None:
        return base ** (-2.0 * k / d)
    kind, spec = _read_scaling(scaling, where)
    s = spec["factor"]
    if kind == "linear":
        # theta = (i / s) alpha_k = i (alpha_k / s): dividing positions = dividing frequencies
        return base ** (-2.0 * k / d) / s
    if kind == "ntk":
        if d < 4:
            raise ValueError(f"{where}: d is {d}; the NTK-aware base b*s^(d/(d-2)) needs d >= 4")
        return (base * s ** (d / (d - 2))) ** (-2.0 * k / d)
    alpha = base ** (-2.0 * k / d)
    low, high = yarn_correction_range(d, base=base,
                                      original_max_positions=spec["original_max_positions"],
                                      beta_fast=spec["beta_fast"], beta_slow=spec["beta_slow"],
                                      truncate=spec["truncate"])
    if high <= low:  # degenerate range (everything clipped): a step instead of a ramp
        high = low + 1e-3
    ramp = np.clip((k - low) / (high - low), 0.0, 1.0)   # 0: keep alpha_k, 1: alpha_k / s
    return (1.0 - ramp) * alpha + ramp * alpha / s


def yarn_attention_scale(factor):
    """YaRN's attention temperature (003 §7.6.2): ``sqrt(1/t) = 0.1 ln(s) + 1``, 1 for ``s <= 1``.

    Multiply both the rotated queries and keys by it (i.e. the logits by its square,
    ``1/t``). ``yarn_attention_scale(4) = 1.1386...``.
    """
    s = real(factor, "factor", "yarn_attention_scale", low=0.0, low_open=True)
    return 1.0 if s <= 1.0 else 0.1 * math.log(s) + 1.0


# ---------------------------------------------------------------------------
# RoPE: forward / backward
# ---------------------------------------------------------------------------

def _rotate_pairs(x, cos, sin, layout):
    """Rotate every plane of ``x`` by the angle whose cosine/sine are given (..., d/2).

    interleaved: planes (x[2k], x[2k+1]);  half: planes (x[k], x[k + d/2]).
        x'_first  = x_first cos - x_second sin
        x'_second = x_second cos + x_first sin
    """
    if layout == "interleaved":
        first, second = x[..., 0::2], x[..., 1::2]
    else:
        h = x.shape[-1] // 2
        first, second = x[..., :h], x[..., h:]
    new_first = first * cos - second * sin
    new_second = second * cos + first * sin
    if layout == "interleaved":
        # stack on a new last axis then flatten: (..., d/2, 2) -> (..., d) puts 2k, 2k+1 side by side
        return np.stack([new_first, new_second], axis=-1).reshape(new_first.shape[:-1] + (-1,))
    return np.concatenate([new_first, new_second], axis=-1)


def _even_pairs(x, name, where, args=None):
    """An array whose last axis d is even (RoPE rotates pairs of dimensions)."""
    if x.shape[-1] % 2:
        raise ValueError(f"{where}: {name} has shape {x.shape}; its last axis d={x.shape[-1]} must "
                         "be even and positive (RoPE rotates pairs of dimensions)")
    return x


def _positions_of_x(positions, name, where, args):
    """Positions, as float64: shape (n,), or a shape ending in n that broadcasts to x.shape[:-1]."""
    if isinstance(positions, (bool, np.bool_)) or positions is None:
        raise TypeError(f"{where}: {name} is {positions!r}; expected an array of positions")
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iuf":
        raise TypeError(f"{where}: {name} has dtype {pos.dtype}; expected integer or float "
                        "positions")
    if pos.dtype.kind == "f" and not np.all(np.isfinite(pos)):
        raise ValueError(f"{where}: {name} contains non-finite values")
    x = args["x"]
    target = x.shape[:-1]
    if not (pos.ndim >= 1 and pos.shape[-1] == target[-1] and broadcasts_to(pos.shape, target)):
        raise ValueError(f"{where}: {name} has shape {pos.shape} but x has shape {x.shape}; "
                         f"expected shape ({target[-1]},) or a shape ending in {target[-1]} that "
                         f"broadcasts to x.shape[:-1] = {target}")
    return pos.astype(np.float64)


def _frequencies_of_x(freqs, name, where, args):
    """None, or (d/2,) finite frequencies alpha_k, kept in float64 (never rounded to x's dtype)."""
    if freqs is None:
        return None
    alpha = float_array(freqs, name, where)
    d = args["x"].shape[-1]
    if alpha.shape != (d // 2,):
        raise ValueError(f"{where}: {name} has shape {alpha.shape} but x has d={d}; expected "
                         f"shape ({d // 2},), one frequency per plane")
    if not np.all(np.isfinite(alpha)):
        raise ValueError(f"{where}: {name} contains non-finite values")
    return alpha.astype(np.float64)


@op("x: (..., n, d)", x=_even_pairs, positions=_positions_of_x, freqs=_frequencies_of_x,
    layout=one_of("interleaved", "half"))
def rope_forward(x, *, positions, freqs=None, base=10000.0, layout="interleaved"):
    """Rotary position embedding (003 §7.3, 000 §2.3.3, 001 §3.1, 004 eq. 1-3).

    Each plane ``k`` of the row at position ``i`` is rotated by ``theta_{i,k} = i alpha_k``:

        x~_{i,2k}   = x_{i,2k} cos(theta_{i,k}) - x_{i,2k+1} sin(theta_{i,k})
        x~_{i,2k+1} = x_{i,2k+1} cos(theta_{i,k}) + x_{i,2k} sin(theta_{i,k})

    ``layout="interleaved"`` uses the notes' planes ``(2k, 2k+1)`` (RoFormer, GPT-J);
    ``layout="half"`` uses planes ``(k, k + d/2)`` (GPT-NeoX, LLaMA ``rotate_half``) --
    the same rotation after permuting the dimensions. Apply it to queries and keys, not
    values, after the projections: then ``q~_i . k~_j`` depends on ``j - i`` only.

    x:         (..., n, d), d even
    positions: (n,) ints or floats, or any shape ending in n that broadcasts to
               x.shape[:-1] (e.g. (batch, 1, n) per-sequence offsets); a cached decoding
               step passes its absolute positions, e.g. ``[t]``
    freqs:     (d/2,) the ``alpha_k`` (e.g. from :func:`rope_frequencies` with a
               ``scaling``); when None, ``base^(-2k/d)`` with ``base``
    returns    out (..., n, d) of x's dtype, cache {"cos", "sin": (..., n, d/2) float64,
               "layout": str}

    Angles, their cosines and sines are formed in float64 and only the output is cast to
    x's dtype, so large positions stay accurate in float32.
    """
    alpha = rope_frequencies(x.shape[-1], base=base) if freqs is None else freqs  # alpha_k
    theta = positions[..., None] * alpha            # (..., n, d/2): theta_{i,k} = i alpha_k
    cos, sin = np.cos(theta), np.sin(theta)
    out = _rotate_pairs(x, cos, sin, layout)        # x~_i = R(theta_i) x_i, plane by plane
    return out, {"cos": cos, "sin": sin, "layout": layout}


@backward_of(rope_forward)
def rope_backward(dout, cache):
    """Gradient of :func:`rope_forward`: rotate ``dout`` back by ``-theta``.

    The forward is ``out = R(theta) x`` plane by plane with ``R`` orthogonal, so
    ``dx = R(theta)^T dout = R(-theta) dout`` (003 §7.3: ``R(theta)^T = R(-theta)``).

    dout: (..., n, d) like the forward's output   ->  dx: (..., n, d)
    """
    # dx = R(-theta) dout: cos(-theta) = cos(theta), sin(-theta) = -sin(theta)
    return _rotate_pairs(dout, cache["cos"], -cache["sin"], cache["layout"])


# ---------------------------------------------------------------------------
# ALiBi: a linear distance bias on the logits
# ---------------------------------------------------------------------------

def _slopes_power_of_two(n):
    # m_h = 2^(-8 (h+1) / n): a geometric sequence from 2^(-8/n) down to 2^-8
    return 2.0 ** (-8.0 * np.arange(1, n + 1, dtype=np.float64) / n)


def alibi_slopes(n_heads):
    """Per-head ALiBi slopes ``m_h`` (Press et al., "Train Short, Test Long").

    For ``n`` a power of two: `m_h = 2^(-8(h+1)/n)`, `h = 0 ... n-1` (8 heads: 1/2 ... 1/256).
    Otherwise, with ``n'`` the largest power of two below ``n``: the ``n'`` slopes of
    ``n'`` heads, then every other slope of ``2n'`` heads (its 1st, 3rd, ...) for the
    remaining ``n - n'`` heads -- the rule of the paper's reference code.

    Returns (n_heads,) float64.
    """
    n = count(n_heads, "n_heads", "alibi_slopes")
    n_pow2 = 1 << (n.bit_length() - 1)          # largest power of two <= n
    slopes = _slopes_power_of_two(n_pow2)
    if n_pow2 == n:
        return slopes
    extra = _slopes_power_of_two(2 * n_pow2)[0::2][: n - n_pow2]
    return np.concatenate([slopes, extra])


def alibi_bias(n_heads, n_q, n_k, *, causal=True, dtype=np.float64):
    """ALiBi (004 eq. 13): a bias on the attention logits that falls off linearly with the
    distance from the query, one slope per head (Press et al.).

    004 eq. 13 is the slope-1 case: query i (of keys 1..n) gets

        alpha_i = softmax(k_{1:n} q_i + b_i),   b_i = [-(i-1), ..., -1, 0, -1, ..., -(n-i)]

    (the notes print the ends as -i and -n: see the errata). ALiBi scales b by a slope
    m_h per head (:func:`alibi_slopes`):

        bias[h, i, j] = m_h * b_i[j] = -m_h |p_i - j|

    Query ``i`` sits at absolute position ``p_i = n_k - n_q + i`` and key ``j`` at ``j``
    (the convention of ``causal_mask``, so a KV-cached step with ``n_q = 1`` gets the
    last row).

    * ``causal=False``: the whole of b, symmetric (an encoder).
    * ``causal=True``: b for the keys at or before the query; future keys get bias 0. The
      bias stays finite -- removing the future is the causal mask's job (pass
      ``mask=causal_mask(n_q, n_k)`` as well).

    Returns (n_heads, n_q, n_k) of ``dtype``.
    """
    where = "alibi_bias"
    n_heads = count(n_heads, "n_heads", where)
    n_q = count(n_q, "n_q", where)
    n_k = count(n_k, "n_k", where)
    causal = flag(causal, "causal", where)
    dt = _dtype_arg(dtype, where)
    p = np.arange(n_k - n_q, n_k)[:, None]         # p_i: query i's position, (n_q, 1)
    j = np.arange(n_k)[None, :]                    # key j's position, (1, n_k)
    b = -np.abs(p - j)                             # b_i[j] = -|p_i - j|   (004 eq. 13, slope 1)
    if causal:
        b = np.where(j <= p, b, 0)                 # future keys: 0 (the causal mask removes them)
    m = alibi_slopes(n_heads)                      # m_h, one slope per head
    return (m[:, None, None] * b[None]).astype(dt)  # bias[h, i, j] = m_h b_i[j]
