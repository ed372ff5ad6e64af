"""Fine-tuning a model of text on one's own data: what ``numpytfmr lora`` and ``numpytfmr
dpo`` run on a checkpoint of ``numpytfmr pretrain``, as plain functions.

The three kinds of data (``--text``, lora's and dpo's ``--data`` rows), how they are held
out, joined and cut to the context window: docs/learner.md, "Fine-tuning on your own
data". Rows that cannot be used are reported by line number, all at once, and nothing is
trained.
"""
import json
import os

import numpy as np

from ..classical import bits_per_byte
from ..fast import gpt_backward
from ..fast.posttrain import completion_logprobs_forward
from ..preference import dpo_loss_forward, dpo_metrics
from .pretrain import encode_text
from .tokenizers import token_byte_lengths

__all__ = ["PROMPT_COMPLETION", "PREFERENCE", "read_rows", "split_rows", "split_stream",
           "completion_arrays", "pair_arrays", "completion_metrics", "sequence_logprobs",
           "preference_metrics", "full_logprobs"]

PROMPT_COMPLETION = ("prompt", "completion")
PREFERENCE = ("prompt", "chosen", "rejected")
SHOWN_BAD_ROWS = 5


def _row_problem(row, fields, tokenizer):
    """What is wrong with one row (None when it can be used)."""
    if not isinstance(row, dict):
        return f"expected a JSON object with {', '.join(map(repr, fields))}"
    for name in fields:
        value = row.get(name)
        if name not in row:
            return f"missing {name!r}"
        if not isinstance(value, str):
            return f"{name!r} is {type(value).__name__}; expected a string"
        if not value:
            return f"{name!r} is empty"
        try:
            spelled = tokenizer.decode(encode_text(tokenizer, value))
        except (ValueError, TypeError, KeyError) as exc:
            return f"{name!r} cannot be encoded ({exc})"
        if spelled != value:
            bad = next((c for c, d in zip(value, spelled) if c != d), value[len(spelled):][:1])
            return f"{name!r} has {bad!r}, which the tokenizer cannot encode"
    return None


def read_rows(path, fields, tokenizer, *, flag="--data"):
    """The rows of a JSON-lines file, each a dict with the string ``fields`` (blank lines
    skipped), as ``[(line number, row)]``. Every bad row is reported, by line number, in
    one ValueError naming ``flag``; no row is dropped silently."""
    rows, bad = [], []
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{flag} {os.fspath(path)}: cannot be read as UTF-8 text ({exc})") \
            from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.append(f"line {number}: not JSON ({exc.msg})")
            continue
        problem = _row_problem(row, fields, tokenizer)
        if problem:
            bad.append(f"line {number}: {problem}")
        else:
            rows.append((number, {k: row[k] for k in fields}))
    if bad:
        more = f" (and {len(bad) - SHOWN_BAD_ROWS} more)" if len(bad) > SHOWN_BAD_ROWS else ""
        raise ValueError(f"{flag} {os.fspath(path)}: {len(bad)} bad row{'s' * (len(bad) > 1)}, "
                         f"nothing trained: {'; '.join(bad[:SHOWN_BAD_ROWS])}{more}; fix or "
                         "remove them")
    if not rows:
        raise ValueError(f"{flag} {os.fspath(path)}: no rows; expected JSON lines with "
                         f"{', '.join(map(repr, fields))}")
    return rows


