"""The model families the commands train and a checkpoint can hold.

``"gpt"`` (gpt.py), and the two sequence-to-sequence models of the toy translation task:
``"encdec"`` (encdec.py, the transformer) and ``"rnn"`` (rnn.py, the GRU encoder-decoder
with Bahdanau attention). :func:`seq2seq_model` puts the functions of one seq2seq family
into a dict, so that training, evaluation, checkpoints and the alignment table treat the
two alike.
"""
from .. import encdec, rnn
from ..gpt import GPTConfig
from .tokenizers import BOS_ID, EOS_ID

__all__ = ["default_gpt_config", "replace_config", "SEQ2SEQ_KINDS", "seq2seq_model"]

SEQ2SEQ_KINDS = ("encdec", "rnn")


def default_gpt_config(vocab_size, max_len=8):
    """The model ``numpytfmr train`` trains by default: 2 layers, d_model 64, 4 heads,
    learned positions, pre-norm, ReLU FFN (d_ff 256), tied embeddings; the context is the
    longest sequence of the task (``<bos>``, ``max_len`` digits, ``<sep>``, ``max_len``
    digits, ``<eos>``)."""
    return GPTConfig(vocab_size=vocab_size, n_layers=2, d_model=64, n_heads=4, d_ff=256,
                     max_len=2 * max_len + 3, positional="learned", norm="pre",
                     activation="relu", tie_embeddings=True)


def replace_config(config, **changes):
    """A copy of a model config with some fields changed; the derived defaults follow:
    ``n_kv_heads`` follows a new ``n_heads`` and ``d_ff`` a new ``d_model`` (4 d_model)
    unless they are given too (``dataclasses.replace`` would keep the old values)."""
    d = config.to_dict()
    if "n_heads" in changes and "n_kv_heads" in d and "n_kv_heads" not in changes:
        d["n_kv_heads"] = None
    if "d_model" in changes and "d_ff" in d and "d_ff" not in changes:
        d["d_ff"] = None
    d.update(changes)
    return type(config)(**d)


def seq2seq_model(kind):
    """The functions of one seq2seq model family, as a dict, so that the training loop, the
    evaluation and the alignment table treat the transformer and the recurrent model alike::

        config_cls, shapes(cfg), src_vocab(cfg), tgt_vocab(cfg), init(cfg, rng),
        default_config(src_vocab_size, tgt_vocab_size),
        loss(params, batch, cfg) -> (loss, grads)     batch: make_translation's arrays
        generate(params, src_ids, src_mask, cfg, max_new, use_cache)
            -> (ids (B, 1 + max_new), weights (B, n_steps, S))

    ``weights`` row t is the attention over the source words used to choose word t+1: for
    the transformer the last decoder layer's cross-attention averaged over its heads, for
    the recurrent model the Bahdanau weights alpha_ts.
    """
    if kind == "encdec":
        def generate(params, src, src_mask, cfg, max_new, use_cache=True):
            out, per_layer = encdec.encdec_generate(
                params, src, config=cfg, max_new_tokens=max_new, bos_id=BOS_ID, eos_id=EOS_ID,
                src_mask=src_mask, use_cache=use_cache, return_cross_weights=True)
            return out, per_layer[-1].mean(axis=1)   # (B, heads, steps, S) -> (B, steps, S)

        return _family(encdec.EncDecConfig, encdec.encdec_param_shapes, encdec.init_encdec,
                       encdec.encdec_loss, generate, dict(
                           n_enc_layers=2, n_dec_layers=2, d_model=64, n_heads=4, d_ff=256,
                           max_len=16, positional="learned", norm="pre", activation="relu"))
    if kind == "rnn":
        def generate(params, src, src_mask, cfg, max_new, use_cache=True):
            # one GRU step per word: the state carries the past, there is no KV cache
            return rnn.rnn_seq2seq_generate(params, src, config=cfg, max_new_tokens=max_new,
                                            bos_id=BOS_ID, eos_id=EOS_ID, src_mask=src_mask,
                                            return_weights=True)

        return _family(rnn.RNNSeq2SeqConfig, rnn.rnn_seq2seq_param_shapes, rnn.init_seq2seq_rnn,
                       rnn.rnn_seq2seq_loss, generate,
                       dict(d_emb=32, d_hidden=64, bidirectional=True))
    raise ValueError(f"seq2seq_model: kind is {kind!r}; expected one of {SEQ2SEQ_KINDS}")


def _family(config_cls, shapes, init, loss, generate, defaults):
    """The dict of :func:`seq2seq_model` for one family: its config class, its functions
    and its default shape (``defaults``, the config's fields besides the two vocabularies)."""
    return {
        "config_cls": config_cls, "shapes": shapes,
        "src_vocab": lambda c: c.src_vocab_size, "tgt_vocab": lambda c: c.tgt_vocab_size,
        "init": lambda c, rng: init(c, rng=rng),
        "loss": lambda p, batch, c: loss(p, batch, config=c),
        "generate": generate,
        "default_config": lambda sv, tv: config_cls(src_vocab_size=sv, tgt_vocab_size=tv,
                                                    **defaults),
    }
