"""Sequence-to-sequence training batches, shared by the encoder-decoder transformer
(encdec.py) and the recurrent encoder-decoder (rnn.py): teacher forcing (003 eq. 2.2).

A batch is a dict of ``make_translation``'s arrays: ``"src_ids"`` (B, S), ``"tgt_ids"``
(B, T+1) = ``<bos> tokens <eos> <pad>...``, optional ``"src_mask"`` (B, S) bool (True =
real token) and ``"loss_mask"`` (B, T+1) bool (True where a token is to be predicted).
The decoder reads ``tgt_ids[:, :-1]`` and is scored on ``tgt_ids[:, 1:]``: at every step
it is given the true previous token, not its own guess.
"""
import numpy as np

from .contract import int_array

IGNORE = -1     # the target of a position left out of the loss


def teacher_forcing(batch, where):
    """``(decoder_inputs, targets)`` of a seq2seq batch: ``tgt_ids[:, :-1]`` and
    ``tgt_ids[:, 1:]``, the targets set to ``IGNORE`` (-1) where ``loss_mask[:, 1:]`` is
    False (default: every position after the first is scored)."""
    if not isinstance(batch, dict):
        raise TypeError(f"{where}: batch is a {type(batch).__name__}; expected a dict with "
                        "'src_ids', 'tgt_ids' and optionally 'src_mask', 'loss_mask'")
    for k in ("src_ids", "tgt_ids"):
        if k not in batch:
            raise ValueError(f"{where}: batch has keys {sorted(batch)}; expected a key {k!r}")
    tgt = int_array(batch["tgt_ids"], "batch['tgt_ids']", where)
    if tgt.ndim != 2 or tgt.shape[1] < 2:
        raise ValueError(f"{where}: batch['tgt_ids'] has shape {tgt.shape}; expected (B, T+1) "
                         "with T+1 >= 2 (a start token and at least one token to predict)")
    loss_mask = batch.get("loss_mask")
    loss_mask = np.ones(tgt.shape, dtype=bool) if loss_mask is None else np.asarray(loss_mask)
    if loss_mask.dtype != np.bool_ or loss_mask.shape != tgt.shape:
        raise ValueError(f"{where}: loss_mask has dtype {loss_mask.dtype} and shape "
                         f"{loss_mask.shape}; expected a bool array of tgt_ids' shape {tgt.shape} "
                         "(True = scored)")
    return tgt[:, :-1], np.where(loss_mask[:, 1:], tgt[:, 1:], IGNORE)
