"""The recurrent encoder-decoder with additive attention (Bahdanau et al. 2014), the model the
transformer replaced: GRU cell, encoder, decoder, forward, backward through time, loss and
greedy decoding.

Covers 002 "Seq2seq meets attention", "Encoder-decoder" and "Hidden state of the decoder"
(the GRU with the context term), and the alignment scores of 003 §5.1 (``e_tj = a(s_{t-1}, h_j)``).

    encoder:   e'_s = E'[x'_s],   h'_s = GRU(e'_s, h'_{s-1})            s = 1 .. L_0
               (bidirectional: h'_s = [fwd h'_s ; bwd h'_s], the backward GRU reading
               x'_{L_0} .. x'_1, as in Bahdanau et al.)
    init:      h_0 = tanh(h'_fin W_init + b_init)   (h'_fin: the final state of the forward
               GRU, or of the backward GRU when bidirectional, as Bahdanau's s_0 = tanh(W_s bwd h'_1))
    decoder, for t = 1 .. T, reading e_t = E[x_t] (teacher forcing: x_t is the previous target word):
               alpha_ts = softmax_s( v_a . tanh(h_{t-1} W_ah + h'_s W'_ah) )   (padding masked)
               c_t      = sum_s alpha_ts h'_s
               h_t      = GRU(e_t, h_{t-1}, c_t)                               (gates below)
               y_t      = softmax(h_t W_yh + e_t W_ye + c_t W_yc + b_y)        (002 "Encoder-decoder")

The GRU of 002 "Hidden state of the decoder", in row form (the slides' ``W_rh h_{t-1}`` is
``h_{t-1} W_rh`` here), with biases, which the slides leave out:

    R_t       = sigma(h_{t-1} W_rh + e_t W_re + c_t W_rc + b_r)          reset gate
    Z_t       = sigma(h_{t-1} W_zh + e_t W_ze + c_t W_zc + b_z)          update gate
    h~_t      = tanh((R_t * h_{t-1}) W_hh + e_t W_he + c_t W_hc + b_h)    candidate (the slides' sigma_h)
    h_t       = Z_t * h_{t-1} + (1 - Z_t) * h~_t

The encoder's GRU is the same cell without the context term. Bahdanau et al. write the last
line as ``(1 - z) s_{i-1} + z s~``: the same family, with ``Z`` standing for ``1 - z``.

Two points where the slides cannot be taken literally (README errata):

- The query of the attention is the PREVIOUS decoder state h_{t-1}. The slides write
  ``c_t = c_t(x', h_t)`` with query ``h_t``, but ``h_t`` is computed from ``c_t`` -- a circular
  definition. Bahdanau et al. (eq. 6) score ``a(s_{i-1}, h_j)``, as does 003 §5.1
  (``e_tj = s_{t-1}^T h_j``).
- The score has a tanh: ``v_a . tanh(h W_ah + h' W'_ah)``. Without it (002 "Seq2seq meets
  attention" prints ``v_a^T (W_ah h_t + W'_ah h'_s)``) the query term is the same for every
  source position s and the softmax cancels it: the weights would not depend on the decoder
  at all. The scoring op (``additive_attention_forward``, 002 last slide) has the tanh.

Parameter keys (:func:`rnn_seq2seq_param_shapes`; ``d = d_hidden``, ``d_enc = d`` or ``2d``
when bidirectional). The three gates are stacked in column blocks ``[r | z | h~]``, so
``W_e = [W_re | W_ze | W_he]`` and likewise ``W_h``, ``W_c``, ``b = [b_r | b_z | b_h]``:

    enc.E (src_vocab_size, d_emb)             source embeddings E'
    enc.W_e (d_emb, 3d), enc.W_h (d, 3d), enc.b (3d,)               encoder GRU (forward)
    enc_rev.W_e, enc_rev.W_h, enc_rev.b                             backward GRU (bidirectional only)
    attn.Wq (d, d_attn), attn.Wk (d_enc, d_attn), attn.w (d_attn,)  the slides' W_ah, W'_ah, v_a
    dec.E (tgt_vocab_size, d_emb)             target embeddings E
    dec.W_init (d, d), dec.b_init (d,)        initial decoder state
    dec.W_e (d_emb, 3d), dec.W_h (d, 3d), dec.W_c (d_enc, 3d), dec.b (3d,)   decoder GRU
    out.W_yh (d, V), out.W_ye (d_emb, V), out.W_yc (d_enc, V), out.b_y (V,)   output layer
"""
from dataclasses import asdict, dataclass, fields
import math

import numpy as np

from . import _validate as v
from .embedding import embedding_backward, embedding_forward
from .linear import linear_backward, linear_forward
from .losses import cross_entropy_backward, cross_entropy_forward
from .scoring import additive_attention_backward, additive_attention_forward