def split_rows(rows, val_rows=None, *, flag="--data"):
    """``(train, held-out)``: ``val_rows``, or the last tenth of ``rows`` (at least one,
    and at least one left to train on)."""
    if val_rows is not None:
        return rows, val_rows
    if len(rows) < 2:
        raise ValueError(f"{flag}: {len(rows)} row; expected at least 2 (one is held out), or a "
                         "held-out file")
    n_val = max(1, len(rows) // 10)
    return rows[:-n_val], rows[-n_val:]


def split_stream(ids, val_ids, context, *, flag="--text"):
    """``(train, held-out)`` token streams: ``val_ids``, or the last tenth of ``ids``; the
    training stream needs more than ``context`` tokens."""
    ids = np.asarray(ids, dtype=np.int64)
    if val_ids is None:
        cut = int(round(0.9 * ids.size))
        ids, val_ids = ids[:cut], ids[cut:]
    val_ids = np.asarray(val_ids, dtype=np.int64)
    if ids.size < context + 1 or val_ids.size < 2:
        raise ValueError(f"{flag}: {ids.size} training tokens and {val_ids.size} held-out; "
                         f"expected more than the context ({context}) and at least 2")
    return ids, val_ids


def _joined(tokenizer, prompt, completion, width):
    """Token ids of prompt + completion fitting ``width`` (the prompt cut from its start,
    keeping one token, then the completion from its end), and the prompt's length."""
    p, c = list(encode_text(tokenizer, prompt)), list(encode_text(tokenizer, completion))
    cut = len(p) + len(c) > width
    p = p[max(0, len(p) - max(1, width - len(c))):]
    c = c[:width - len(p)]
    return p + c, len(p), cut


def completion_arrays(tokenizer, rows, context, names=("completion",)):
    """Rows as padded arrays: for each name in ``names``, ``ids`` (N, T) of prompt +
    completion (T <= context + 1, padding 0) and ``mask`` (N, T), True on the completion's
    tokens. Returns ``{name: (ids, mask)}``, with every name's arrays of one width (DPO's
    chosen and rejected go through the model together), and ``"truncated"``: how many
    sequences were cut to fit."""
    width = context + 1
    seqs, truncated = {}, 0
    for name in names:
        seqs[name] = []
        for _, row in rows:
            ids, n_prompt, cut = _joined(tokenizer, row["prompt"], row[name], width)
            truncated += cut
            seqs[name].append((ids, n_prompt))
    T = max(len(ids) for name in names for ids, _ in seqs[name])
    out = {"truncated": truncated}
    for name in names:
        ids = np.zeros((len(rows), T), dtype=np.int64)
        mask = np.zeros((len(rows), T), dtype=bool)
        for i, (seq, n_prompt) in enumerate(seqs[name]):
            ids[i, :len(seq)] = seq
            mask[i, n_prompt:len(seq)] = True
        out[name] = (ids, mask)
    return out


def pair_arrays(tokenizer, rows, context):
    """Preference rows as the batch dict of ``dpo_loss_and_grads``: ``chosen_ids``,
    ``chosen_mask``, ``rejected_ids``, ``rejected_mask`` (N, T), the masks True on the
    completion tokens; and ``truncated``."""
    a = completion_arrays(tokenizer, rows, context, ("chosen", "rejected"))
    return {"chosen_ids": a["chosen"][0], "chosen_mask": a["chosen"][1],
            "rejected_ids": a["rejected"][0], "rejected_mask": a["rejected"][1],
            "truncated": a["truncated"]}


def sequence_logprobs(params, config, ids, mask, *, batch_size=64):
    """``(N,)`` float64: ``sum_t mask_t ln P(ids_t | ids_<t)`` of each row (the completion's
    log-probability; position 0 is never scored)."""
    out = []
    for i in range(0, ids.shape[0], batch_size):
        logp, _ = completion_logprobs_forward(params, None, ids[i:i + batch_size],
                                              mask[i:i + batch_size], config=config)
        out.append(np.asarray(logp, dtype=np.float64))
    return np.concatenate(out)


def completion_metrics(params, config, tokenizer, ids, mask):
    """Held-out metrics of prompt-completion rows: ``{"val_loss"`` (nats per completion
    token), ``"val_bits_per_byte"`` (bits per byte of the completions)}``."""
    nats = -float(np.sum(sequence_logprobs(params, config, ids, mask)))
    scored = mask[:, 1:]
    lengths = token_byte_lengths(tokenizer)
    n_bytes = int(lengths[ids[:, 1:][scored]].sum())
    return {"val_loss": nats / max(int(scored.sum()), 1),
            "val_bits_per_byte": bits_per_byte(nats, n_bytes)}


def preference_metrics(params, config, pairs, ref_chosen, ref_rejected, *, beta):
    """TRL's DPO metrics on held-out pairs: rewards/chosen, rewards/rejected (means of
    ``beta (log pi(y|x) - log pi_ref(y|x))``), rewards/accuracies (share of pairs with the
    chosen reward above the rejected), rewards/margins; and the policy's mean
    log-probabilities logps/chosen, logps/rejected."""
    pc = sequence_logprobs(params, config, pairs["chosen_ids"], pairs["chosen_mask"])
    pr = sequence_logprobs(params, config, pairs["rejected_ids"], pairs["rejected_mask"])
    _, cache = dpo_loss_forward(pc, pr, ref_chosen, ref_rejected, beta=beta)
    return {**dpo_metrics(cache), "logps/chosen": float(pc.mean()),
            "logps/rejected": float(pr.mean())}


def _full_forward(params, weights, ids, mask, *, config, alpha=None, rank_stabilized=False):
    """``completion_logprobs_forward`` with every weight trainable: ``weights`` (the
    policy's full parameters) in the place of the adapters; None runs ``params`` (the
    frozen reference)."""
    return completion_logprobs_forward(params if weights is None else weights, None, ids, mask,
                                       config=config)


def _full_backward(dlogp, cache):
    """Gradients of every weight from d(log-prob) per row: ``dz = w (onehot(y) - p)`` at the
    scored positions (w = mask * dlogp), then the GPT's backward."""
    p, targets, mask = cache["p"], cache["targets"], cache["mask"]
    B, T, V = p.shape
    w = (mask * np.asarray(dlogp, dtype=np.float64).reshape(B)[:, None]).astype(p.dtype)
    dz = p * -w[..., None]
    flat = dz.reshape(-1, V)
    flat[np.arange(flat.shape[0]), targets.reshape(-1)] += w.reshape(-1)
    return gpt_backward(dz, cache["model"])


def full_logprobs():
    """The ``logprobs=`` pair of ``posttrain.dpo_loss_and_grads`` that trains every weight:
    its ``adapters`` argument is then the policy's full parameters."""
    return _full_forward, _full_backward

