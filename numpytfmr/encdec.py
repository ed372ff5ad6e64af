"""An encoder-decoder transformer (sequence-to-sequence): config, init, forward, backward,
loss and greedy decoding.

Covers 004 "Types of Transformers" (encoder-decoder), "Transformer Encoder-Decoder",
"Cross-Attention", "Decoder Process with Cross-Attention", "Encoder-Decoder Example" and
"The Final Linear and Softmax Layer"; 003 §8.1 and 000 §2.4.

    encoder:  x = E_src[src] + P;   x = enc_block_l(x), l = 0..L_enc-1;   memory = N_f(x)
    decoder:  y = E_tgt[tgt] + P;   y = dec_block_l(y, memory), l = 0..L_dec-1;   y = N_f(y)
    logits = y W_out                 (W_out = E_tgt^T when tied)

Each decoder block runs masked self-attention, cross-attention with queries from the
decoder and keys/values from ``memory`` (004 "Cross-Attention"), and the FFN. The
cross-attention weights of every decoder layer are in ``cache["cross_weights"]``: the
soft alignment between target and source positions (a translation's alignment table).

Parameter keys (see :func:`encdec_param_shapes`): ``enc.wte``, ``enc.wpe`` (learned),
``enc.h{l}.*`` (encoder blocks, keys as in blocks.py), ``enc.norm_f.*`` (pre-norm);
``dec.wte``, ``dec.wpe``, ``dec.h{l}.*`` (decoder blocks, with ``cross_norm.*`` and
``cross.*``), ``dec.norm_f.*``; ``lm_head.W`` (untied only).
"""
from dataclasses import dataclass

import numpy as np

from . import _validate as v
from .blocks import (decoder_block_backward, decoder_block_forward, encoder_block_backward,
                     encoder_block_forward)
from .gpt import (_add_grads, _block_options, _block_shapes, _cache_length, _check_config,
                  _check_fields, _check_params, _config_from_dict, _config_to_dict, _count_arg,
                  _dtype_arg, _embed_backward, _embed_forward, _final_norm_backward,
                  _final_norm_forward, _final_norm_shapes, _head_backward, _head_forward,
                  _init_from_shapes, _masked_targets, _rope_option)
from .losses import cross_entropy_backward, cross_entropy_forward

__all__ = ["EncDecConfig", "init_encdec", "encdec_param_shapes", "encdec_forward",
           "encdec_backward", "encdec_loss", "encdec_generate"]


@dataclass(frozen=True)
class EncDecConfig:
    """The shape and options of an encoder-decoder transformer.

    src_vocab_size, tgt_vocab_size: the two vocabularies (source and target tokens)
    n_enc_layers, n_dec_layers: encoder and decoder blocks
    the other fields as in :class:`GPTConfig`; ``max_len`` bounds both sequences with
    learned positions; ``tie_embeddings`` ties the decoder's table to the output layer.
    RoPE, when chosen, rotates the self-attention of both stacks (not the cross-attention,
    whose queries and keys live in different sequences).
    """
    src_vocab_size: int
    tgt_vocab_size: int
    n_enc_layers: int
    n_dec_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int = None
    d_ff: int = None
    max_len: int = 256
    positional: str = "sinusoidal"
    norm: str = "pre"
    activation: str = "relu"
    tie_embeddings: bool = True
    dropout: float = 0.0
    norm_type: str = "layernorm"
    norm_eps: float = 1e-5
    bias: bool = True
    rope_base: float = 10000.0
    rope_layout: str = "interleaved"
    rope_scaling: dict = None

    def __post_init__(self):
        _check_fields(self, "EncDecConfig",
                      ("src_vocab_size", "tgt_vocab_size", "n_enc_layers", "n_dec_layers"))

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def to_dict(self):
        """A plain dict (JSON-ready) of every field."""
        return _config_to_dict(self)

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        return _config_from_dict(cls, d)


def encdec_param_shapes(config):
    """``{key: shape}`` of every parameter of an encoder-decoder with this config."""
    c = _check_config(config, "encdec_param_shapes", EncDecConfig)
    s = {"enc.wte": (c.src_vocab_size, c.d_model)}
    if c.positional == "learned":
        s["enc.wpe"] = (c.max_len, c.d_model)
    for l in range(c.n_enc_layers):
        s.update(_block_shapes(f"enc.h{l}.", c))
    if c.norm == "pre":
        s.update(_final_norm_shapes("enc.norm_f", c))
    s["dec.wte"] = (c.tgt_vocab_size, c.d_model)
    if c.positional == "learned":
        s["dec.wpe"] = (c.max_len, c.d_model)
    for l in range(c.n_dec_layers):
        s.update(_block_shapes(f"dec.h{l}.", c, cross=True))
    if c.norm == "pre":
        s.update(_final_norm_shapes("dec.norm_f", c))
    if not c.tie_embeddings:
        s["lm_head.W"] = (c.d_model, c.tgt_vocab_size)
    return s