__all__ = [
    "gru_cell_forward", "gru_cell_backward",
    "RNNSeq2SeqConfig", "rnn_seq2seq_param_shapes", "init_seq2seq_rnn",
    "rnn_seq2seq_forward", "rnn_seq2seq_backward", "rnn_seq2seq_loss", "rnn_seq2seq_generate",
]


def _sigmoid(x):
    """sigma(x) = (1 + tanh(x/2)) / 2: the logistic function without overflow, in x's dtype."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _rows(x):
    """(..., d) -> (N, d): every leading axis stacked into rows (for the weight gradients)."""
    return x.reshape(-1, x.shape[-1])


# ---------------------------------------------------------------------------------------
# The GRU cell with the context term (002 "Hidden state of the decoder")
# ---------------------------------------------------------------------------------------

def _gru_cell(e, h_prev, W_e, W_h, b, c, W_c):
    """The cell's arithmetic, inputs already checked and of one dtype."""
    d = h_prev.shape[-1]
    P = e @ W_e                                   # (..., 3d): e_t [W_re | W_ze | W_he]
    if b is not None:
        P = P + b
    if c is not None:
        P = P + c @ W_c                           # + c_t [W_rc | W_zc | W_hc]
    P_rz = P[..., :2 * d] + h_prev @ W_h[:, :2 * d]   # + h_{t-1} [W_rh | W_zh]
    R = _sigmoid(P_rz[..., :d])                   # reset gate R_t
    Z = _sigmoid(P_rz[..., d:])                   # update gate Z_t
    Rh = R * h_prev                               # R_t * h_{t-1}
    h_tilde = np.tanh(P[..., 2 * d:] + Rh @ W_h[:, 2 * d:])   # candidate h~_t
    h = Z * h_prev + (1.0 - Z) * h_tilde          # h_t = Z h_{t-1} + (1 - Z) h~_t
    cache = {"e": e, "h_prev": h_prev, "c": c, "W_e": W_e, "W_h": W_h, "W_c": W_c,
             "has_b": b is not None, "R": R, "Z": Z, "Rh": Rh, "h_tilde": h_tilde,
             "dtype": h.dtype, "out_shape": h.shape}
    return h, cache


def _gru_cell_backward(dh, cache):
    """Gradients (de, dh_prev, dW_e, dW_h, db, dc, dW_c) of one step, dh already checked."""
    e, h_prev, c, W_e, W_h, W_c = (cache[k] for k in ("e", "h_prev", "c", "W_e", "W_h", "W_c"))
    R, Z, Rh, h_tilde = cache["R"], cache["Z"], cache["Rh"], cache["h_tilde"]
    d = h_prev.shape[-1]
    dZ = dh * (h_prev - h_tilde)                  # h = Z h_prev + (1-Z) h~  ->  dZ = dh (h_prev - h~)
    dh_prev = dh * Z                              #                          ->  dh_prev = dh Z (direct path)
    dP_h = dh * (1.0 - Z) * (1.0 - h_tilde * h_tilde)   # h~ = tanh(P_h): dP_h = dh (1-Z)(1 - h~^2)
    dP_z = dZ * Z * (1.0 - Z)                     # Z = sigma(P_z)  ->  dP_z = dZ Z (1 - Z)
    dRh = dP_h @ W_h[:, 2 * d:].T                 # P_h has (R h_prev) W_hh  ->  d(Rh) = dP_h W_hh^T
    dR = dRh * h_prev                             # Rh = R h_prev  ->  dR = d(Rh) h_prev
    dh_prev = dh_prev + dRh * R                   #                ->  dh_prev += d(Rh) R
    dP_r = dR * R * (1.0 - R)                     # R = sigma(P_r)  ->  dP_r = dR R (1 - R)
    dP_rz = np.concatenate([dP_r, dP_z], axis=-1)  # (..., 2d)
    dP = np.concatenate([dP_rz, dP_h], axis=-1)   # (..., 3d): blocks [r | z | h~]
    dh_prev = dh_prev + dP_rz @ W_h[:, :2 * d].T  # P_rz has h_prev [W_rh | W_zh]
    de = dP @ W_e.T                               # P = e W_e + ...  ->  de = dP W_e^T
    dW_e = _rows(e).T @ _rows(dP)                 #                  ->  dW_e = sum over rows e^T dP
    dW_h = np.concatenate([_rows(h_prev).T @ _rows(dP_rz),    # [W_rh | W_zh]: h_prev^T dP_rz
                           _rows(Rh).T @ _rows(dP_h)], axis=-1)  # W_hh: (R h_prev)^T dP_h
    db = _rows(dP).sum(axis=0) if cache["has_b"] else None   # db = dP summed over rows
    dc = dW_c = None
    if c is not None:
        dc = dP @ W_c.T                           # P has c W_c  ->  dc = dP W_c^T
        dW_c = _rows(c).T @ _rows(dP)             #              ->  dW_c = c^T dP
    return de, dh_prev, dW_e, dW_h, db, dc, dW_c


