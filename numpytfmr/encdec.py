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

from .blocks import (decoder_block_backward, decoder_block_forward, encoder_block_backward,
                     encoder_block_forward, norm_backward, norm_forward)
from .contract import generator
from .losses import cross_entropy_backward, cross_entropy_forward
from .seq2seq import IGNORE, teacher_forcing
from .transformer import (append_tokens, block_kwargs, block_param_shapes, check_config,
                          check_config_fields, check_dlogits, check_ids, check_model,
                          check_params, config_from_dict, config_to_dict, embed_backward,
                          embed_forward, float_dtype, init_params, kv_cache_length,
                          lm_head_backward, lm_head_forward, norm_param_shapes, rope_option,
                          token_count, token_id)

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
        check_config_fields(self, "EncDecConfig",
                            ("src_vocab_size", "tgt_vocab_size", "n_enc_layers", "n_dec_layers"))

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def to_dict(self):
        """A plain dict (JSON-ready) of every field."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        return config_from_dict(cls, d)


def encdec_param_shapes(config):
    """``{key: shape}`` of every parameter of an encoder-decoder with this config."""
    c = check_config(config, EncDecConfig, "encdec_param_shapes")
    s = {"enc.wte": (c.src_vocab_size, c.d_model)}
    if c.positional == "learned":
        s["enc.wpe"] = (c.max_len, c.d_model)
    for l in range(c.n_enc_layers):
        s.update(block_param_shapes(f"enc.h{l}.", c))
    if c.norm == "pre":
        s.update(norm_param_shapes("enc.norm_f", c))
    s["dec.wte"] = (c.tgt_vocab_size, c.d_model)
    if c.positional == "learned":
        s["dec.wpe"] = (c.max_len, c.d_model)
    for l in range(c.n_dec_layers):
        s.update(block_param_shapes(f"dec.h{l}.", c, cross=True))
    if c.norm == "pre":
        s.update(norm_param_shapes("dec.norm_f", c))
    if not c.tie_embeddings:
        s["lm_head.W"] = (c.d_model, c.tgt_vocab_size)
    return s


def init_encdec(config, *, rng, dtype=np.float32):
    """Initial parameters (GPT-2 scheme, as :func:`init_gpt`; the residual projections are
    scaled by `1/sqrt(2 * (n_enc_layers + n_dec_layers))`)."""
    where = "init_encdec"
    c = check_config(config, EncDecConfig, where)
    generator(rng, "rng", where)
    return init_params(encdec_param_shapes(c), c.n_enc_layers + c.n_dec_layers, rng=rng,
                       dtype=float_dtype(dtype, where))


def source_key_mask(src_mask, src_ids, where):
    """(B, S) bool "real token" mask -> (B, 1, 1, S) key mask over the (B, heads, n_q, S)
    scores: padded source positions are never attended to. None stays None."""
    if src_mask is None:
        return None
    src_mask = np.asarray(src_mask)
    if src_mask.dtype != np.bool_ or src_mask.shape != src_ids.shape:
        raise ValueError(f"{where}: src_mask has dtype {src_mask.dtype} and shape "
                         f"{src_mask.shape}; expected a bool array of src_ids' shape "
                         f"{src_ids.shape} (True = real token, False = padding)")
    return src_mask[:, None, None, :]


# ---------------------------------------------------------------------------------------
# The two stacks (the cache keys are the parameters' prefixes: "enc.h0", "dec.h0", ...)
# ---------------------------------------------------------------------------------------

def encoder_forward(params, src_ids, c, *, key_mask=None, rng=None, train=False):
    """The encoder (004 "Transformer Encoder"): `memory = N_f(enc_blocks(E_src[src] + P))`.

    src_ids: (B, S) checked ids;  key_mask: :func:`source_key_mask` or None
    ->  memory (B, S, d_model), cache (keys "enc.embed", "enc.h{l}", "enc.norm_f",
        "enc_attn_weights", "config", "options")
    """
    o, rope = block_kwargs(c, rng=rng, train=train), rope_option(c)
    cache = {"config": c, "options": o}
    x, cache["enc.embed"] = embed_forward(params, src_ids, np.arange(src_ids.shape[1]), c,
                                          prefix="enc.", rng=rng, train=train)     # E_src[src] + P
    for l in range(c.n_enc_layers):                        # no future mask (004 "Transformer Encoder")
        x, cache[f"enc.h{l}"] = encoder_block_forward(x, params, prefix=f"enc.h{l}.", mask=key_mask,
                                                      rope=rope, **o)              # x = block_l(x)
    if c.norm == "pre":
        x, cache["enc.norm_f"] = norm_forward(x, params, "enc.norm_f", o)         # memory = N_f(x)
    cache["enc_attn_weights"] = [cache[f"enc.h{l}"]["attn_weights"] for l in range(c.n_enc_layers)]
    return x, cache


def encoder_backward(dmemory, cache):
    """Backward of :func:`encoder_forward`: the gradients of the encoder's parameters."""
    c, o, grads = cache["config"], cache["options"], {}
    dx = dmemory
    if c.norm == "pre":
        dx = norm_backward(dx, cache["enc.norm_f"], grads, "enc.norm_f", o)       # memory = N_f(x)
    for l in reversed(range(c.n_enc_layers)):
        dx, _, g = encoder_block_backward(dx, cache[f"enc.h{l}"])                 # x = block_l(x)
        grads.update(g)
    embed_backward(dx, cache["enc.embed"], grads)                                 # E_src[src] + P
    return grads


