"""A decoder-only transformer (GPT): config, init, forward, backward, loss and generation.

Covers 004 "Transformer Decoder" (decoder-only, masked self-attention), "Position
representations" (learned eq. 12, sinusoids, RoPE), "Add & Norm" (eq. 30-31) and "The
Final Linear and Softmax Layer"; 000 §2.5 / 003 ch. 6 (autoregressive inference and KV
caching) and 001 §2.2 (the cache's shapes).

The whole model, read top to bottom (pre-norm)::

    x = E[ids] + P[positions]                 token + position embeddings (004 eq. 12)
    for each layer l:                         decoder block without cross-attention
        x = x + attn_l(N(x))                  masked multi-head self-attention
        x = x + ffn_l(N(x))
    x = N_f(x)                                final norm (pre-norm only)
    logits = x W_out                          final linear layer; W_out = E^T when tied

``softmax`` / cross-entropy are applied by the caller (``gpt_loss`` does it with
``cross_entropy_forward``). ``gpt_backward`` is the same list read bottom to top.

Parameter keys (a flat ``dict[str, ndarray]``, see :func:`gpt_param_shapes`)::

    wte                         (vocab_size, d_model)   token embedding table E
    wpe                         (max_len, d_model)      learned positions P (positional="learned")
    h{l}.attn_norm.gamma/.beta  (d_model,)              beta only for LayerNorm with bias
    h{l}.attn.Wq                (d_model, n_heads*d_head)
    h{l}.attn.Wk, .Wv           (d_model, n_kv_heads*d_head)
    h{l}.attn.Wo                (n_heads*d_head, d_model)
    h{l}.attn.bq/.bk/.bv/.bo    biases (bias=True)
    h{l}.mlp_norm.gamma/.beta   (d_model,)
    h{l}.mlp.W1 (d_model, d_ff), .b1 (d_ff,), .W2 (d_ff, d_model), .b2 (d_model,)
    h{l}.mlp.W_gate, .W_up (d_model, d_ff), .W_down (d_ff, d_model)   activation="swiglu" instead
    norm_f.gamma/.beta          (d_model,)              pre-norm only
    lm_head.W                   (d_model, vocab_size)   untied only (tied: logits = x E^T)

KV cache (003 §6.2, 001 §2.2): a list with one entry per layer, each the ``mha_forward``
kv_cache of that layer, holding keys and values of shape (B, n_kv_heads, T, d_head).
``gpt_forward`` always returns the cache covering every position it has seen under
``cache["kv_cache"]``; pass it back as ``kv_cache=`` with only the new token ids to
decode one step.
"""
from dataclasses import asdict, dataclass, fields
import math

import numpy as np

from . import _validate as v
from .blocks import _layer_cache_length, decoder_block_backward, decoder_block_forward
from .dropout import dropout_backward, dropout_forward
from .embedding import embedding_backward, embedding_forward
from .ffn import FFN_ACTIVATIONS
from .linear import linear_backward, linear_forward
from .losses import cross_entropy_backward, cross_entropy_forward
from .norms import layernorm_backward, layernorm_forward, rmsnorm_backward, rmsnorm_forward
from .positional import rope_frequencies, sinusoidal_encoding

__all__ = ["GPTConfig", "init_gpt", "gpt_param_shapes", "gpt_forward", "gpt_backward",
           "gpt_loss", "generate", "kv_cache_size"]

POSITIONALS = ("learned", "sinusoidal", "rope")
ACTIVATIONS = FFN_ACTIVATIONS + ("swiglu",)   # "relu", "gelu", "gelu_tanh" (GPT-2), "swiglu" (LLaMA)


# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    """The shape and options of a GPT.

    vocab_size, n_layers, d_model, n_heads: as in the notes (d_head = d_model / n_heads)
    n_kv_heads:   key/value heads; None = n_heads (MHA), 1 = MQA, between = GQA (000 §2.2)
    d_ff:         FFN hidden width; None = 4 * d_model
    max_len:      context length: rows of the learned position table P
    positional:   "learned" (004 eq. 12) | "sinusoidal" (added, 003 §7.2) | "rope" (003 §7.3)
    norm:         "pre" (004 eq. 30) | "post" (004 eq. 31)
    norm_type:    "layernorm" | "rmsnorm";  norm_eps: its epsilon
    activation:   the FFN activation, "gelu" | "relu" | "gelu_tanh" (GPT-2) | "swiglu"
                  (LLaMA's gated FFN, ``swiglu_ffn_forward``; needs bias=False)
    tie_embeddings: the final linear layer reuses the token table (logits = x E^T)
    dropout:      rate on the embeddings and on every sublayer output (training only)
    bias:         linear layers and LayerNorm have biases (GPT-2: True, LLaMA: False)
    rope_base, rope_layout, rope_scaling: RoPE's base, pairing ("interleaved" as in the
                  notes, or "half" as LLaMA) and context-extension ``scaling`` dict
                  (``rope_frequencies``)
    """
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int = None
    d_ff: int = None
    max_len: int = 256
    positional: str = "learned"
    norm: str = "pre"
    activation: str = "gelu"
    tie_embeddings: bool = True
    dropout: float = 0.0
    norm_type: str = "layernorm"
    norm_eps: float = 1e-5
    bias: bool = True
    rope_base: float = 10000.0
    rope_layout: str = "interleaved"
    rope_scaling: dict = None

    def __post_init__(self):
        _check_fields(self, "GPTConfig", ("vocab_size", "n_layers"))

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def to_dict(self):
        """A plain dict (JSON-ready) of every field."""
        return _config_to_dict(self)

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict`; unknown keys are an error (a typo would be ignored otherwise)."""
        return _config_from_dict(cls, d)


def _check_fields(c, where, sizes):
    """Validate a model config (shared by GPTConfig and EncDecConfig); fills the defaults
    n_kv_heads = n_heads and d_ff = 4 d_model."""
    for name in sizes + ("d_model", "n_heads", "max_len"):
        v.positive_int(getattr(c, name), name, where)
    if c.n_kv_heads is None:
        object.__setattr__(c, "n_kv_heads", c.n_heads)
    if c.d_ff is None:
        object.__setattr__(c, "d_ff", 4 * c.d_model)
    v.positive_int(c.n_kv_heads, "n_kv_heads", where)
    v.positive_int(c.d_ff, "d_ff", where)
    if c.d_model % c.n_heads:
        raise ValueError(f"{where}: d_model is {c.d_model} and n_heads is {c.n_heads}; "
                         "expected d_model divisible by n_heads (d_head = d_model / n_heads)")
    if c.n_heads % c.n_kv_heads:
        raise ValueError(f"{where}: n_heads is {c.n_heads} and n_kv_heads is {c.n_kv_heads}; "
                         "expected n_heads divisible by n_kv_heads (each key/value head serves "
                         "a whole group of query heads)")
    v.choice(c.positional, "positional", where, POSITIONALS)
    v.choice(c.norm, "norm", where, ("pre", "post"))
    v.choice(c.norm_type, "norm_type", where, ("layernorm", "rmsnorm"))
    v.choice(c.activation, "activation", where, ACTIVATIONS)
    if c.activation == "swiglu" and c.bias:
        raise ValueError(f"{where}: activation is 'swiglu' and bias is True; the SwiGLU FFN has no "
                         "biases: pass bias=False (as LLaMA)")
    v.choice(c.rope_layout, "rope_layout", where, ("interleaved", "half"))
    for name in ("tie_embeddings", "bias"):
        if not isinstance(getattr(c, name), (bool, np.bool_)):
            raise TypeError(f"{where}: {name} is {getattr(c, name)!r}; expected True or False")
    v.number(c.dropout, "dropout", where, low=0.0, high=1.0, high_open=True)
    v.number(c.norm_eps, "norm_eps", where, low=0.0, low_open=True)
    v.number(c.rope_base, "rope_base", where, low=1.0, low_open=True)
    if c.positional == "rope":
        if c.d_head % 2:
            raise ValueError(f"{where}: positional is 'rope' but d_head = d_model / n_heads = "
                             f"{c.d_head} is odd; expected an even d_head (RoPE rotates pairs)")
        rope_frequencies(c.d_head, base=c.rope_base, scaling=c.rope_scaling)
    elif c.rope_scaling is not None:
        raise ValueError(f"{where}: rope_scaling is {c.rope_scaling!r} but positional is "
                         f"{c.positional!r}; expected rope_scaling=None unless positional='rope'")