def gru_cell_forward(e, h_prev, W_e, W_h, b=None, c=None, W_c=None):
    """One GRU step with an optional context term (002 "Hidden state of the decoder";
    Cho et al. 2014; the decoder of Bahdanau et al. 2014).

        R_t  = sigma(h_{t-1} W_rh + e_t W_re + c_t W_rc + b_r)
        Z_t  = sigma(h_{t-1} W_zh + e_t W_ze + c_t W_zc + b_z)
        h~_t = tanh((R_t * h_{t-1}) W_hh + e_t W_he + c_t W_hc + b_h)
        h_t  = Z_t * h_{t-1} + (1 - Z_t) * h~_t

    The gates' weights are stacked in column blocks [r | z | h~]:
    e: (..., d_e)   h_prev: (..., d)   W_e: (d_e, 3d) = [W_re | W_ze | W_he]
    W_h: (d, 3d) = [W_rh | W_zh | W_hh]   b: (3d,) or None
    c: (..., d_c) or None (no context: the encoder's GRU)   W_c: (d_c, 3d) or None
    ->  h: (..., d).   e, h_prev and c share their leading axes.

    cache keys: "e", "h_prev", "c", "W_e", "W_h", "W_c", "has_b", "R", "Z", "Rh" (R * h_prev),
    "h_tilde", "dtype", "out_shape".
    """
    where = "gru_cell_forward"
    e = v.float_array(e, "e", where)
    h_prev = v.float_array(h_prev, "h_prev", where)
    W_e = v.float_array(W_e, "W_e", where)
    W_h = v.float_array(W_h, "W_h", where)
    b = v.optional_float_array(b, "b", where)
    c = v.optional_float_array(c, "c", where)
    W_c = v.optional_float_array(W_c, "W_c", where)
    v.min_ndim(e, 1, "e", where, "(..., d_e)")
    v.min_ndim(h_prev, 1, "h_prev", where, "(..., d)")
    d = h_prev.shape[-1]
    if W_h.shape != (d, 3 * d):
        raise ValueError(f"{where}: W_h has shape {W_h.shape} but h_prev has shape {h_prev.shape}; "
                         f"expected W_h of shape ({d}, {3 * d}) = (d, 3d), the blocks [W_rh | W_zh | W_hh]")
    if W_e.shape != (e.shape[-1], 3 * d):
        raise ValueError(f"{where}: W_e has shape {W_e.shape}; expected ({e.shape[-1]}, {3 * d}) = "
                         f"(d_e, 3d) for e of shape {e.shape} and h_prev of shape {h_prev.shape}")
    if e.shape[:-1] != h_prev.shape[:-1]:
        raise ValueError(f"{where}: e has shape {e.shape} but h_prev has shape {h_prev.shape}; "
                         "expected the same leading (batch) axes")
    if b is not None and b.shape != (3 * d,):
        raise ValueError(f"{where}: b has shape {b.shape}; expected ({3 * d},) = (3d,), the blocks "
                         "[b_r | b_z | b_h]")
    if (c is None) != (W_c is None):
        raise ValueError(f"{where}: c is {'None' if c is None else 'given'} but W_c is "
                         f"{'None' if W_c is None else 'given'}; expected both or neither")
    if c is not None:
        v.min_ndim(c, 1, "c", where, "(..., d_c)")
        if c.shape[:-1] != h_prev.shape[:-1]:
            raise ValueError(f"{where}: c has shape {c.shape} but h_prev has shape {h_prev.shape}; "
                             "expected the same leading (batch) axes")
        if W_c.shape != (c.shape[-1], 3 * d):
            raise ValueError(f"{where}: W_c has shape {W_c.shape}; expected ({c.shape[-1]}, {3 * d}) "
                             "= (d_c, 3d), the blocks [W_rc | W_zc | W_hc]")
    dt = v.result_dtype(e, h_prev, W_e, W_h, b, c, W_c)
    cast = lambda a: None if a is None else a.astype(dt, copy=False)   # noqa: E731
    return _gru_cell(cast(e), cast(h_prev), cast(W_e), cast(W_h), cast(b), cast(c), cast(W_c))