def decoder_forward(params, tgt_ids, memory, c, *, key_mask=None, kv_cache=None, rng=None,
                    train=False):
    """The decoder (004 "Transformer Decoder", "Decoder Process with Cross-Attention"):

        logits = N_f(dec_blocks(E_tgt[tgt] + P, memory)) W_out

    tgt_ids: (B, T) checked ids (the new ones after the ``kv_cache`` positions, if given)
    memory: (B, S, d_model) the encoder output;  key_mask: source padding or None
    ->  logits (B, T, tgt_vocab_size), cache (keys "dec.embed", "dec.h{l}", "dec.norm_f",
        "lm_head", "dec_attn_weights", "cross_weights", "kv_cache", "config", "options")
    """
    o, rope = block_kwargs(c, rng=rng, train=train), rope_option(c)
    n_past = 0 if kv_cache is None else kv_cache_length(kv_cache, c.n_dec_layers, "encdec_forward")
    past = [None] * c.n_dec_layers if kv_cache is None else kv_cache
    positions = np.arange(n_past, n_past + tgt_ids.shape[1])
    cache = {"config": c, "options": o}
    y, cache["dec.embed"] = embed_forward(params, tgt_ids, positions, c, prefix="dec.", rng=rng,
                                          train=train)                             # E_tgt[tgt] + P
    for l in range(c.n_dec_layers):                        # causal self-attention, cross-attention, FFN
        y, cache[f"dec.h{l}"] = decoder_block_forward(y, memory, params, prefix=f"dec.h{l}.",
                                                      memory_mask=key_mask, rope=rope,
                                                      kv_cache=past[l], **o)       # y = block_l(y, m)
    if c.norm == "pre":
        y, cache["dec.norm_f"] = norm_forward(y, params, "dec.norm_f", o)         # y = N_f(y)
    logits, cache["lm_head"] = lm_head_forward(y, params, c, table="dec.wte")     # y W_out
    blocks = [cache[f"dec.h{l}"] for l in range(c.n_dec_layers)]
    cache["dec_attn_weights"] = [b["attn_weights"] for b in blocks]
    cache["cross_weights"] = [b["cross_weights"] for b in blocks]     # the alignment tables
    cache["kv_cache"] = [b["kv_cache"] for b in blocks]
    return logits, cache


def decoder_backward(dlogits, cache):
    """Backward of :func:`decoder_forward`: ``(dmemory, grads)``; ``dmemory`` sums the
    gradients of every decoder layer's cross-attention keys and values."""
    c, o, grads = cache["config"], cache["options"], {}
    dy = lm_head_backward(dlogits, cache["lm_head"], grads, c, table="dec.wte")  # y W_out
    if c.norm == "pre":
        dy = norm_backward(dy, cache["dec.norm_f"], grads, "dec.norm_f", o)       # y = N_f(y)
    dmemory = 0.0
    for l in reversed(range(c.n_dec_layers)):
        dy, dmem, g = decoder_block_backward(dy, cache[f"dec.h{l}"])              # y = block_l(y, m)
        dmemory = dmemory + dmem                # memory feeds every decoder layer's cross-attention
        grads.update(g)
    embed_backward(dy, cache["dec.embed"], grads)                                 # E_tgt[tgt] + P
    return dmemory, grads


# ---------------------------------------------------------------------------------------
# Forward / backward / loss
# ---------------------------------------------------------------------------------------

def check_encdec_inputs(params, src_ids, tgt_ids, src_mask, config, rng, train, where):
    """The checks at the model's entry: ``(config, dtype of the params, src_ids, tgt_ids,
    key_mask)``, the ids (B, S) and (B, T) in their vocabularies with one batch size, and
    the source padding as the key mask of :func:`source_key_mask`."""
    c, dtype = check_model(params, config, EncDecConfig, encdec_param_shapes, where, rng=rng,
                           train=train)
    src_ids = check_ids(src_ids, "src_ids", c.src_vocab_size, c, where)
    tgt_ids = check_ids(tgt_ids, "tgt_ids", c.tgt_vocab_size, c, where)
    if src_ids.shape[0] != tgt_ids.shape[0]:
        raise ValueError(f"{where}: src_ids has shape {src_ids.shape} and tgt_ids has shape "
                         f"{tgt_ids.shape}; expected the same batch size")
    return c, dtype, src_ids, tgt_ids, source_key_mask(src_mask, src_ids, where)


