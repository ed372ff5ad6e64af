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

Two points where the slides cannot be taken literally (docs/errata.md):

- The query of the attention is the PREVIOUS decoder state `h_{t-1}`. The slides write
  ``c_t = c_t(x', h_t)`` with query ``h_t``, but ``h_t`` is computed from ``c_t`` -- a circular
  definition. Bahdanau et al. (eq. 6) score ``a(s_{i-1}, h_j)``, as does 003 §5.1
  (``e_tj = s_{t-1}^T h_j``).
- The score has a tanh: ``v_a . tanh(h W_ah + h' W'_ah)``. Without it (002 "Seq2seq meets
  attention" prints ``v_a^T (W_ah h_t + W'_ah h'_s)``) the query term is the same for every
  source position `s` and the softmax cancels it: the weights would not depend on the decoder
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

from .contract import (backward_of, bool_array, count, float_array, flag, generator, int_array,
                       op)
from .embedding import embedding_backward, embedding_forward
from .linear import linear_backward, linear_forward
from .losses import cross_entropy_backward, cross_entropy_forward
from .scoring import additive_attention_backward, additive_attention_forward
from .seq2seq import IGNORE, teacher_forcing
from .transformer import check_dlogits, float_dtype, token_count, token_id

__all__ = [
    "gru_cell_forward", "gru_cell_backward",
    "RNNSeq2SeqConfig", "rnn_seq2seq_param_shapes", "init_seq2seq_rnn",
    "rnn_seq2seq_forward", "rnn_seq2seq_backward", "rnn_seq2seq_loss", "rnn_seq2seq_generate",
]


def _sigmoid(x):
    """`sigma(x) = (1 + tanh(x/2)) / 2`: the logistic function without overflow, in x's dtype."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _rows(x):
    """(..., d) -> (N, d): every leading axis stacked into rows (for the weight gradients)."""
    return x.reshape(-1, x.shape[-1])


# ---------------------------------------------------------------------------------------
# The GRU cell with the context term (002 "Hidden state of the decoder")
# ---------------------------------------------------------------------------------------

def _three_gate_blocks(W, name, where, args):
    """A matrix of three gate blocks [r | z | h~] side by side: 3d columns, d = h_prev's size."""
    h_prev = args["h_prev"]
    d = h_prev.shape[-1]
    if W.shape[1] != 3 * d:
        raise ValueError(f"{where}: {name} has shape {W.shape} but h_prev has shape {h_prev.shape}; "
                         f"expected {name} of shape ({W.shape[0]}, {3 * d}) = (.., 3d), the gate "
                         "blocks [r | z | h~]")
    return W


def _rows_of_h_prev(x, name, where, args):
    """None, or an array with exactly h_prev's leading (batch) axes."""
    h_prev = args["h_prev"]
    if x is not None and x.shape[:-1] != h_prev.shape[:-1]:
        raise ValueError(f"{where}: {name} has shape {x.shape} but h_prev has shape {h_prev.shape}; "
                         "expected the same leading (batch) axes")
    return x


def _with_context(W_c, name, where, args):
    """Given exactly when the context c is given."""
    if (args["c"] is None) != (W_c is None):
        raise ValueError(f"{where}: c is {'None' if args['c'] is None else 'given'} but W_c is "
                         f"{'None' if W_c is None else 'given'}; expected both or neither")
    return W_c


@op("e: (..., d_e)", "h_prev: (..., d)", "W_e: (d_e, 3d)", "W_h: (d, *)", "b: (3d,)?",
    "c: (..., d_c)?", "W_c: (d_c, 3d)?", e=_rows_of_h_prev, c=_rows_of_h_prev,
    W_e=_three_gate_blocks, W_h=_three_gate_blocks, W_c=_with_context)
def gru_cell_forward(e, h_prev, W_e, W_h, b=None, c=None, W_c=None):
    """One GRU step with an optional context term (002 "Hidden state of the decoder";
    Cho et al. 2014; the decoder of Bahdanau et al. 2014).

        R_t  = sigma(h_{t-1} W_rh + e_t W_re + c_t W_rc + b_r)
        Z_t  = sigma(h_{t-1} W_zh + e_t W_ze + c_t W_zc + b_z)
        h~_t = tanh((R_t * h_{t-1}) W_hh + e_t W_he + c_t W_hc + b_h)
        h_t  = Z_t * h_{t-1} + (1 - Z_t) * h~_t

    The gates' weights are stacked in column blocks `[r | z | h~]`, so that the input terms
    of all three gates are one product `P = e_t W_e + c_t W_c + b`:
    e: (..., d_e)   h_prev: (..., d)   W_e: (d_e, 3d) = [W_re | W_ze | W_he]
    W_h: (d, 3d) = [W_rh | W_zh | W_hh]   b: (3d,) or None
    c: (..., d_c) or None (no context: the encoder's GRU)   W_c: (d_c, 3d) or None
    ->  h: (..., d).   e, h_prev and c share their leading axes.

    cache keys: "e", "h_prev", "c", "W_e", "W_h", "W_c", "has_b", "R", "Z", "Rh" (`R * h_prev`),
    "h_tilde".
    """
    d = h_prev.shape[-1]
    P = e @ W_e                                               # e_t [W_re | W_ze | W_he]
    if b is not None:
        P = P + b                                             #   + [b_r | b_z | b_h]
    if c is not None:
        P = P + c @ W_c                                       #   + c_t [W_rc | W_zc | W_hc]
    R = _sigmoid(P[..., :d] + h_prev @ W_h[:, :d])            # reset gate R_t
    Z = _sigmoid(P[..., d:2 * d] + h_prev @ W_h[:, d:2 * d])  # update gate Z_t
    Rh = R * h_prev                                           # R_t * h_{t-1}
    h_tilde = np.tanh(P[..., 2 * d:] + Rh @ W_h[:, 2 * d:])   # candidate h~_t
    h = Z * h_prev + (1.0 - Z) * h_tilde                      # h_t = Z h_{t-1} + (1 - Z) h~_t
    return h, {"e": e, "h_prev": h_prev, "c": c, "W_e": W_e, "W_h": W_h, "W_c": W_c,
               "has_b": b is not None, "R": R, "Z": Z, "Rh": Rh, "h_tilde": h_tilde}


@backward_of(gru_cell_forward)
def gru_cell_backward(dh, cache):
    """Gradient of :func:`gru_cell_forward`: ``(de, dh_prev, dW_e, dW_h, db, dc, dW_c)``,
    ``db`` None without b and ``dc``, ``dW_c`` None without a context.

        dZ = dh (h_prev - h~),  dP_z = dZ Z (1 - Z),  dP_h = dh (1 - Z)(1 - h~^2)
        d(R h_prev) = dP_h W_hh^T,  dP_r = d(R h_prev) h_prev R (1 - R)
        dh_prev = dh Z + d(R h_prev) R + [dP_r | dP_z] [W_rh | W_zh]^T
        then every input x of the stacked pre-activation P: dx = dP W_x^T, dW_x = x^T dP
    """
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
    dc = None if c is None else dP @ W_c.T                  # P has c W_c  ->  dc = dP W_c^T
    dW_c = None if c is None else _rows(c).T @ _rows(dP)    #              ->  dW_c = c^T dP
    return de, dh_prev, dW_e, dW_h, db, dc, dW_c


# ---------------------------------------------------------------------------------------
# The config and the parameters
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RNNSeq2SeqConfig:
    """The shape of the recurrent encoder-decoder with attention (module docstring).

    src_vocab_size, tgt_vocab_size: the two vocabularies
    d_emb: word embedding size (source and target);  d_hidden: GRU state size `d`
    d_attn: size of the attention's tanh layer (defaults to d_hidden)
    bidirectional: encoder of two GRUs, one per direction (Bahdanau et al.); `h'_s` has `2d` entries
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
            count(getattr(self, name), name, where)
        if self.d_attn is None:
            object.__setattr__(self, "d_attn", self.d_hidden)
        count(self.d_attn, "d_attn", where)
        flag(self.bidirectional, "bidirectional", where)

    @property
    def d_enc(self):
        """Size of an encoder state `h'_s` (and of the context `c_t`)."""
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
    """A random `n x n` orthogonal matrix (QR of a Gaussian matrix, signs fixed by `diag(R)`)."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def init_seq2seq_rnn(config, *, rng, dtype=np.float32):
    """Initial parameters, a flat ``dict[str, ndarray]`` (keys in the module docstring).

    Embeddings `~ N(0, 1)`; each gate block of a recurrent matrix ``W_h`` a random orthogonal
    matrix (as Bahdanau et al.); every other matrix `~ N(0, 1/fan_in)`, so pre-activations
    start `O(1)`; ``attn.w`` `~ N(0, 1/d_attn)`; biases 0.
    rng: np.random.Generator;  dtype: np.float32 (default) or np.float64
    """
    where = "init_seq2seq_rnn"
    c = _check_config(config, where)
    generator(rng, "rng", where)
    dt = float_dtype(dtype, where)
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


# ---------------------------------------------------------------------------------------
# The checks at the model's entry
# ---------------------------------------------------------------------------------------

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
        p = float_array(params[k], f"params[{k!r}]", where)
        if p.shape != shape:
            raise ValueError(f"{where}: params[{k!r}] has shape {p.shape}; expected {shape} for this config")
        dtypes.add(p.dtype)
    if len(dtypes) > 1:
        raise TypeError(f"{where}: params mix dtypes {sorted(map(str, dtypes))}; expected one float "
                        "dtype for every parameter")
    return dtypes.pop()


def _check_ids(ids, name, vocab, where):
    ids = int_array(ids, name, where, low=0, high=vocab)
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} has shape {ids.shape}; expected (batch, length) with length >= 1")
    return ids


def check_rnn_inputs(params, config, src_ids, tgt_in_ids, src_mask, where):
    """The checks at the model's entry: ``(config, dtype of the params, src_ids, tgt_in_ids,
    src_mask)`` with src_ids (B, S) and tgt_in_ids (B, T) ints in their vocabularies
    (tgt_in_ids may be None: generation) and src_mask a (B, S) bool array (True = real
    source word; None means no padding: all True)."""
    c = _check_config(config, where)
    dtype = _check_params(params, c, where)
    src_ids = _check_ids(src_ids, "src_ids", c.src_vocab_size, where)
    if tgt_in_ids is not None:
        tgt_in_ids = _check_ids(tgt_in_ids, "tgt_in_ids", c.tgt_vocab_size, where)
        if src_ids.shape[0] != tgt_in_ids.shape[0]:
            raise ValueError(f"{where}: src_ids has shape {src_ids.shape} and tgt_in_ids has "
                             f"shape {tgt_in_ids.shape}; expected the same batch size")
    if src_mask is None:
        return c, dtype, src_ids, tgt_in_ids, np.ones(src_ids.shape, dtype=bool)
    src_mask = bool_array(src_mask, "src_mask", where)
    if src_mask.shape != src_ids.shape:
        raise ValueError(f"{where}: src_mask has shape {src_mask.shape} but src_ids has shape "
                         f"{src_ids.shape}; expected the same shape")
    return c, dtype, src_ids, tgt_in_ids, src_mask


# ---------------------------------------------------------------------------------------
# Encoder: a GRU over the source embeddings, padding skipped
# ---------------------------------------------------------------------------------------

def _gru_scan_forward(X, mask, W_e, W_h, b, *, reverse):
    """Run the GRU over `X` (B, S, d_e) left to right (or right to left).

        h'_s = GRU(e'_s, h'_{s-1}) where mask[:, s], else h'_{s-1}

    A padded position keeps the previous state, so padding never changes the states of
    real words and the final state is that of the last real word read.
    Returns H (B, S, d) (`H[:, s]` = state after reading position `s`), the final state, cache.
    """
    S = X.shape[1]
    h = np.zeros(X.shape[:1] + W_h.shape[:1], X.dtype)   # h'_0 = 0
    H, steps = [None] * S, []
    for s in (range(S - 1, -1, -1) if reverse else range(S)):
        h_new, cs = gru_cell_forward(X[:, s], h, W_e, W_h, b)
        h = np.where(mask[:, s, None], h_new, h)          # padding: keep h'_{s-1}
        H[s] = h
        steps.append((s, cs))
    return np.stack(H, axis=1), h, {"steps": steps, "mask": mask, "d_e": X.shape[-1]}


def _gru_scan_backward(dH, dh_final, cache):
    """Backward through time of :func:`_gru_scan_forward`: (dX, dW_e, dW_h, db)."""
    mask = cache["mask"]
    dX = [None] * dH.shape[1]
    dW_e = dW_h = db = 0.0
    dh = dh_final
    for s, cs in reversed(cache["steps"]):
        dh = dh + dH[:, s]                            # H[:, s] is read by attention and the next step
        m = mask[:, s, None]
        dh_new = np.where(m, dh, 0.0)                 # h = where(m, h_new, h_prev): the taken branch
        dX[s], dh_prev, gW_e, gW_h, gb, _, _ = gru_cell_backward(dh_new, cs)
        dW_e, dW_h, db = dW_e + gW_e, dW_h + gW_h, db + gb
        dh = np.where(m, dh_prev, dh)                 # padded: the state passed straight through
    return np.stack(dX, axis=1), dW_e, dW_h, db


def _encoder_forward(params, src_ids, src_mask, c):
    """Encoder states `H'` (B, S, d_enc), the state `h'_fin` that starts the decoder, cache."""
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

STEP_KEYS = ("dec.W_e", "dec.W_h", "dec.b", "dec.W_c", "attn.Wq", "attn.Wk", "attn.w")


def decoder_step_forward(params, e_t, h_prev, H, src_mask):
    """One decoder step (002 "Hidden state of the decoder"; Bahdanau et al. 2014):

        alpha_ts = softmax_s( v_a . tanh(h_{t-1} W_ah + h'_s W'_ah) )    (padding masked)
        c_t      = sum_s alpha_ts h'_s
        h_t      = GRU(e_t, h_{t-1}, c_t)

    e_t (B, d_emb), h_prev (B, d), H (B, S, d_enc), src_mask (B, S)
    -> h_t (B, d), c_t (B, d_enc), alpha_t (B, S), cache {"attn", "gru"}
    """
    # the query h_{t-1}, one row per sentence: (B, d) -> (B, 1, d)
    ctx, c_att = additive_attention_forward(h_prev[:, None, :], H, H, params["attn.Wq"],
                                            params["attn.Wk"], params["attn.w"],
                                            mask=src_mask[:, None, :])
    ctx = ctx[:, 0]                                                   # c_t, (B, d_enc)
    h, c_gru = gru_cell_forward(e_t, h_prev, params["dec.W_e"], params["dec.W_h"], params["dec.b"],
                                ctx, params["dec.W_c"])              # h_t = GRU(e_t, h_{t-1}, c_t)
    return h, ctx, c_att["weights"][:, 0], {"attn": c_att, "gru": c_gru}


def decoder_step_backward(dh, dctx, cache):
    """Backward of :func:`decoder_step_forward`, given the gradients of `h_t` and of `c_t`
    (which the output layer reads too): ``(de_t, dh_prev, dH, grads)``, grads keyed by
    ``STEP_KEYS``. The encoder states are both the keys and the values: `dH = dK + dV`."""
    de, dh_prev, dW_e, dW_h, db, dctx_gru, dW_c = gru_cell_backward(dh, cache["gru"])
    dctx = dctx_gru + dctx                            # c_t feeds the GRU and the output layer
    dq, dK, dV, dWq, dWk, dw = additive_attention_backward(dctx[:, None, :], cache["attn"])
    dh_prev = dh_prev + dq[:, 0]                      # h_{t-1}: the GRU's input and the query
    return de, dh_prev, dK + dV, dict(zip(STEP_KEYS, (dW_e, dW_h, db, dW_c, dWq, dWk, dw)))


def _output_forward(params, Hd, Ed, C):
    """`logits = h_t W_yh + e_t W_ye + c_t W_yc + b_y` (002 "Encoder-decoder"), any leading axes."""
    z_h, c_h = linear_forward(Hd, params["out.W_yh"], params["out.b_y"])   # h_t W_yh + b_y
    z_e, c_e = linear_forward(Ed, params["out.W_ye"])                       # e_t W_ye
    z_c, c_c = linear_forward(C, params["out.W_yc"])                        # c_t W_yc
    return z_h + z_e + z_c, {"h": c_h, "e": c_e, "c": c_c}


def _output_backward(dlogits, cache, grads):
    """(dHd, dEd, dC) of :func:`_output_forward`; the weights' gradients go to grads."""
    dHd, grads["out.W_yh"], grads["out.b_y"] = linear_backward(dlogits, cache["h"])
    dEd, grads["out.W_ye"], _ = linear_backward(dlogits, cache["e"])
    dC, grads["out.W_yc"], _ = linear_backward(dlogits, cache["c"])
    return dHd, dEd, dC


def rnn_seq2seq_forward(params, src_ids, tgt_in_ids, *, config, src_mask=None):
    """Forward pass of the recurrent encoder-decoder (module docstring): ``(logits, cache)``.

        H', h'_fin = encoder(src);  h_0 = tanh(h'_fin W_init + b_init)
        for t = 1 .. T:  c_t, h_t = step(e_t, h_{t-1}, H');   logits_t = output(h_t, e_t, c_t)

    params:     dict from :func:`init_seq2seq_rnn`
    src_ids:    (B, S) source ids in `[0, src_vocab_size)`
    tgt_in_ids: (B, T) decoder inputs `x_1 .. x_T` in `[0, tgt_vocab_size)` (teacher forcing:
                the target shifted right behind a start token)
    src_mask:   optional (B, S) bool, True = real source word, False = padding: padding is
                skipped by the encoder GRU(s) and never attended to
    returns logits (B, T, tgt_vocab_size) (before the softmax of `y_t`), cache

    cache: the steps' caches "enc", "init", "dec.embed", "steps" (one per decoder step),
    "out"; and for readers "weights" (B, T, S) attention weights `alpha_ts` (row `t`: where the
    decoder looked to predict the word after `x_t`; the alignment table), "enc_states" `H'`
    (B, S, d_enc), "dec_states" `h_1 .. h_T` (B, T, d), "h0" (B, d), "contexts" `c_t` (B, T, d_enc).
    """
    c, dtype, src_ids, tgt_in_ids, src_mask = check_rnn_inputs(
        params, config, src_ids, tgt_in_ids, src_mask, "rnn_seq2seq_forward")
    cache = {"config": c, "dtype": dtype, "steps": []}
    H, h_fin, cache["enc"] = _encoder_forward(params, src_ids, src_mask, c)      # h'_s (B, S, d_enc)
    pre, cache["init"] = linear_forward(h_fin, params["dec.W_init"], params["dec.b_init"])
    h = h0 = np.tanh(pre)                                                        # h_0
    Ed, cache["dec.embed"] = embedding_forward(tgt_in_ids, params["dec.E"])     # e_t = E[x_t]
    hs, ctxs, alphas = [], [], []
    for t in range(tgt_in_ids.shape[1]):              # the recurrence: one step per target word
        h, ctx, alpha, c_step = decoder_step_forward(params, Ed[:, t], h, H, src_mask)
        cache["steps"].append(c_step)
        hs.append(h), ctxs.append(ctx), alphas.append(alpha)
    Hd, C, A = np.stack(hs, axis=1), np.stack(ctxs, axis=1), np.stack(alphas, axis=1)
    logits, cache["out"] = _output_forward(params, Hd, Ed, C)                   # y_t
    cache.update(logits_shape=logits.shape, weights=A, enc_states=H, dec_states=Hd, h0=h0,
                 contexts=C)
    return logits, cache


def rnn_seq2seq_backward(dlogits, cache):
    """Backward of :func:`rnn_seq2seq_forward` through time: a dict of gradients with the
    keys of ``params``.

    Output layer for all steps at once; then the decoder steps in reverse order, where the
    state gradient is `dh_{t-1}` = (GRU's ``dh_prev``) + (attention's ``dq``) and every step adds
    its attention's `dK + dV` to `dH'` (the encoder states are both keys and values);
    then `h_0 = tanh(...)`, and the encoder GRU(s) in reverse order.
    """
    dlogits = check_dlogits(dlogits, cache, "rnn_seq2seq_backward")
    c, grads = cache["config"], {}
    dHd, dEd, dC = _output_backward(dlogits, cache["out"], grads)   # y_t = output(h_t, e_t, c_t)
    dEd = dEd.copy()                                  # the GRU's de_t is added below
    dH = np.zeros_like(cache["enc_states"])
    acc = dict.fromkeys(STEP_KEYS, 0.0)
    dh = np.zeros_like(cache["h0"])                   # nothing after h_T
    for t in reversed(range(len(cache["steps"]))):
        dh = dh + dHd[:, t]                           # h_t feeds the output layer and step t+1
        de, dh, dH_t, g = decoder_step_backward(dh, dC[:, t], cache["steps"][t])
        dEd[:, t] += de
        dH += dH_t
        acc = {k: acc[k] + g[k] for k in STEP_KEYS}
    grads.update(acc)
    grads["dec.E"] = embedding_backward(dEd, cache["dec.embed"])[1]             # e_t = E[x_t]
    h0 = cache["h0"]
    dpre = dh * (1.0 - h0 * h0)                       # h_0 = tanh(pre)  ->  dpre = dh_0 (1 - h_0^2)
    dh_fin, grads["dec.W_init"], grads["dec.b_init"] = linear_backward(dpre, cache["init"])
    _encoder_backward(dH, dh_fin, cache["enc"], c, grads)                        # H' = encoder(src)
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
    tgt_in, targets = teacher_forcing(batch, "rnn_seq2seq_loss")
    logits, cache = rnn_seq2seq_forward(params, batch["src_ids"], tgt_in, config=config,
                                        src_mask=batch.get("src_mask"))
    loss, c_loss = cross_entropy_forward(logits, targets, label_smoothing=label_smoothing,
                                         ignore_index=IGNORE)
    dlogits, _ = cross_entropy_backward(1.0, c_loss)
    return float(loss), rnn_seq2seq_backward(dlogits, cache)


def rnn_seq2seq_generate(params, src_ids, *, config, max_new_tokens, bos_id, eos_id=None,
                         src_mask=None, return_weights=False):
    """Greedy decoding: encode the source once, start from ``bos_id`` and feed back the most
    probable word, one GRU step per word (the recurrence carries everything: no KV cache).

    eos_id: a row that has produced it is filled with ``eos_id`` from then on; the loop stops
            once every row has.
    returns (B, 1 + max_new_tokens) ids starting with ``bos_id``; with ``return_weights``
    also the attention weights (B, n_steps, S), row `t`: where the decoder looked to choose
    word `t+1` (the alignment table of the translation).
    """
    where = "rnn_seq2seq_generate"
    c, dtype, src_ids, _, src_mask = check_rnn_inputs(params, config, src_ids, None, src_mask,
                                                       where)
    max_new_tokens = token_count(max_new_tokens, "max_new_tokens", where)
    bos_id = token_id(bos_id, "bos_id", c.tgt_vocab_size, where)
    if eos_id is not None:
        eos_id = token_id(eos_id, "eos_id", c.tgt_vocab_size, where)

    H, h_fin, _ = _encoder_forward(params, src_ids, src_mask, c)
    h = np.tanh(linear_forward(h_fin, params["dec.W_init"], params["dec.b_init"])[0])   # h_0
    B, S = src_ids.shape
    out = np.full((B, 1 + max_new_tokens), bos_id, dtype=np.int64)
    weights = np.zeros((B, max_new_tokens, S), dtype=dtype)
    done = np.zeros(B, dtype=bool)
    n_steps = 0
    for t in range(max_new_tokens):
        e_t = params["dec.E"][out[:, t]]             # e_t = E[x_t], (B, d_emb)
        h, ctx, weights[:, t], _ = decoder_step_forward(params, e_t, h, H, src_mask)
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