def gru_cell_backward(dh, cache):
    """Gradient of :func:`gru_cell_forward`: ``(de, dh_prev, dW_e, dW_h, db, dc, dW_c)``,
    ``db`` None without b and ``dc``, ``dW_c`` None without a context.

        dZ = dh (h_prev - h~),  dP_z = dZ Z (1 - Z),  dP_h = dh (1 - Z)(1 - h~^2)
        d(R h_prev) = dP_h W_hh^T,  dP_r = d(R h_prev) h_prev R (1 - R)
        dh_prev = dh Z + d(R h_prev) R + [dP_r | dP_z] [W_rh | W_zh]^T
        then every input x of the stacked pre-activation P: dx = dP W_x^T, dW_x = x^T dP
    """
    where = "gru_cell_backward"
    dh = v.float_array(dh, "dh", where)
    if dh.shape != cache["out_shape"]:
        raise ValueError(f"{where}: dh has shape {dh.shape}; expected the forward output's shape "
                         f"{cache['out_shape']}")
    return _gru_cell_backward(dh.astype(cache["dtype"], copy=False), cache)


# ---------------------------------------------------------------------------------------
# The config and the parameters
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RNNSeq2SeqConfig:
    """The shape of the recurrent encoder-decoder with attention (module docstring).

    src_vocab_size, tgt_vocab_size: the two vocabularies
    d_emb: word embedding size (source and target);  d_hidden: GRU state size d
    d_attn: size of the attention's tanh layer (defaults to d_hidden)
    bidirectional: encoder of two GRUs, one per direction (Bahdanau et al.); h'_s has 2d entries
    """
    src_vocab_size: int
    tgt_vocab_size: int
    d_emb: int = 32
    d_hidden: int = 64
    d_attn: int = None
    bidirectional: bool = False

    def __post_init__(self):
        where = "RNNSeq2SeqConfig"
        for name in ("src_vocab_size", "tgt_vocab_size", "d_emb", "d_hidden"):
            v.positive_int(getattr(self, name), name, where)
        if self.d_attn is None:
            object.__setattr__(self, "d_attn", self.d_hidden)
        v.positive_int(self.d_attn, "d_attn", where)
        if not isinstance(self.bidirectional, (bool, np.bool_)):
            raise TypeError(f"{where}: bidirectional is {self.bidirectional!r}; expected True or False")

    @property
    def d_enc(self):
        """Size of an encoder state h'_s (and of the context c_t)."""
        return 2 * self.d_hidden if self.bidirectional else self.d_hidden

    def to_dict(self):
        """A plain dict (JSON-ready) of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        if not isinstance(d, dict):
            raise TypeError(f"{cls.__name__}.from_dict: d is a {type(d).__name__}; expected a dict")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"{cls.__name__}.from_dict: unknown keys {unknown}; expected keys among "
                             f"{sorted(f.name for f in fields(cls))}")
        return cls(**d)


def _check_config(config, where):
    if not isinstance(config, RNNSeq2SeqConfig):
        raise TypeError(f"{where}: config is a {type(config).__name__}; expected an RNNSeq2SeqConfig")
    return config


def rnn_seq2seq_param_shapes(config):
    """``{key: shape}`` of every parameter (keys in the module docstring)."""
    c = _check_config(config, "rnn_seq2seq_param_shapes")
    d, de, V = c.d_hidden, c.d_emb, c.tgt_vocab_size
    s = {"enc.E": (c.src_vocab_size, de),
         "enc.W_e": (de, 3 * d), "enc.W_h": (d, 3 * d), "enc.b": (3 * d,)}
    if c.bidirectional:
        s.update({"enc_rev.W_e": (de, 3 * d), "enc_rev.W_h": (d, 3 * d), "enc_rev.b": (3 * d,)})
    s.update({"attn.Wq": (d, c.d_attn), "attn.Wk": (c.d_enc, c.d_attn), "attn.w": (c.d_attn,),
              "dec.E": (V, de), "dec.W_init": (d, d), "dec.b_init": (d,),
              "dec.W_e": (de, 3 * d), "dec.W_h": (d, 3 * d), "dec.W_c": (c.d_enc, 3 * d),
              "dec.b": (3 * d,),
              "out.W_yh": (d, V), "out.W_ye": (de, V), "out.W_yc": (c.d_enc, V), "out.b_y": (V,)})
    return s


def _orthogonal(rng, n):
    """A random n x n orthogonal matrix (QR of a Gaussian matrix, signs fixed by diag(R))."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def init_seq2seq_rnn(config, *, rng, dtype=np.float32):
    """Initial parameters, a flat ``dict[str, ndarray]`` (keys in the module docstring).

    Embeddings ~ N(0, 1); each gate block of a recurrent matrix ``W_h`` a random orthogonal
    matrix (as Bahdanau et al.); every other matrix ~ N(0, 1/fan_in), so pre-activations
    start O(1); ``attn.w`` ~ N(0, 1/d_attn); biases 0.
    rng: np.random.Generator;  dtype: np.float32 (default) or np.float64
    """
    where = "init_seq2seq_rnn"
    c = _check_config(config, where)
    v.rng_arg(rng, where)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{where}: dtype is {dtype!r}; expected np.float32 or np.float64")
    params = {}
    for key, shape in rnn_seq2seq_param_shapes(c).items():
        name = key.rsplit(".", 1)[-1]
        if name == "E":
            a = rng.standard_normal(shape)
        elif name == "W_h":
            a = np.concatenate([_orthogonal(rng, shape[0]) for _ in range(3)], axis=1)
        elif name.startswith("b"):
            a = np.zeros(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(shape[0])
        params[key] = a.astype(dt)
    return params


def _check_params(params, config, where):
    """Every key of the config present with its shape, one float dtype; returns that dtype."""
    shapes = rnn_seq2seq_param_shapes(config)
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params is a {type(params).__name__}; expected a dict of arrays")
    missing = [k for k in shapes if k not in params]
    extra = [k for k in params if k not in shapes]
    if missing or extra:
        raise ValueError(f"{where}: params has missing keys {missing} and unexpected keys {extra}; "
                         "expected the keys of init_seq2seq_rnn for this config")
    dtypes = set()
    for k, shape in shapes.items():
        p = v.float_array(params[k], f"params[{k!r}]", where)
        if p.shape != shape:
            raise ValueError(f"{where}: params[{k!r}] has shape {p.shape}; expected {shape} for this config")
        dtypes.add(p.dtype)
    if len(dtypes) > 1:
        raise TypeError(f"{where}: params mix dtypes {sorted(map(str, dtypes))}; expected one float "
                        "dtype for every parameter")
    return dtypes.pop()


def _check_ids(ids, name, vocab, where):
    ids = v.int_array(ids, name, where, low=0, high=vocab)
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} has shape {ids.shape}; expected (batch, length) with length >= 1")
    return ids