def _config_to_dict(c):
    d = asdict(c)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = dict(d["rope_scaling"])
    return d


def _config_from_dict(cls, d):
    if not isinstance(d, dict):
        raise TypeError(f"{cls.__name__}.from_dict: d is a {type(d).__name__}; expected a dict")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}.from_dict: unknown keys {unknown}; expected keys "
                         f"among {sorted(names)}")
    return cls(**d)


def _check_config(config, where, cls=GPTConfig):
    if not isinstance(config, cls):
        raise TypeError(f"{where}: config is a {type(config).__name__}; expected a {cls.__name__}")
    return config


# ---------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------

def _block_shapes(prefix, c, *, cross=False):
    """Shapes of one block's parameters (keys as in blocks.py)."""
    d, hd, kvd = c.d_model, c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    s = {}
    sublayers = ("attn", "cross", "mlp") if cross else ("attn", "mlp")
    for sub in sublayers:
        s[f"{prefix}{sub}_norm.gamma"] = (d,)
        if c.norm_type == "layernorm" and c.bias:
            s[f"{prefix}{sub}_norm.beta"] = (d,)
        if sub == "mlp":
            if c.activation == "swiglu":
                s.update({f"{prefix}mlp.W_gate": (d, c.d_ff), f"{prefix}mlp.W_up": (d, c.d_ff),
                          f"{prefix}mlp.W_down": (c.d_ff, d)})
                continue    # no biases (checked by the config)
            s.update({f"{prefix}mlp.W1": (d, c.d_ff), f"{prefix}mlp.W2": (c.d_ff, d)})
            if c.bias:
                s.update({f"{prefix}mlp.b1": (c.d_ff,), f"{prefix}mlp.b2": (d,)})
        else:
            s.update({f"{prefix}{sub}.Wq": (d, hd), f"{prefix}{sub}.Wk": (d, kvd),
                      f"{prefix}{sub}.Wv": (d, kvd), f"{prefix}{sub}.Wo": (hd, d)})
            if c.bias:
                s.update({f"{prefix}{sub}.bq": (hd,), f"{prefix}{sub}.bk": (kvd,),
                          f"{prefix}{sub}.bv": (kvd,), f"{prefix}{sub}.bo": (d,)})
    return s


def _final_norm_shapes(key, c):
    s = {f"{key}.gamma": (c.d_model,)}
    if c.norm_type == "layernorm" and c.bias:
        s[f"{key}.beta"] = (c.d_model,)
    return s


def gpt_param_shapes(config):
    """``{key: shape}`` of every parameter of a GPT with this config (module docstring)."""
    c = _check_config(config, "gpt_param_shapes")
    s = {"wte": (c.vocab_size, c.d_model)}
    if c.positional == "learned":
        s["wpe"] = (c.max_len, c.d_model)
    for l in range(c.n_layers):
        s.update(_block_shapes(f"h{l}.", c))
    if c.norm == "pre":
        s.update(_final_norm_shapes("norm_f", c))
    if not c.tie_embeddings:
        s["lm_head.W"] = (c.d_model, c.vocab_size)
    return s