def init_encdec(config, *, rng, dtype=np.float32):
    """Initial parameters (GPT-2 scheme, as :func:`init_gpt`; the residual projections are
    scaled by 1/sqrt(2 * (n_enc_layers + n_dec_layers)))."""
    where = "init_encdec"
    c = _check_config(config, where, EncDecConfig)
    v.rng_arg(rng, where)
    dtype = _dtype_arg(dtype, where)
    return _init_from_shapes(encdec_param_shapes(c), c.n_enc_layers + c.n_dec_layers, rng, dtype)


# ---------------------------------------------------------------------------------------
# The two stacks
# ---------------------------------------------------------------------------------------

def _check_ids(ids, name, vocab, c, where, n_past=0):
    ids = v.int_array(ids, name, where, low=0, high=vocab)
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} has shape {ids.shape}; expected (batch, T) with T >= 1")
    if c.positional == "learned" and n_past + ids.shape[1] > c.max_len:
        raise ValueError(f"{where}: {name} reaches position {n_past + ids.shape[1] - 1} but "
                         f"max_len={c.max_len}; learned positions have rows 0..{c.max_len - 1} only")
    return ids


def _key_mask(src_mask, src_ids, where):
    """(B, S) bool "real token" mask -> (B, 1, 1, S) key mask over (B, heads, n_q, S) scores."""
    if src_mask is None:
        return None
    src_mask = np.asarray(src_mask)
    if src_mask.dtype != np.bool_ or src_mask.shape != src_ids.shape:
        raise ValueError(f"{where}: src_mask has dtype {src_mask.dtype} and shape "
                         f"{src_mask.shape}; expected a bool array of src_ids' shape "
                         f"{src_ids.shape} (True = real token, False = padding)")
    return src_mask[:, None, None, :]


def _encoder_forward(params, src_ids, c, *, key_mask, rng, train):
    """memory = N_f(enc_blocks(E_src[src] + P)): (B, S, d_model) and its cache."""
    S = src_ids.shape[1]
    cache = {"blocks": [], "attn_weights": []}
    x, cache["embed"] = _embed_forward(params, src_ids, np.arange(S), c, tok_key="enc.wte",
                                       pos_key="enc.wpe", rng=rng, train=train)
    opts = _block_options(c, rng=rng, train=train)
    for l in range(c.n_enc_layers):
        # x = x + attn(N(x));  x = x + ffn(N(x))     (no future mask, 004 "Transformer Encoder")
        x, cb = encoder_block_forward(x, params, prefix=f"enc.h{l}.", mask=key_mask,
                                      rope=_rope_option(c), **opts)
        cache["blocks"].append(cb)
        cache["attn_weights"].append(cb["attn_weights"])
    if c.norm == "pre":
        x, cache["norm_f"] = _final_norm_forward(x, params, "enc.norm_f", c)
    return x, cache


def _encoder_backward(dmemory, cache, c):
    """Gradients of the encoder's parameters from the gradient of its output ``memory``."""
    grads = {}
    dx = dmemory
    if c.norm == "pre":
        dx, grads = _final_norm_backward(dx, cache["norm_f"], "enc.norm_f", c)   # memory = N_f(x)
    for cb in reversed(cache["blocks"]):
        dx, g = encoder_block_backward(dx, cb)                                   # x = block(x)
        grads.update(g)
    return _add_grads(grads, _embed_backward(dx, cache["embed"]))                # x = E[src] + P


def _decoder_forward(params, tgt_ids, memory, c, *, key_mask, kv_cache, rng, train):
    """logits = N_f(dec_blocks(E_tgt[tgt] + P, memory)) W_out and the cache."""
    T = tgt_ids.shape[1]
    n_past = 0 if kv_cache is None else _cache_length(kv_cache, c.n_dec_layers, "encdec_forward")
    cache = {"blocks": [], "attn_weights": [], "cross_weights": [], "kv_cache": []}
    y, cache["embed"] = _embed_forward(params, tgt_ids, np.arange(n_past, n_past + T), c,
                                       tok_key="dec.wte", pos_key="dec.wpe", rng=rng, train=train)
    opts = _block_options(c, rng=rng, train=train)
    for l in range(c.n_dec_layers):
        # y = y + attn(N(y), causal);  y = y + cross(N(y), memory);  y = y + ffn(N(y))
        y, cb = decoder_block_forward(y, memory, params, prefix=f"dec.h{l}.", memory_mask=key_mask,
                                      rope=_rope_option(c),
                                      kv_cache=None if kv_cache is None else kv_cache[l], **opts)
        cache["blocks"].append(cb)
        for k in ("attn_weights", "cross_weights", "kv_cache"):
            cache[k].append(cb[k])
    if c.norm == "pre":
        y, cache["norm_f"] = _final_norm_forward(y, params, "dec.norm_f", c)
    logits, cache["head"] = _head_forward(y, params, "dec.wte", c.tie_embeddings)
    return logits, cache