def _check_src_mask(src_mask, src_ids, where):
    """(B, S) bool, True = real source word; None = no padding."""
    if src_mask is None:
        return np.ones(src_ids.shape, dtype=bool)
    src_mask = np.asarray(src_mask)
    if src_mask.dtype != np.bool_:
        raise TypeError(f"{where}: src_mask has dtype {src_mask.dtype}; expected a bool array "
                        "(True = real source word, False = padding)")
    if src_mask.shape != src_ids.shape:
        raise ValueError(f"{where}: src_mask has shape {src_mask.shape} but src_ids has shape "
                         f"{src_ids.shape}; expected the same shape")
    return src_mask


# ---------------------------------------------------------------------------------------
# Encoder: a GRU over the source embeddings, padding skipped
# ---------------------------------------------------------------------------------------

def _gru_scan_forward(X, mask, W_e, W_h, b, *, reverse):
    """Run the GRU over X (B, S, d_e) left to right (or right to left).

        h'_s = GRU(e'_s, h'_{s-1}) where mask[:, s], else h'_{s-1}

    A padded position keeps the previous state, so padding never changes the states of
    real words and the final state is that of the last real word read.
    Returns H (B, S, d) (H[:, s] = state after reading position s), the final state, cache.
    """
    B, S, _ = X.shape
    h = np.zeros((B, W_h.shape[0]), dtype=X.dtype)   # h'_0 = 0
    H = np.empty((B, S, W_h.shape[0]), dtype=X.dtype)
    steps = []
    order = range(S - 1, -1, -1) if reverse else range(S)
    for s in order:
        h_new, cs = _gru_cell(X[:, s], h, W_e, W_h, b, None, None)
        h = np.where(mask[:, s, None], h_new, h)     # padding: keep h'_{s-1}
        H[:, s] = h
        steps.append((s, cs))
    return H, h, {"steps": steps, "mask": mask, "d_e": X.shape[-1]}


def _gru_scan_backward(dH, dh_final, cache):
    """Backward through time of :func:`_gru_scan_forward`: (dX, dW_e, dW_h, db)."""
    mask = cache["mask"]
    B, S, _ = dH.shape
    dX = np.zeros((B, S, cache["d_e"]), dtype=dH.dtype)
    dW_e = dW_h = db = 0.0
    dh = dh_final
    for s, cs in reversed(cache["steps"]):
        dh = dh + dH[:, s]                            # H[:, s] is read by attention and the next step
        m = mask[:, s, None]
        dh_new = np.where(m, dh, 0.0)                 # h = where(m, h_new, h_prev): the taken branch
        dX[:, s], dh_prev, gW_e, gW_h, gb, _, _ = _gru_cell_backward(dh_new, cs)
        dW_e, dW_h, db = dW_e + gW_e, dW_h + gW_h, db + gb
        dh = np.where(m, dh_prev, dh)                 # padded: the state passed straight through
    return dX, dW_e, dW_h, db