def _init_from_shapes(shapes, n_layers, rng, dtype):
    """GPT-2 initialisation: N(0, 0.02) weights and tables, zero biases and betas, unit
    gammas; the projections that write into the residual stream (attn/cross ``Wo``,
    ``mlp.W2``) scaled by 1/sqrt(2 n_layers) so the stream's variance does not grow
    with depth."""
    params = {}
    for key, shape in shapes.items():
        name = key.rsplit(".", 1)[-1]
        if name == "gamma":
            params[key] = np.ones(shape, dtype=dtype)
        elif name == "beta" or name.startswith("b"):
            params[key] = np.zeros(shape, dtype=dtype)
        else:
            std = 0.02
            if key.endswith(("attn.Wo", "cross.Wo", "mlp.W2", "mlp.W_down")):
                std = 0.02 / math.sqrt(2 * n_layers)
            params[key] = (std * rng.standard_normal(shape)).astype(dtype)
    return params


def init_gpt(config, *, rng, dtype=np.float32):
    """Initial parameters of a GPT (GPT-2 scheme): a flat ``dict[str, ndarray]``.

    Weights and embedding tables ~ N(0, 0.02^2); the residual projections ``attn.Wo`` and
    ``mlp.W2`` ~ N(0, (0.02 / sqrt(2 n_layers))^2); biases and betas 0; gammas 1.
    rng: np.random.Generator;  dtype: np.float32 (default) or np.float64
    """
    where = "init_gpt"
    c = _check_config(config, where)
    v.rng_arg(rng, where)
    dtype = _dtype_arg(dtype, where)
    return _init_from_shapes(gpt_param_shapes(c), c.n_layers, rng, dtype)


def _dtype_arg(dtype, where):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{where}: dtype is {dtype!r}; expected np.float32 or np.float64")
    return dt


def _check_params(params, shapes, where):
    """Every expected key present with its shape, one float dtype; returns that dtype."""
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params is a {type(params).__name__}; expected a dict of arrays")
    missing = [k for k in shapes if k not in params]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ValueError(f"{where}: params is missing {missing[:5]}{more}; expected the keys of "
                         "init for this config")
    extra = [k for k in params if k not in shapes]
    if extra:
        raise ValueError(f"{where}: params has unexpected keys {extra[:5]}; they do not belong to a "
                         "model with this config")
    dtypes = set()
    for k, shape in shapes.items():
        p = v.float_array(params[k], f"params[{k!r}]", where)
        if p.shape != shape:
            raise ValueError(f"{where}: params[{k!r}] has shape {p.shape}; expected {shape} for "
                             "this config")
        dtypes.add(p.dtype)
    if len(dtypes) > 1:
        raise TypeError(f"{where}: params mix dtypes {sorted(map(str, dtypes))}; expected one "
                        "float dtype for every parameter")
    return dtypes.pop()


# ---------------------------------------------------------------------------------------
# Shared pieces of GPT and the encoder-decoder: embeddings in, logits out
# ---------------------------------------------------------------------------------------

def _embed_forward(params, ids, positions, c, *, tok_key, pos_key, rng, train):
    """x = E[ids] + P[positions] (004 eq. 12), or + PE (sinusoids), or E[ids] alone (RoPE
    rotates inside attention); then dropout when training.

    ids: (B, T) ints;  positions: (T,) absolute positions of these tokens
    """
    x, c_tok = embedding_forward(ids, params[tok_key])                # (B, T, d) rows of E
    if c.positional == "learned":
        p, c_pos = embedding_forward(positions, params[pos_key])      # (T, d) rows of P
        x = x + p                                                     # broadcast over the batch
    else:
        c_pos = None
        if c.positional == "sinusoidal":
            pe = sinusoidal_encoding(int(positions[-1]) + 1, c.d_model, dtype=x.dtype)
            x = x + pe[positions]                                     # fixed, no parameters
    c_drop = None
    if train and c.dropout > 0.0:
        x, c_drop = dropout_forward(x, p=c.dropout, rng=rng, train=True)
    return x, {"tok_key": tok_key, "pos_key": pos_key, "tok": c_tok, "pos": c_pos, "dropout": c_drop}