def _decoder_backward(dlogits, cache, c):
    """Gradients of the decoder's parameters and dmemory (summed over the decoder layers)."""
    dy, grads = _head_backward(dlogits, cache["head"], "dec.wte", c.tie_embeddings)  # logits = y W_out
    if c.norm == "pre":
        dy, g = _final_norm_backward(dy, cache["norm_f"], "dec.norm_f", c)            # y = N_f(y)
        grads.update(g)
    dmemory = 0.0
    for cb in reversed(cache["blocks"]):
        dy, dmem, g = decoder_block_backward(dy, cb)                         # y = block(y, memory)
        dmemory = dmemory + dmem          # memory feeds every decoder layer's cross-attention
        grads.update(g)
    return _add_grads(grads, _embed_backward(dy, cache["embed"])), dmemory             # y = E[tgt] + P


# ---------------------------------------------------------------------------------------
# Forward / backward / loss
# ---------------------------------------------------------------------------------------

def encdec_forward(params, src_ids, tgt_ids, *, config, src_mask=None, rng=None, train=False):
    """Forward pass of the encoder-decoder (module docstring): ``(logits, cache)``.

    params:  dict from :func:`init_encdec`
    src_ids: (B, S) source ids in [0, src_vocab_size)
    tgt_ids: (B, T) decoder input ids in [0, tgt_vocab_size) (teacher forcing: the target
             shifted right behind a start token)
    src_mask: optional (B, S) bool, True = real source token, False = padding: padded
             source positions are never attended to (encoder self-attention and
             cross-attention)
    rng, train: dropout
    returns logits (B, T, tgt_vocab_size), cache

    cache keys for readers: "memory" (B, S, d_model) encoder output; "cross_weights" list
    per decoder layer of (B, n_heads, T, S) cross-attention weights (the alignment
    table); "enc_attn_weights", "dec_attn_weights" the self-attention weights.
    """
    where = "encdec_forward"
    c = _check_config(config, where, EncDecConfig)
    dtype = _check_params(params, encdec_param_shapes(c), where)
    src_ids = _check_ids(src_ids, "src_ids", c.src_vocab_size, c, where)
    tgt_ids = _check_ids(tgt_ids, "tgt_ids", c.tgt_vocab_size, c, where)
    if src_ids.shape[0] != tgt_ids.shape[0]:
        raise ValueError(f"{where}: src_ids has shape {src_ids.shape} and tgt_ids has shape "
                         f"{tgt_ids.shape}; expected the same batch size")
    if train and c.dropout > 0.0:
        v.rng_arg(rng, where)
    key_mask = _key_mask(src_mask, src_ids, where)
    memory, enc = _encoder_forward(params, src_ids, c, key_mask=key_mask, rng=rng, train=train)
    logits, dec = _decoder_forward(params, tgt_ids, memory, c, key_mask=key_mask, kv_cache=None,
                                   rng=rng, train=train)
    cache = {"config": c, "dtype": dtype, "enc": enc, "dec": dec, "memory": memory,
             "cross_weights": dec["cross_weights"], "enc_attn_weights": enc["attn_weights"],
             "dec_attn_weights": dec["attn_weights"], "logits_shape": logits.shape}
    return logits, cache


def encdec_backward(dlogits, cache):
    """Backward of :func:`encdec_forward`: a dict of gradients with the keys of ``params``.

    Decoder first (final linear, norm, blocks in reverse, embeddings), collecting the
    gradient of ``memory`` from every cross-attention; then the encoder in reverse.
    """
    where = "encdec_backward"
    c = cache["config"]
    dlogits = v.upstream(dlogits, "dlogits", where, cache["logits_shape"], cache["dtype"],
                         what="the logits'")
    grads, dmemory = _decoder_backward(dlogits, cache["dec"], c)
    return _add_grads(grads, _encoder_backward(dmemory, cache["enc"], c))