def _encoder_forward(params, src_ids, src_mask, c):
    """Encoder states H' (B, S, d_enc), the state h'_fin that starts the decoder, cache."""
    X, c_emb = embedding_forward(src_ids, params["enc.E"])    # e'_s = E'[x'_s]
    H, h_fin, c_fwd = _gru_scan_forward(X, src_mask, params["enc.W_e"], params["enc.W_h"],
                                        params["enc.b"], reverse=False)
    cache = {"emb": c_emb, "fwd": c_fwd}
    if c.bidirectional:
        H_rev, h_fin, cache["rev"] = _gru_scan_forward(X, src_mask, params["enc_rev.W_e"],
                                                       params["enc_rev.W_h"], params["enc_rev.b"],
                                                       reverse=True)
        H = np.concatenate([H, H_rev], axis=-1)       # h'_s = [fwd h'_s ; bwd h'_s]
    return H, h_fin, cache


def _encoder_backward(dH, dh_fin, cache, c, grads):
    d = c.d_hidden
    if c.bidirectional:
        dX_rev, *g_rev = _gru_scan_backward(dH[..., d:], dh_fin, cache["rev"])
        grads.update(zip(("enc_rev.W_e", "enc_rev.W_h", "enc_rev.b"), g_rev))
        dX, *g = _gru_scan_backward(dH[..., :d], np.zeros_like(dh_fin), cache["fwd"])
        dX = dX + dX_rev                              # both directions read the same embeddings
    else:
        dX, *g = _gru_scan_backward(dH, dh_fin, cache["fwd"])
    grads.update(zip(("enc.W_e", "enc.W_h", "enc.b"), g))
    grads["enc.E"] = embedding_backward(dX, cache["emb"])[1]


# ---------------------------------------------------------------------------------------
# Decoder: attention on h_{t-1}, GRU with context, output layer
# ---------------------------------------------------------------------------------------

def _decoder_init(params, h_fin):
    """h_0 = tanh(h'_fin W_init + b_init)."""
    pre, c_lin = linear_forward(h_fin, params["dec.W_init"], params["dec.b_init"])
    h0 = np.tanh(pre)
    return h0, {"lin": c_lin, "h0": h0}


def _decoder_step(params, e_t, h_prev, H, attn_mask):
    """One step: c_t from the query h_{t-1}, then h_t = GRU(e_t, h_{t-1}, c_t).

    e_t (B, d_emb), h_prev (B, d), H (B, S, d_enc), attn_mask (B, 1, S)
    -> h_t (B, d), c_t (B, d_enc), alpha_t (B, S), step cache
    """
    # (B, d) -> (B, 1, d): one query row per sentence
    ctx, c_att = additive_attention_forward(h_prev[:, None, :], H, H, params["attn.Wq"],
                                            params["attn.Wk"], params["attn.w"], mask=attn_mask)
    ctx = ctx[:, 0, :]                                # c_t = sum_s alpha_ts h'_s, (B, d_enc)
    h, c_gru = _gru_cell(e_t, h_prev, params["dec.W_e"], params["dec.W_h"], params["dec.b"],
                         ctx, params["dec.W_c"])
    return h, ctx, c_att["weights"][:, 0, :], {"att": c_att, "gru": c_gru}


def _output_forward(params, Hd, Ed, C):
    """logits = h_t W_yh + e_t W_ye + c_t W_yc + b_y (002 "Encoder-decoder"), any leading axes."""
    z_h, c_h = linear_forward(Hd, params["out.W_yh"], params["out.b_y"])
    z_e, c_e = linear_forward(Ed, params["out.W_ye"])
    z_c, c_c = linear_forward(C, params["out.W_yc"])
    return z_h + z_e + z_c, (c_h, c_e, c_c)