def _embed_backward(dx, cache):
    """Gradients of the embedding tables, as a dict."""
    if cache["dropout"] is not None:
        dx = dropout_backward(dx, cache["dropout"])
    grads = {cache["tok_key"]: embedding_backward(dx, cache["tok"])[1]}   # repeated ids accumulate
    if cache["pos"] is not None:
        # P[positions] was broadcast over the batch: its gradient sums the batch axis
        grads[cache["pos_key"]] = embedding_backward(dx.sum(axis=0), cache["pos"])[1]
    return grads


def _final_norm_forward(x, params, key, c):
    if c.norm_type == "layernorm":
        return layernorm_forward(x, params[key + ".gamma"], params.get(key + ".beta"), eps=c.norm_eps)
    return rmsnorm_forward(x, params[key + ".gamma"], eps=c.norm_eps)


def _final_norm_backward(dy, cache, key, c):
    if c.norm_type == "layernorm":
        dx, dgamma, dbeta = layernorm_backward(dy, cache)
    else:
        (dx, dgamma), dbeta = rmsnorm_backward(dy, cache), None
    grads = {key + ".gamma": dgamma}
    if dbeta is not None:
        grads[key + ".beta"] = dbeta
    return dx, grads


def _head_forward(x, params, tok_key, tied):
    """The final linear layer (004 "The Final Linear and Softmax Layer"): logits = x W_out,
    with W_out = E^T when the embeddings are tied."""
    W_out = params[tok_key].T if tied else params["lm_head.W"]       # (d_model, vocab)
    logits, c = linear_forward(x, W_out)
    return logits, c


def _head_backward(dlogits, cache, tok_key, tied):
    dx, dW, _ = linear_backward(dlogits, cache)
    if tied:
        return dx, {tok_key: dW.T}         # W_out = E^T  ->  dE = dW_out^T
    return dx, {"lm_head.W": dW}


def _add_grads(total, grads):
    """Sum gradient dicts (a tied table gets the embedding and the output contributions)."""
    for k, g in grads.items():
        total[k] = total[k] + g if k in total else g
    return total


def _block_options(c, *, rng, train):
    """The keyword options every block of this model gets."""
    return dict(n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, norm=c.norm, norm_type=c.norm_type,
                eps=c.norm_eps, activation=c.activation, dropout=c.dropout, rng=rng, train=train)


def _rope_option(c):
    """mha_forward's rope option, or None. mha places the new queries and keys at positions
    n_past, n_past + 1, ... after the n_past cached ones."""
    if c.positional != "rope":
        return None
    freqs = rope_frequencies(c.d_head, base=c.rope_base, scaling=c.rope_scaling)
    return {"freqs": freqs, "layout": c.rope_layout}


# ---------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------

def _cache_length(kv_cache, n_layers, where):
    """Number of positions already in a model's KV cache (a list, one entry per layer)."""
    if not isinstance(kv_cache, (list, tuple)) or len(kv_cache) != n_layers:
        got = f"a {type(kv_cache).__name__}" + (f" of length {len(kv_cache)}"
                                                if isinstance(kv_cache, (list, tuple)) else "")
        raise ValueError(f"{where}: kv_cache is {got}; expected a list of {n_layers} per-layer "
                         "caches (cache['kv_cache'] of an earlier call)")
    return _layer_cache_length(kv_cache[0], where)


def kv_cache_size(kv_cache):
    """Number of floats held by a KV cache: 2 * n_layers * B * n_kv_heads * T * d_head.

    With GQA/MQA the cache is n_heads / n_kv_heads times smaller than with MHA
    (000 §2.2, 001 §2.2).
    """
    return int(sum(layer["k"].size + layer["v"].size for layer in kv_cache))


# ---------------------------------------------------------------------------------------
# Forward / backward
# ---------------------------------------------------------------------------------------