def encdec_forward(params, src_ids, tgt_ids, *, config, src_mask=None, rng=None, train=False):
    """Forward pass of the encoder-decoder (module docstring): ``(logits, cache)``.

        memory = encoder(src);   logits = decoder(tgt, memory)

    params:  dict from :func:`init_encdec`
    src_ids: (B, S) source ids in `[0, src_vocab_size)`
    tgt_ids: (B, T) decoder input ids in `[0, tgt_vocab_size)` (teacher forcing: the target
             shifted right behind a start token)
    src_mask: optional (B, S) bool, True = real source token, False = padding: padded
             source positions are never attended to (encoder self-attention and
             cross-attention)
    rng, train: dropout
    returns logits (B, T, tgt_vocab_size), cache

    cache: a flat dict of the steps' caches keyed like the parameters ("enc.embed",
    "enc.h0", ..., "enc.norm_f", "dec.embed", "dec.h0", ..., "dec.norm_f", "lm_head"),
    and for readers "memory" (B, S, d_model) the encoder output; "cross_weights" list per
    decoder layer of (B, n_heads, T, S) cross-attention weights (the alignment table);
    "enc_attn_weights", "dec_attn_weights" the self-attention weights.
    """
    c, dtype, src_ids, tgt_ids, key_mask = check_encdec_inputs(
        params, src_ids, tgt_ids, src_mask, config, rng, train, "encdec_forward")
    memory, cache = encoder_forward(params, src_ids, c, key_mask=key_mask, rng=rng, train=train)
    logits, dec = decoder_forward(params, tgt_ids, memory, c, key_mask=key_mask, rng=rng,
                                  train=train)
    cache.update(dec)
    cache.update(dtype=dtype, memory=memory, logits_shape=logits.shape)
    return logits, cache


def encdec_backward(dlogits, cache):
    """Backward of :func:`encdec_forward`: a dict of gradients with the keys of ``params``.

    Decoder first (final linear, norm, blocks in reverse, embeddings), collecting the
    gradient of ``memory`` from every cross-attention; then the encoder in reverse.
    """
    dlogits = check_dlogits(dlogits, cache, "encdec_backward")
    dmemory, grads = decoder_backward(dlogits, cache)          # logits = decoder(tgt, memory)
    grads.update(encoder_backward(dmemory, cache))             # memory = encoder(src)
    return grads


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
    tgt_in, targets = teacher_forcing(batch, "encdec_loss")
    logits, cache = encdec_forward(params, batch["src_ids"], tgt_in, config=config,
                                   src_mask=batch.get("src_mask"), rng=rng, train=train)
    loss, c_loss = cross_entropy_forward(logits, targets, label_smoothing=label_smoothing,
                                         ignore_index=IGNORE)
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
    output, each (B, n_heads, n_steps, S) (row `t`: where the model looked to choose token `t+1`).
    """
    where = "encdec_generate"
    c = check_config(config, EncDecConfig, where)
    check_params(params, encdec_param_shapes(c), where)
    src_ids = check_ids(src_ids, "src_ids", c.src_vocab_size, c, where)
    max_new_tokens = token_count(max_new_tokens, "max_new_tokens", where)
    bos_id = token_id(bos_id, "bos_id", c.tgt_vocab_size, where)
    if eos_id is not None:
        eos_id = token_id(eos_id, "eos_id", c.tgt_vocab_size, where)
    if c.positional == "learned" and max_new_tokens > c.max_len:
        raise ValueError(f"{where}: max_new_tokens is {max_new_tokens} but max_len={c.max_len}; "
                         "the decoder would read positions beyond the learned table")
    key_mask = source_key_mask(src_mask, src_ids, where)
    memory, _ = encoder_forward(params, src_ids, c, key_mask=key_mask)

    B = src_ids.shape[0]
    out = np.full((B, 1 + max_new_tokens), bos_id, dtype=np.int64)
    kv, weights = None, []

    def next_logits(n):                       # (B, V): the logits after out[:, :n]
        nonlocal kv
        new = out[:, :n] if (kv is None or not use_cache) else out[:, n - 1:n]
        logits, dec = decoder_forward(params, new, memory, c, key_mask=key_mask,
                                      kv_cache=kv if use_cache else None)
        if use_cache:
            kv = dec["kv_cache"]
        weights.append([w[..., -1:, :] for w in dec["cross_weights"]])   # the newest query row
        return logits[:, -1]

    append_tokens(next_logits, out, 1, eos_id=eos_id)      # greedy: the most probable token
    if return_cross_weights:
        per_layer = [np.concatenate([w[l] for w in weights], axis=-2) if weights else None
                     for l in range(c.n_dec_layers)]
        return out, per_layer
    return out