def rnn_seq2seq_forward(params, src_ids, tgt_in_ids, *, config, src_mask=None):
    """Forward pass of the recurrent encoder-decoder (module docstring): ``(logits, cache)``.

    params:     dict from :func:`init_seq2seq_rnn`
    src_ids:    (B, S) source ids in [0, src_vocab_size)
    tgt_in_ids: (B, T) decoder inputs x_1 .. x_T in [0, tgt_vocab_size) (teacher forcing:
                the target shifted right behind a start token)
    src_mask:   optional (B, S) bool, True = real source word, False = padding: padding is
                skipped by the encoder GRU(s) and never attended to
    returns logits (B, T, tgt_vocab_size) (before the softmax of y_t), cache

    cache keys for readers: "weights" (B, T, S) attention weights alpha_ts (row t: where the
    decoder looked to predict the word after x_t; the alignment table), "enc_states" H'
    (B, S, d_enc), "dec_states" h_1 .. h_T (B, T, d), "h0" (B, d), "contexts" c_t (B, T, d_enc).
    """
    where = "rnn_seq2seq_forward"
    c = _check_config(config, where)
    dtype = _check_params(params, c, where)
    src_ids = _check_ids(src_ids, "src_ids", c.src_vocab_size, where)
    tgt_in_ids = _check_ids(tgt_in_ids, "tgt_in_ids", c.tgt_vocab_size, where)
    if src_ids.shape[0] != tgt_in_ids.shape[0]:
        raise ValueError(f"{where}: src_ids has shape {src_ids.shape} and tgt_in_ids has shape "
                         f"{tgt_in_ids.shape}; expected the same batch size")
    src_mask = _check_src_mask(src_mask, src_ids, where)
    B, T = tgt_in_ids.shape

    H, h_fin, c_enc = _encoder_forward(params, src_ids, src_mask, c)
    h, c_init = _decoder_init(params, h_fin)
    Ed, c_emb = embedding_forward(tgt_in_ids, params["dec.E"])   # e_t = E[x_t], (B, T, d_emb)
    attn_mask = src_mask[:, None, :]                  # (B, 1, S): one query row per step
    Hd = np.empty((B, T, c.d_hidden), dtype=dtype)
    C = np.empty((B, T, c.d_enc), dtype=dtype)
    A = np.empty((B, T, src_ids.shape[1]), dtype=dtype)
    steps = []
    for t in range(T):                                # the recurrence: one step per target word
        h, C[:, t], A[:, t], cs = _decoder_step(params, Ed[:, t], h, H, attn_mask)
        Hd[:, t] = h
        steps.append(cs)
    logits, c_out = _output_forward(params, Hd, Ed, C)
    cache = {"config": c, "dtype": dtype, "enc": c_enc, "init": c_init, "emb": c_emb,
             "steps": steps, "out": c_out, "logits_shape": logits.shape,
             "weights": A, "enc_states": H, "dec_states": Hd, "h0": c_init["h0"], "contexts": C}
    return logits, cache


def rnn_seq2seq_backward(dlogits, cache):
    """Backward of :func:`rnn_seq2seq_forward` through time: a dict of gradients with the
    keys of ``params``.

    Output layer for all steps at once; then the decoder steps in reverse order, where the
    state gradient is  dh_{t-1} = (GRU's dh_prev) + (attention's dq)  and every step adds
    its attention's dK + dV to dH' (the encoder states are both keys and values);
    then h_0 = tanh(...), and the encoder GRU(s) in reverse order.
    """
    where = "rnn_seq2seq_backward"
    c = cache["config"]
    dlogits = v.upstream(dlogits, "dlogits", where, cache["logits_shape"], cache["dtype"],
                         what="the logits'")
    grads = {}
    c_h, c_e, c_c = cache["out"]
    dHd, grads["out.W_yh"], grads["out.b_y"] = linear_backward(dlogits, c_h)   # logits = ... + h_t W_yh + b_y
    dEd, grads["out.W_ye"], _ = linear_backward(dlogits, c_e)                 # ... + e_t W_ye
    dC, grads["out.W_yc"], _ = linear_backward(dlogits, c_c)                  # ... + c_t W_yc
    dEd = dEd.copy()                                  # the GRU's de_t is added below

    H = cache["enc_states"]
    dH = np.zeros_like(H)
    names = ("dec.W_e", "dec.W_h", "dec.b", "dec.W_c", "attn.Wq", "attn.Wk", "attn.w")
    acc = dict.fromkeys(names, 0.0)
    dh = np.zeros_like(cache["h0"])                   # nothing after h_T
    for t in range(len(cache["steps"]) - 1, -1, -1):
        cs = cache["steps"][t]
        dh = dh + dHd[:, t]                           # h_t feeds the output layer and step t+1
        de, dh_prev, gW_e, gW_h, gb, dctx, gW_c = _gru_cell_backward(dh, cs["gru"])
        dEd[:, t] += de
        dctx = dctx + dC[:, t]                        # c_t feeds the GRU and the output layer
        dq, dK, dV, gWq, gWk, gw = additive_attention_backward(dctx[:, None, :], cs["att"])
        dH += dK + dV                                 # K = V = H'
        dh = dh_prev + dq[:, 0, :]                    # h_{t-1}: previous state and the query
        for k, g in zip(names, (gW_e, gW_h, gb, gW_c, gWq, gWk, gw)):
            acc[k] = acc[k] + g
    grads.update(acc)
    grads["dec.E"] = embedding_backward(dEd, cache["emb"])[1]

    h0 = cache["init"]["h0"]
    dpre = dh * (1.0 - h0 * h0)                       # h_0 = tanh(pre)  ->  dpre = dh_0 (1 - h_0^2)
    dh_fin, grads["dec.W_init"], grads["dec.b_init"] = linear_backward(dpre, cache["init"]["lin"])
    _encoder_backward(dH, dh_fin, cache["enc"], c, grads)
    return {k: grads[k] for k in rnn_seq2seq_param_shapes(c)}