def gpt_forward(params, ids, *, config, kv_cache=None, rng=None, train=False):
    """Forward pass of a GPT: token ids to next-token logits (module docstring).

        x = E[ids] + P;  x = block_l(x) for l = 0..L-1;  x = N_f(x);  logits = x W_out

    params:   dict from :func:`init_gpt` (float32 or float64; the logits have that dtype)
    ids:      (B, T) ints in [0, vocab_size)
    config:   GPTConfig
    kv_cache: None (a whole sequence, positions 0..T-1), or ``cache["kv_cache"]`` of an
              earlier call: ``ids`` are then the NEW tokens, at positions n_past..n_past+T-1,
              attending to the cached keys/values (003 §6.2)
    rng, train: dropout (rng required when train and config.dropout > 0)
    returns logits (B, T, vocab_size), cache

    cache keys used by readers: "kv_cache" (list per layer of {"k", "v"} of shape
    (B, n_kv_heads, n_past + T, d_head): pass it back to continue decoding),
    "attn_weights" (list per layer of (B, n_heads, T, n_past + T)), "positions" (T,).
    Raises ValueError for ids outside the vocabulary and, with learned positions, for
    positions beyond max_len - 1 (sinusoidal and RoPE positions are computed for any
    position). ``gpt_backward`` also works after a cached forward: the cached keys and
    values are constants, the gradient reaches only the new positions.
    """
    where = "gpt_forward"
    c = _check_config(config, where)
    dtype = _check_params(params, gpt_param_shapes(c), where)
    ids = v.int_array(ids, "ids", where, low=0, high=c.vocab_size)
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: ids has shape {ids.shape}; expected (batch, T) with T >= 1")
    if train and c.dropout > 0.0:
        v.rng_arg(rng, where)
    B, T = ids.shape
    n_past = 0 if kv_cache is None else _cache_length(kv_cache, c.n_layers, where)
    if c.positional == "learned" and n_past + T > c.max_len:
        raise ValueError(f"{where}: positions {n_past}..{n_past + T - 1} reach beyond max_len="
                         f"{c.max_len} (ids has T={T}, kv_cache holds {n_past}); learned positions "
                         f"have rows 0..{c.max_len - 1} only")
    positions = np.arange(n_past, n_past + T)
    rope = _rope_option(c)

    cache = {"config": c, "dtype": dtype, "positions": positions, "blocks": [],
             "kv_cache": [], "attn_weights": []}
    # x = E[ids] + P[positions]                           (004 eq. 12)
    x, cache["embed"] = _embed_forward(params, ids, positions, c, tok_key="wte", pos_key="wpe",
                                       rng=rng, train=train)
    opts = _block_options(c, rng=rng, train=train)
    for l in range(c.n_layers):
        # x = x + attn(N(x));  x = x + ffn(N(x))           (decoder block, no cross-attention)
        x, cb = decoder_block_forward(x, None, params, prefix=f"h{l}.", rope=rope,
                                      kv_cache=None if kv_cache is None else kv_cache[l], **opts)
        cache["blocks"].append(cb)
        cache["kv_cache"].append(cb["kv_cache"])
        cache["attn_weights"].append(cb["attn_weights"])
    if c.norm == "pre":
        x, cache["norm_f"] = _final_norm_forward(x, params, "norm_f", c)   # x = N_f(x)
    # logits = x W_out                                    (004 "The Final Linear ... Layer")
    logits, cache["head"] = _head_forward(x, params, "wte", c.tie_embeddings)
    cache["logits_shape"] = logits.shape
    return logits, cache


def gpt_backward(dlogits, cache):
    """Backward of :func:`gpt_forward`: ``dict`` of gradients with the keys of ``params``.

    The forward read bottom to top: final linear, final norm, blocks L-1..0, embeddings.
    With tied embeddings ``wte`` gets both the output-layer and the lookup contribution.
    """
    where = "gpt_backward"
    c = cache["config"]
    dlogits = v.upstream(dlogits, "dlogits", where, cache["logits_shape"], cache["dtype"],
                         what="the logits'")
    dx, grads = _head_backward(dlogits, cache["head"], "wte", c.tie_embeddings)   # logits = x W_out
    if c.norm == "pre":
        dx, g = _final_norm_backward(dx, cache["norm_f"], "norm_f", c)            # x = N_f(x)
        grads.update(g)
    for cb in reversed(cache["blocks"]):
        dx, _, g = decoder_block_backward(dx, cb)                                  # x = block(x)
        grads.update(g)
    return _add_grads(grads, _embed_backward(dx, cache["embed"]))                  # x = E[ids] + P