def encdec_loss(params, batch, *, config, label_smoothing=0.0, rng=None, train=False):
    """Mean cross-entropy of the next target token and the gradients: ``(loss, grads)``.

    batch: a dict (e.g. a batch of ``make_translation``'s arrays) with ``"src_ids"`` (B, S),
        ``"tgt_ids"`` (B, T+1) = ``<bos> tokens <eos> <pad>...``, optional ``"src_mask"``
        (B, S) bool (True = real token) and ``"loss_mask"`` (B, T+1) bool (True where a
        token is to be predicted; default: every position after the first).
    The decoder reads ``tgt_ids[:, :-1]`` (teacher forcing) and is scored on
    ``tgt_ids[:, 1:]`` where ``loss_mask[:, 1:]`` (003 eq. 2.2). loss is a Python float;
    grads a dict with the keys of ``params``.
    """
    where = "encdec_loss"
    tgt = v.seq2seq_targets(batch, where)
    loss_mask = batch.get("loss_mask")
    loss_mask = None if loss_mask is None else np.asarray(loss_mask)[:, 1:]
    targets, ignore = _masked_targets(tgt[:, 1:], loss_mask, None, where)
    logits, cache = encdec_forward(params, batch["src_ids"], tgt[:, :-1], config=config,
                                   src_mask=batch.get("src_mask"), rng=rng, train=train)
    loss, c_loss = cross_entropy_forward(logits, targets, label_smoothing=label_smoothing,
                                         ignore_index=ignore)
    dlogits, _ = cross_entropy_backward(1.0, c_loss)
    return float(loss), encdec_backward(dlogits, cache)


# ---------------------------------------------------------------------------------------
# Greedy decoding (004 "Encoder-Decoder Example")
# ---------------------------------------------------------------------------------------

def encdec_generate(params, src_ids, *, config, max_new_tokens, bos_id, eos_id=None,
                    src_mask=None, use_cache=True, return_cross_weights=False):
    """Greedy decoding (004 "Encoder-Decoder Example"): encode the source once, then start
    from ``bos_id`` and append the most probable next token ``max_new_tokens`` times.

    use_cache: feed one token per step against the decoder's self-attention KV cache
               (003 §6.2); the cross-attention recomputes the keys/values of ``memory``
               each step (they never change). False re-runs the whole target prefix.
    eos_id:    a row that has produced it is filled with ``eos_id`` from then on; the loop
               stops early once every row has.
    returns (B, 1 + max_new_tokens) ids, starting with ``bos_id``; with
    ``return_cross_weights`` also the cross-attention weights of every layer for the
    output, each (B, n_heads, n_steps, S) (row t: where the model looked to choose token t+1).
    """
    where = "encdec_generate"
    c = _check_config(config, where, EncDecConfig)
    _check_params(params, encdec_param_shapes(c), where)
    src_ids = _check_ids(src_ids, "src_ids", c.src_vocab_size, c, where)
    max_new_tokens = _count_arg(max_new_tokens, "max_new_tokens", where)
    bos_id = int(v.int_array(np.asarray(bos_id), "bos_id", where, low=0, high=c.tgt_vocab_size))
    if eos_id is not None:
        eos_id = int(v.int_array(np.asarray(eos_id), "eos_id", where, low=0, high=c.tgt_vocab_size))
    if c.positional == "learned" and max_new_tokens > c.max_len:
        raise ValueError(f"{where}: max_new_tokens is {max_new_tokens} but max_len={c.max_len}; "
                         "the decoder would read positions beyond the learned table")
    key_mask = _key_mask(src_mask, src_ids, where)
    memory, _ = _encoder_forward(params, src_ids, c, key_mask=key_mask, rng=None, train=False)

    B = src_ids.shape[0]
    out = np.full((B, 1 + max_new_tokens), bos_id, dtype=np.int64)
    done = np.zeros(B, dtype=bool)
    kv, weights = None, []
    n = 1
    for _ in range(max_new_tokens):
        new = out[:, :n] if (kv is None or not use_cache) else out[:, n - 1:n]
        logits, dec = _decoder_forward(params, new, memory, c, key_mask=key_mask,
                                       kv_cache=kv if use_cache else None, rng=None, train=False)
        if use_cache:
            kv = dec["kv_cache"]
        weights.append([w[..., -1:, :] for w in dec["cross_weights"]])   # the newest query row
        token = np.argmax(logits[:, -1], axis=-1)
        if eos_id is not None:
            token = np.where(done, eos_id, token)
            done = done | (token == eos_id)
        out[:, n] = token
        n += 1
        if eos_id is not None and done.all():
            out[:, n:] = eos_id
            break
    if return_cross_weights:
        per_layer = [np.concatenate([w[l] for w in weights], axis=-2) if weights else None
                     for l in range(c.n_dec_layers)]
        return out, per_layer
    return out