def rnn_seq2seq_loss(params, batch, *, config, label_smoothing=0.0):
    """Mean cross-entropy of the next target word and the gradients: ``(loss, grads)``.

    batch: a dict (a batch of :func:`make_translation`'s arrays) with
        ``"src_ids"`` (B, S), ``"tgt_ids"`` (B, T+1) = ``<bos> words <eos> <pad>...``,
        optional ``"src_mask"`` (B, S) bool (True = real word) and ``"loss_mask"`` (B, T+1)
        bool (True where a word is to be predicted; default: everywhere after position 0).
    The decoder reads ``tgt_ids[:, :-1]`` and is scored on ``tgt_ids[:, 1:]`` where
    ``loss_mask[:, 1:]`` (mean over those positions, 003 eq. 2.2). loss is a Python float.
    """
    where = "rnn_seq2seq_loss"
    tgt = v.seq2seq_targets(batch, where)
    loss_mask = batch.get("loss_mask")
    if loss_mask is None:
        loss_mask = np.ones(tgt.shape, dtype=bool)
    loss_mask = np.asarray(loss_mask)
    if loss_mask.dtype != np.bool_ or loss_mask.shape != tgt.shape:
        raise ValueError(f"{where}: batch['loss_mask'] has dtype {loss_mask.dtype} and shape "
                         f"{loss_mask.shape}; expected a bool array of tgt_ids' shape {tgt.shape}")
    logits, cache = rnn_seq2seq_forward(params, batch["src_ids"], tgt[:, :-1], config=config,
                                        src_mask=batch.get("src_mask"))
    targets = np.where(loss_mask[:, 1:], tgt[:, 1:], -1)   # -1: left out of the mean
    loss, c_loss = cross_entropy_forward(logits, targets, label_smoothing=label_smoothing,
                                         ignore_index=-1)
    dlogits, _ = cross_entropy_backward(1.0, c_loss)
    return float(loss), rnn_seq2seq_backward(dlogits, cache)


def rnn_seq2seq_generate(params, src_ids, *, config, max_new_tokens, bos_id, eos_id=None,
                         src_mask=None, return_weights=False):
    """Greedy decoding: encode the source once, start from ``bos_id`` and feed back the most
    probable word, one GRU step per word (the recurrence carries everything: no KV cache).

    eos_id: a row that has produced it is filled with ``eos_id`` from then on; the loop stops
            once every row has.
    returns (B, 1 + max_new_tokens) ids starting with ``bos_id``; with ``return_weights``
    also the attention weights (B, n_steps, S), row t: where the decoder looked to choose
    word t+1 (the alignment table of the translation).
    """
    where = "rnn_seq2seq_generate"
    c = _check_config(config, where)
    dtype = _check_params(params, c, where)
    src_ids = _check_ids(src_ids, "src_ids", c.src_vocab_size, where)
    if isinstance(max_new_tokens, (bool, np.bool_)) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 0:
        raise ValueError(f"{where}: max_new_tokens is {max_new_tokens!r}; expected an integer >= 0")
    bos_id = int(v.int_array(np.asarray(bos_id), "bos_id", where, low=0, high=c.tgt_vocab_size))
    if eos_id is not None:
        eos_id = int(v.int_array(np.asarray(eos_id), "eos_id", where, low=0, high=c.tgt_vocab_size))
    src_mask = _check_src_mask(src_mask, src_ids, where)

    H, h_fin, _ = _encoder_forward(params, src_ids, src_mask, c)
    h, _ = _decoder_init(params, h_fin)
    B, S = src_ids.shape
    out = np.full((B, 1 + max_new_tokens), bos_id, dtype=np.int64)
    weights = np.zeros((B, max_new_tokens, S), dtype=dtype)
    done = np.zeros(B, dtype=bool)
    n_steps = 0
    for t in range(max_new_tokens):
        e_t = params["dec.E"][out[:, t]]             # e_t = E[x_t], (B, d_emb)
        h, ctx, weights[:, t], _ = _decoder_step(params, e_t, h, H, src_mask[:, None, :])
        logits, _ = _output_forward(params, h, e_t, ctx)
        token = np.argmax(logits, axis=-1)
        if eos_id is not None:
            token = np.where(done, eos_id, token)
            done = done | (token == eos_id)
        out[:, t + 1] = token
        n_steps = t + 1
        if eos_id is not None and done.all():
            out[:, t + 2:] = eos_id
            break
    if return_weights:
        return out, weights[:, :n_steps]
    return out