def _masked_targets(targets, loss_mask, ignore_index, where):
    """targets with the positions where ``loss_mask`` is False set to the ignored value."""
    if loss_mask is None:
        return targets, ignore_index
    targets = v.int_array(targets, "targets", where, low=-(2 ** 62))
    loss_mask = np.asarray(loss_mask)
    if loss_mask.dtype != np.bool_ or loss_mask.shape != targets.shape:
        raise ValueError(f"{where}: loss_mask has dtype {loss_mask.dtype} and shape "
                         f"{loss_mask.shape}; expected a bool array of the targets' shape "
                         f"{targets.shape} (True = scored)")
    ignore_index = -1 if ignore_index is None else ignore_index
    return np.where(loss_mask, targets, ignore_index), ignore_index


def gpt_loss(params, ids, targets, *, config, loss_mask=None, ignore_index=None,
             label_smoothing=0.0, rng=None, train=False):
    """Mean next-token cross-entropy and its gradients: ``(loss, grads)``.

        loss = mean_t -log softmax(logits_t)[targets_t]     (003 §2.1.2)

    ids, targets: (B, T) ints (for language modelling ``targets`` is ``ids`` shifted by
    one, e.g. from ``next_token_arrays``); positions where ``loss_mask`` (B, T) bool is
    False, or whose target is ``ignore_index``, are left out of the mean (prompt, padding).
    loss: a Python float; grads: dict with the keys of ``params``.
    """
    targets, ignore_index = _masked_targets(targets, loss_mask, ignore_index, "gpt_loss")
    logits, cache = gpt_forward(params, ids, config=config, rng=rng, train=train)
    loss, c_loss = cross_entropy_forward(logits, targets, label_smoothing=label_smoothing,
                                         ignore_index=ignore_index)
    dlogits, _ = cross_entropy_backward(1.0, c_loss)
    return float(loss), gpt_backward(dlogits, cache)


# ---------------------------------------------------------------------------------------
# Generation (000 §2.5, 003 §6.1-6.2)
# ---------------------------------------------------------------------------------------

def _next_token(logits, *, temperature, top_k, rng):
    """One token per row from last-position logits (B, V): greedy or sampled.

        greedy:  argmax_v logits[v]           (temperature == 0 or top_k == 1)
        sample:  p = softmax(logits / temperature) restricted to the top_k largest
    """
    if temperature == 0.0 or top_k == 1:
        return np.argmax(logits, axis=-1)
    z = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]   # k-th largest per row
        z = np.where(z >= kth, z, -np.inf)                           # ties at the k-th may keep more
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    # inverse-CDF sampling, all rows at once: first v with cumsum(p)[v] > u
    u = rng.random((p.shape[0], 1))
    idx = np.sum(np.cumsum(p, axis=-1) <= u, axis=-1)
    return np.minimum(idx, p.shape[-1] - 1)


def _count_arg(n, name, where):
    """An integer >= 0 (a number of tokens)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"{where}: {name} is {n!r}; expected an integer >= 0")
    return int(n)


def _check_sampling(where, temperature, top_k, rng):
    temperature = v.number(temperature, "temperature", where, low=0.0)
    if top_k is not None:
        top_k = v.positive_int(top_k, "top_k", where)
    greedy = temperature == 0.0 or top_k == 1
    if not greedy and rng is None:
        raise ValueError(f"{where}: rng is None but sampling needs randomness (temperature="
                         f"{temperature}, top_k={top_k}); pass rng=np.random.default_rng(seed), "
                         "or use greedy decoding with top_k=1 or temperature=0")
    if not greedy:
        v.rng_arg(rng, where)
    return temperature, top_k


def generate(params, prompt_ids, *, config, max_new_tokens, temperature=1.0, top_k=None,
             rng=None, use_cache=True, eos_id=None, return_logits=False):
    """Autoregressive generation (000 §2.5, 003 §6.1-6.2): append ``max_new_tokens`` tokens.

    Each step feeds the model, takes the logits of the last position and picks the next
    token: greedy (``top_k=1`` or ``temperature=0``) or sampled from
    ``softmax(logits / temperature)`` over the ``top_k`` most likely tokens (all when
    None). Sampling needs ``rng`` (a np.random.Generator): without one it is a
    ValueError, never hidden global randomness.

    use_cache: True runs the prompt once and then one new token per step against the KV
               cache (003 §6.2); False re-runs the whole sequence each step (003 §6.2.1).
               Both give the same tokens.
    eos_id:    optional end-of-sequence id; a row that has produced it is filled with
               ``eos_id`` from then on, and generation stops early when every row has.
    return_logits: also return the logits each step chose from, (B, n_steps, V), where
               n_steps = max_new_tokens unless every row reached ``eos_id`` earlier.
    prompt_ids: (B, T) ints  ->  (B, T + max_new_tokens) ints (and the logits)

    With learned positions the model can read at most max_len positions: a request with
    T + max_new_tokens - 1 > max_len is a ValueError (no silent sliding window).
    """
    where = "generate"
    c = _check_config(config, where)
    prompt_ids = v.int_array(prompt_ids, "prompt_ids", where, low=0, high=c.vocab_size)
    if prompt_ids.ndim != 2 or prompt_ids.shape[1] == 0:
        raise ValueError(f"{where}: prompt_ids has shape {prompt_ids.shape}; expected (batch, T) "
                         "with T >= 1")
    max_new_tokens = _count_arg(max_new_tokens, "max_new_tokens", where)
    temperature, top_k = _check_sampling(where, temperature, top_k, rng)
    if eos_id is not None:
        eos_id = int(v.int_array(np.asarray(eos_id), "eos_id", where, low=0, high=c.vocab_size))
    B, T = prompt_ids.shape
    if c.positional == "learned" and T + max_new_tokens - 1 > c.max_len:
        raise ValueError(f"{where}: T + max_new_tokens - 1 = {T + max_new_tokens - 1} positions "
                         f"exceed max_len={c.max_len} (prompt T={T}, max_new_tokens="
                         f"{max_new_tokens}); learned positions have no row beyond max_len - 1")

    out = np.empty((B, T + max_new_tokens), dtype=prompt_ids.dtype)
    out[:, :T] = prompt_ids
    step_logits = []
    done = np.zeros(B, dtype=bool)
    kv = None
    n = T
    for _ in range(max_new_tokens):
        if use_cache:
            # prefill with the prompt, then feed one token against the cache (003 §6.2)
            new = out[:, :n] if kv is None else out[:, n - 1:n]
            logits, cache = gpt_forward(params, new, config=c, kv_cache=kv)
            kv = cache["kv_cache"]
        else:
            logits, _ = gpt_forward(params, out[:, :n], config=c)   # the whole sequence again
        last = logits[:, -1]                                           # (B, V) next-token logits
        step_logits.append(last)
        token = _next_token(last, temperature=temperature, top_k=top_k, rng=rng)
        if eos_id is not None:
            token = np.where(done, eos_id, token)
            done = done | (token == eos_id)
        out[:, n] = token
        n += 1
        if eos_id is not None and done.all():
            out[:, n:] = eos_id
            break
    if return_logits:
        if not step_logits:   # max_new_tokens = 0
            dtype = _check_params(params, gpt_param_shapes(c), where)
            return out, np.empty((B, 0, c.vocab_size), dtype=dtype)
        return out, np.stack(step_logits, axis=1)
    return out
