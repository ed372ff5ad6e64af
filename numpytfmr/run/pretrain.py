"""Pretraining a GPT on real text, against the n-gram baselines: what ``numpytfmr pretrain``
runs, as plain functions that the notebook and the tests call too.

A language model is pre-trained by predicting the next token of raw text (000 §1.2-1.3,
003 §1.3). The text becomes one long stream of token ids; every step reads random windows
of it and takes the mean cross-entropy of every next token (003 eq. 2.2)::

    text -> tokenizer (byte-level BPE, bytes or characters) -> ids, one stream
    x, y = get_batch(train_ids, B, T, rng=step_rng(seed, step))    y: x shifted by one
    loss, grads = fast.gpt_loss(params, x, y)                       train_loop (loop.py),
    params = AdamW(params, grads), warmup then cosine decay         clip, schedule, checkpoint

The held-out text is scored in **bits per byte**::

    bits/byte = sum_i -ln P(w_i | w_<i)  /  ln 2  /  (UTF-8 bytes of the predicted tokens)

which, unlike perplexity per token, does not depend on the tokenizer: a byte model and a
BPE model of the same text are compared on one scale. Perplexity per token is reported
too, ``exp(L_CE)`` with ``L_CE`` the mean of ``-ln P`` (003 §2.1.1; eq. 2.1 needs the log,
see the README's errata). Beside them stand the n-gram models of 003 ch. 2 (smoothed
unigram, bigram and trigram over bytes, ``classical.ngram_model``), fitted on the same
training text and scored on the same held-out text: the transformer has to beat counting.

The data is a text, or token files of ``numpytfmr tokenize`` (``read_token_file``: their
header names the tokenizer); the tokenizer is learnt on the text, read from a file, or
that of the token files or of ``init``, a trained model to continue from. There is one
held-out measure: every evaluation scores the whole held-out stream, from step 0 (before
any update: what ``init`` brings) to the final figure, the last point of the curve.

A run is the training loop of loop.py with a checkpoint (checkpoint.py) at each
evaluation; the batch of a step is a fixed function of ``(seed, step)``, so ``resume=True``
continues a stopped run bit for bit. ``minutes=`` gives a wall-clock budget: the number of
steps (and so the learning-rate schedule) is planned from the measured speed of the first
steps and re-planned every few seconds from the speed measured so far, so that the run and
its final evaluation end near the budget; training stops when the budget is used, whatever
the plan said.

Generation (``generate_ids``) goes on past the context window: each token is conditioned on
the last ``max_len`` tokens, as nanoGPT crops its context, the KV cache being rebuilt when
the window slides.
"""
import hashlib
import json
import math
import os
import time

import numpy as np

from ..classical import bits_per_byte, ngram_bits_per_byte
from ..fast import gpt_forward, gpt_loss
from ..gpt import GPTConfig, init_gpt
from ..transformer import next_token
from .batches import TOKEN_FILE_MAGIC, get_batch, open_tokens, read_token_header
from .checkpoint import (checkpoint_file, load_model, resume_checkpoint, resumed_settings,
                         save_checkpoint)
from .corpus import default_corpus, split_text
from .loop import (FINISH_EVALS, STREAM_DROPOUT, STREAM_INIT, BudgetUsed, TrainSettings,
                   budget_replanner, plan_steps, run_loop, step_rng, step_seconds)
from .models import replace_config
from .progress import Progress
from .tokenizers import (DEFAULT_VOCAB_SIZE, TEXT_TOKENIZERS, make_tokenizer, save_tokenizer,
                         token_byte_lengths, tokenizer_difference,
                         tokenizer_from_dict, tokenizer_kind)

__all__ = [
    "PRETRAIN_DEFAULTS", "PRETRAIN_MODEL", "PRETRAIN_SETTINGS", "TOKENIZERS", "SAMPLE_PROMPTS",
    "DEFAULT_SOURCE", "TOKENIZER_FILE", "encode_text", "text_windows", "text_nats",
    "evaluate_text", "ngram_baselines", "generate_ids", "stream_text", "complete_text",
    "is_text_checkpoint", "load_text_model", "read_token_file", "pretrain",
]

# The default run of ``numpytfmr pretrain`` (README, "Pretraining on real text").
PRETRAIN_DEFAULTS = {"tokenizer": "bpe", "vocab_size": DEFAULT_VOCAB_SIZE, "context": 64,
                     "minutes": 4.5}
PRETRAIN_MODEL = {"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": None, "d_ff": None,
                  "positional": "learned", "norm": "pre", "activation": "gelu", "dropout": 0.0}
PRETRAIN_SETTINGS = {"steps": 2000, "batch_size": 32, "lr": 3e-3, "warmup_steps": 100,
                     "weight_decay": 0.1, "clip_norm": 1.0, "seed": 0, "eval_every": 200}
TOKENIZERS = TEXT_TOKENIZERS
SAMPLE_PROMPTS = ("The ", "Return ", "If ")
DEFAULT_SOURCE = "stdlib-docstrings"      # the ``source`` of the default corpus (corpus.py)
TOKENIZER_FILE = "tokenizer.json"          # the run's tokenizer, beside its checkpoint


def encode_text(tokenizer, text):
    """``text`` as a 1-D int64 array of token ids."""
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


# ---------------------------------------------------------------------------------------
# Held-out evaluation and baselines
# ---------------------------------------------------------------------------------------

def _window_nats(params, config, x, y):
    """``sum -ln softmax(logits)[y]`` over a batch of windows (float64 log-sum-exp)."""
    logits, _ = gpt_forward(params, x, config=config)
    z = logits.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    log_norm = m[..., 0] + np.log(np.exp(z - m).sum(axis=-1))       # ln sum_v e^{z_v}
    picked = np.take_along_axis(z, y[..., None], axis=-1)[..., 0]   # z_y
    return float(np.sum(log_norm - picked))


def text_windows(n_tokens, context, count=None):
    """``[(start, length)]`` of the windows that score a stream of ``n_tokens`` tokens:
    window ``(a, L)`` reads tokens ``a .. a+L-1`` and predicts ``a+1 .. a+L``. By default
    consecutive windows of ``context`` predictions, the last one shorter, so that every
    token but the first is predicted exactly once; with ``count``, that many full windows
    spread evenly over the stream (a quicker estimate, for the periodic evaluations)."""
    n = n_tokens - 1
    if count is None or count * context >= n:
        return [(a, min(context, n - a)) for a in range(0, n, context)]
    return [(int(a), context) for a in np.linspace(0, n - context, count).round()]


def text_nats(params, config, ids, *, windows=None, batch_size=16):
    """Total negative log-likelihood (nats) of the tokens a GPT predicts in ``windows``
    of the stream ``ids`` (default :func:`text_windows` with ``config.max_len``), each
    from the tokens before it in its window. Returns ``(nats, targets)``, ``targets``
    the predicted ids."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size < 2:
        raise ValueError(f"text_nats: ids has {ids.size} tokens; expected at least 2")
    windows = text_windows(ids.size, config.max_len) if windows is None else windows
    total, targets = 0.0, []
    for length in sorted({L for _, L in windows}, reverse=True):      # equal lengths batched
        starts = np.array([a for a, L in windows if L == length])
        for i in range(0, starts.size, batch_size):
            s = starts[i:i + batch_size, None] + np.arange(length)   # (b, L) positions
            total += _window_nats(params, config, ids[s], ids[s + 1])
            targets.append(ids[s + 1].reshape(-1))
    return total, np.concatenate(targets)


def evaluate_text(params, config, ids, byte_lengths, *, windows=None):
    """Held-out metrics of a GPT on a token stream: ``{"val_loss" (nats per token),
    "val_perplexity" (exp of it), "val_bits_per_byte"}`` (module docstring), over the
    tokens of ``windows`` (default: every token but the first); the bytes are those of the
    predicted tokens (``byte_lengths``: :func:`token_byte_lengths`)."""
    nats, targets = text_nats(params, config, ids, windows=windows)
    loss = nats / targets.size
    return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 700.0)),
            "val_bits_per_byte": bits_per_byte(nats, int(byte_lengths[targets].sum()))}


NGRAM_NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}


def ngram_baselines(train_text, val_text):
    """Bits per byte of the held-out text under the smoothed byte-level n-gram models of
    003 ch. 2 fitted on the training text (``classical.ngram_bits_per_byte``):
    ``{"unigram": ..., "bigram": ..., "trigram": ...}``."""
    return {name: ngram_bits_per_byte(train_text, val_text, n) for n, name in NGRAM_NAMES.items()}


# ---------------------------------------------------------------------------------------
# Sampling, past the context window
# ---------------------------------------------------------------------------------------

def _default_length(config, T):
    """Tokens written when none are asked for: the rest of the context window (its whole
    length when the prompt fills it)."""
    room = config.max_len - T + 1
    return room if room >= 1 else config.max_len


def generate_ids(params, config, prompt_ids, *, max_new_tokens, temperature=0.8, top_k=None,
                 top_p=None, rng=None, use_cache=True):
    """Yield ``max_new_tokens`` token ids continuing ``prompt_ids``, one at a time, each
    conditioned on the last ``config.max_len`` tokens at most (the context window).

    While the sequence fits the window, the tokens are decoded against the KV cache. Once it
    is longer, the window slides one token a step, as nanoGPT crops its context: the cache
    no longer matches (every position of the window changes), so it is rebuilt from the
    window's tokens, with their positions counted from the window's start. Sampling is
    ``transformer.next_token`` (greedy when temperature is 0); the same draws as
    ``fast.generate`` while the window does not slide.
    """
    ids = [int(i) for i in np.asarray(prompt_ids).reshape(-1)]
    if not ids:
        raise ValueError("generate_ids: the prompt has no tokens; expected at least one")
    W = config.max_len
    cache, cache_start = None, None
    for _ in range(int(max_new_tokens)):
        start = max(0, len(ids) - W)                         # the window: ids[start:]
        if use_cache and cache is not None and start == cache_start:
            logits, c = gpt_forward(params, np.array([ids[-1:]]), config=config, kv_cache=cache)
        else:                                                # new, or slid: rebuild the cache
            logits, c = gpt_forward(params, np.array([ids[start:]]), config=config)
            cache_start = start
        cache = c["kv_cache"] if use_cache else None
        token = int(next_token(logits[:, -1], temperature=temperature, top_k=top_k,
                               top_p=top_p, rng=rng)[0])
        ids.append(token)
        yield token


def stream_text(params, config, tokenizer, prompt, *, max_new_tokens=None, temperature=0.8,
                top_k=None, top_p=None, rng=None, use_cache=True):
    """Yield the continuation of ``prompt`` as text pieces, as the tokens are produced
    (:func:`generate_ids`); a piece is held back while it ends inside a character (a byte
    token that starts a UTF-8 sequence). ``"".join(...)`` is :func:`complete_text`'s text.
    max_new_tokens None: the rest of the context window."""
    ids = encode_text(tokenizer, prompt)
    if ids.size == 0:
        raise ValueError("stream_text: the prompt is empty; expected at least one character")
    n = _default_length(config, ids.size) if max_new_tokens is None else max_new_tokens
    new, shown = [], 0
    for token in generate_ids(params, config, ids, max_new_tokens=n, temperature=temperature,
                              top_k=top_k, top_p=top_p, rng=rng, use_cache=use_cache):
        new.append(token)
        text = tokenizer.decode(new)
        ready = len(text) - 1 if text.endswith("\ufffd") else len(text)
        if ready > shown:
            yield text[shown:ready]
            shown = ready
    text = tokenizer.decode(new)
    if len(text) > shown:
        yield text[shown:]


def complete_text(params, config, tokenizer, prompt, *, max_new_tokens=None, temperature=0.8,
                  top_k=None, top_p=None, rng=None, use_cache=True):
    """The continuation of ``prompt`` by a GPT trained on text: ``(text, ids)``.

    The prompt is encoded as it is (no special tokens); the model then writes
    ``max_new_tokens`` tokens (None: the rest of the context window) sampled with
    ``temperature``, ``top_k`` and ``top_p`` (nucleus) from ``rng`` (greedy when
    temperature is 0), past the context window if asked (:func:`generate_ids`).
    """
    ids = encode_text(tokenizer, prompt)
    if ids.size == 0:
        raise ValueError("complete_text: the prompt is empty; expected at least one character")
    n = _default_length(config, ids.size) if max_new_tokens is None else max_new_tokens
    new = np.fromiter(generate_ids(params, config, ids, max_new_tokens=n,
                                   temperature=temperature, top_k=top_k, top_p=top_p, rng=rng,
                                   use_cache=use_cache), dtype=np.int64, count=n)
    return tokenizer.decode(new), new


def _samples(params, config, tokenizer, seed, n, max_new_tokens):
    """``n`` continuations of the sample prompts (temperature 0.8, nucleus 0.95)."""
    rng = np.random.default_rng((int(seed), 7))
    out = []
    for prompt in SAMPLE_PROMPTS[:n]:
        text, _ = complete_text(params, config, tokenizer, prompt, temperature=0.8, top_p=0.95,
                                max_new_tokens=max_new_tokens, rng=rng)
        out.append(prompt + text)
    return out


# ---------------------------------------------------------------------------------------
# Checkpoints of text models
# ---------------------------------------------------------------------------------------

def is_text_checkpoint(path):
    """True when ``path`` (a directory or its checkpoint.json) holds a GPT of text: saved by
    :func:`pretrain`, or by ``lora``/``dpo`` from one (its task is ``"text"``); False for
    anything else. Reads the JSON record only."""
    try:
        with open(checkpoint_file(path), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    task = record.get("task") if isinstance(record, dict) else None
    return record.get("kind") == "gpt" and isinstance(task, dict) and task.get("task") == "text"


def load_text_model(path):
    """Load a checkpoint of a GPT of text (:func:`is_text_checkpoint`): the record of
    ``load_checkpoint`` plus ``"model_config"`` (a GPTConfig) and ``"tokenizer"`` (BPE or
    characters), with the weights checked against the config and the tokenizer against
    the vocabulary."""
    ck = load_model(path, kind="gpt")
    if not isinstance(ck.get("task"), dict) or ck["task"].get("task") != "text":
        raise ValueError(f"{ck['path']} is not a checkpoint of a model of text "
                         "(numpytfmr pretrain, or lora/dpo from one): its task is not 'text'")
    return ck


def _resume_record(out, where):
    """The text checkpoint in ``out`` with its training state checked."""
    ck = resume_checkpoint(out, "gpt", where)
    if ck["task"].get("task") != "text":
        raise ValueError(f"{where}: {ck['path']} is not a run of numpytfmr pretrain (its task is "
                         f"{ck['task'].get('task')!r})")
    return ck


# ---------------------------------------------------------------------------------------
# What a run reads: text or token files, and its tokenizer
# ---------------------------------------------------------------------------------------

def _sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _ids_sha256(ids):
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<u4").tobytes()).hexdigest()


def _read_text(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"pretrain: cannot read the {what} {os.fspath(path)!r} as UTF-8 text "
                         f"({exc})") from None


def _texts(text, val_text, source, val_source, record=None):
    """``(train, val, source, val_source)``. When resuming, a text not given is read
    again from where the checkpoint ``record`` says it came from; otherwise ``text`` None
    is the default corpus and ``val_text`` None the last tenth of the text."""
    if record is not None:
        if text is None:
            source = record.get("source")
            if source is None:
                raise ValueError("pretrain: the run was trained on a text passed as a string; "
                                 "pass the same text again (text=...)")
            text = None if source == DEFAULT_SOURCE else _read_text(source, "text")
        if val_text is None and record.get("val_source") is not None:
            val_source = record["val_source"]
            val_text = _read_text(val_source, "held-out text")
    if text is None:
        text, source = default_corpus(), DEFAULT_SOURCE
    if not isinstance(text, str) or (val_text is not None and not isinstance(val_text, str)):
        raise TypeError("pretrain: text and val_text are the texts themselves; expected str "
                        "(read a file first, and pass its path as source=)")
    if val_text is None:
        if len(text) < 2:
            raise ValueError(f"pretrain: the text{f' ({source})' if source else ''} has "
                             f"{len(text)} characters, too few to hold out a part; give a "
                             "longer --text, or --val-text FILE")
        train, val = split_text(text)
        val_source = None
    else:
        train, val = text, val_text
    if len(train) < 2 or len(val) < 2:
        raise ValueError(f"pretrain: the training text has {len(train)} characters and the "
                         f"held-out text {len(val)}; expected at least two each")
    return train, val, source, val_source


def read_token_file(path, tokenizer=None, *, what="--tokens"):
    """The ids of a token file (a memmap) and its tokenizer: the one its header names, or
    ``tokenizer`` when given (which must then be the same, if the header names one).
    Returns ``(ids, tokenizer)``; a ValueError names ``what`` and says what to pass."""
    try:
        info = read_token_header(path)
    except OSError as exc:
        raise ValueError(f"{what} {os.fspath(path)}: {exc.strerror or exc}") from None
    except ValueError as exc:
        problem = str(exc).split(": ", 1)[-1].split(" (no ")[0]
        if not _is_token_file(path):
            problem = ("not a token file (it has no token-file header); make one with "
                       "numpytfmr tokenize")
        raise ValueError(f"{what} {os.fspath(path)}: {problem}") from None
    named = None
    if info.tokenizer is not None:
        try:
            named = tokenizer_from_dict(info.tokenizer)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what} {os.fspath(path)}: the tokenizer in its header is invalid "
                             f"({exc}); pass the tokenizer file with --tokenizer FILE") from None
    if tokenizer is None and named is None:
        raise ValueError(f"{what} {os.fspath(path)}: the file does not name its tokenizer (it was "
                         "written without one); pass the tokenizer that made it with "
                         "--tokenizer FILE")
    differs = None if tokenizer is None or named is None else \
        tokenizer_difference(named, tokenizer)
    if differs is not None:
        raise ValueError(f"{what} {os.fspath(path)}: the file was made by another tokenizer than "
                         f"--tokenizer gives ({differs}); drop --tokenizer (the header names "
                         "it) or tokenize the text again")
    tok = tokenizer if tokenizer is not None else named
    if info.vocab_size > tok.vocab_size:
        raise ValueError(f"{what} {os.fspath(path)}: its ids go up to vocab_size "
                         f"{info.vocab_size}, but the tokenizer has {tok.vocab_size} tokens")
    return open_tokens(path), tok


def _is_token_file(path):
    with open(path, "rb") as f:
        return f.read(len(TOKEN_FILE_MAGIC)) == TOKEN_FILE_MAGIC


class _Data:
    """What a run trains and evaluates on: token streams, texts for the baselines, and
    where they come from (recorded in the checkpoint, checked on resume)."""

    def __init__(self, tok, train_ids, val_ids, train_text, val_text, record):
        self.tok, self.train_ids, self.val_ids = tok, train_ids, val_ids
        self.train_text, self.val_text, self.record = train_text, val_text, record


def _token_data(tokens, val_tokens, tok, sources, where):
    """The data of token streams: ``val_tokens`` None holds out the last tenth of
    ``tokens``; the texts of the baselines are decoded from the ids."""
    tokens = np.asarray(tokens)
    if val_tokens is None:
        cut = int(round(0.9 * tokens.size))
        train_ids, val_ids = tokens[:cut], tokens[cut:]
    else:
        train_ids, val_ids = tokens, np.asarray(val_tokens)
    train_ids = np.asarray(train_ids, dtype=np.int64)
    val_ids = np.asarray(val_ids, dtype=np.int64)
    if train_ids.size and int(train_ids.max()) >= tok.vocab_size or \
            val_ids.size and int(val_ids.max()) >= tok.vocab_size:
        raise ValueError(f"{where}: the token ids reach beyond the tokenizer's {tok.vocab_size} "
                         "tokens; expected ids made by that tokenizer")
    record = {"tokens_source": sources[0], "val_tokens_source": sources[1],
              "train_sha256": _ids_sha256(train_ids), "val_sha256": _ids_sha256(val_ids)}
    return _Data(tok, train_ids, val_ids, None, None, record)


def _check_out(out, resume, force):
    if out is None or resume or force:
        return
    if os.path.isdir(out) and os.listdir(out):
        raise ValueError(f"pretrain: {os.fspath(out)!r} already holds files (a run?); continue "
                         "it with --resume, or replace it with --force")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"pretrain: {os.fspath(out)!r} is a file; expected a directory for the "
                         "checkpoint")


def _init_model(init, tok, model, where):
    """The weights, config and tokenizer of ``init`` (a text checkpoint), checked against
    the tokenizer of this run (``tok``, None: take the checkpoint's) and the model
    options (only ``dropout`` may change)."""
    try:
        ck = load_text_model(init)
    except ValueError as exc:
        raise ValueError(f"{where}: init: {exc}") from None
    config = ck["model_config"]
    differs = None if tok is None else tokenizer_difference(ck["tokenizer"], tok)
    if differs is not None:
        raise ValueError(f"{where}: init {os.fspath(init)} was trained with another tokenizer "
                         f"than this run's ({differs}): its embeddings would read the wrong "
                         "ids; use the run's tokenizer (its tokenizer.json), or tokenize the "
                         "text with it")
    changes = dict(model or {})
    context = changes.pop("context", config.max_len)
    dropout = changes.pop("dropout", None)
    if context != config.max_len:
        raise ValueError(f"{where}: context is {context} but the model of init has "
                         f"{config.max_len} positions; a model continued from init keeps its "
                         "context")
    different = {k: v for k, v in changes.items() if getattr(config, k) != v}
    if different:
        name = next(iter(different))
        raise ValueError(f"{where}: {name} is {different[name]!r} but the model of init has "
                         f"{getattr(config, name)!r}; a model continued from init keeps its "
                         "shape (only dropout may change)")
    if dropout is not None:
        config = replace_config(config, dropout=dropout)
    return ck["params"], config, ck["tokenizer"], ck["path"]


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

_BudgetUsed = BudgetUsed


def pretrain(*, text=None, val_text=None, source=None, val_source=None, tokens=None,
             val_tokens=None, tokens_source=None, val_tokens_source=None, tokenizer=None,
             tokenizer_source=None, vocab_size=None, model=None, settings=None, grad_accum=None,
             init=None, minutes=None, out=None, resume=False, force=False, changes=None,
             progress=False, log=None, n_samples=3, sample_tokens=100, baselines=True,
             tokenizer_out=None):
    """Train a GPT on text and score it against the n-gram baselines: what ``numpytfmr
    pretrain`` runs (module docstring).

    text, val_text: the training text and the held-out text (str); text None = the
              default corpus (corpus.py), val_text None = the last tenth of text
    source, val_source: where they come from (the file paths), recorded in the
              checkpoint so that a resumed run reads them again
    tokens, val_tokens: token streams instead of texts (``open_tokens`` of files written by
              ``numpytfmr tokenize``), with their paths ``tokens_source``,
              ``val_tokens_source``; val_tokens None = the last tenth of tokens
    tokenizer: "bpe" | "byte" | "char" (made from the text; default "bpe"), or a tokenizer
              object (``load_tokenizer``; from ``tokenizer_source``); with ``tokens`` or
              ``init``, the tokenizer that made them (None: theirs)
    vocab_size: BPE's (default 4096), when it is learnt here
    model:    GPTConfig fields to change from PRETRAIN_MODEL (``dropout`` among them), and
              ``"context"`` (the window length T, the model's max_len; default 64)
    settings: TrainSettings (None: PRETRAIN_SETTINGS)
    grad_accum: micro-batches per update (default 1): each update averages the gradients of
              ``grad_accum`` batches of ``settings.batch_size`` windows
    init:     a checkpoint of a text model to start from (continued pretraining, domain
              adaptation): its weights, config and tokenizer; a new optimizer and schedule
    minutes:  wall-clock budget of the run, counted from this call: the number of steps
              (and the schedule) is planned from the measured speed and re-planned as the
              run goes, so that training and the final evaluation end near the budget;
              training stops when the budget is used in any case
    out:      checkpoint directory (None: none); a non-empty one is refused unless
              ``resume`` (continue its run) or ``force`` (replace it). It also gets the
              tokenizer as ``tokenizer.json``
    resume:   continue the run in ``out``: model, tokenizer, settings and the data's
              source come from the checkpoint; ``text``/``tokens`` may be given again and
              must be the same; ``changes`` as in ``tasks.train_gpt`` (steps and
              eval_every may change)
    progress, log: a progress bar on stderr; ``f(str)`` for evaluation lines
    n_samples, sample_tokens: continuations printed in the summary's ``samples``
    baselines: fit and score the n-gram baselines (a second or two)
    tokenizer_out: also write the run's tokenizer to this file, before training begins

    The held-out measure is one: every evaluation (the curve, ``summary["evals"]``) scores
    the whole held-out stream, from step 0 before any update to the last step, whose
    figure is the summary's ``val_bits_per_byte``.
    Returns ``(params, summary)``; the summary is the dict ``--summary`` writes.
    """
    where = "pretrain"
    start = time.perf_counter()
    deadline = None if minutes is None else start + 60.0 * float(minutes)
    out = None if out is None else os.fspath(out)
    _check_out(out, resume, force)
    if (tokens is not None) and (text is not None or val_text is not None):
        raise ValueError(f"{where}: give the data once: texts (text=, val_text=) or token "
                         "streams (tokens=, val_tokens=)")
    if val_tokens is not None and tokens is None:
        raise ValueError(f"{where}: val_tokens goes with tokens=; for a text pass val_text=")
    opt_state = history = init_path = None
    if resume:
        if tokenizer is not None or vocab_size is not None or model is not None or \
                settings is not None or init is not None or grad_accum is not None or \
                tokenizer_out is not None:
            raise ValueError(f"{where}: with resume=True the model, tokenizer and settings come "
                             "from the checkpoint; pass what should change as changes={...}")
        ck = _resume_record(out, where)
        config, params, opt_state, history = (ck["model_config"], ck["params"], ck["opt_state"],
                                              ck["state"])
        settings = resumed_settings(ck, changes, where)
        record = ck["task"]
        data = _resumed_data(record, ck["tokenizer"], text, val_text, source, val_source,
                             tokens, val_tokens, where)
        if data.record.get("train_sha256") != record.get("train_sha256") or \
                data.record.get("val_sha256") != record.get("val_sha256"):
            raise ValueError(f"{where}: the data is not the one the run in {out} was trained on "
                             "(its SHA-256 differs); a resumed run reads the same text")
        data.record = record
        grad_accum = record.get("grad_accum", 1)
        init_path = record.get("init")
    else:
        settings = settings or TrainSettings(**PRETRAIN_SETTINGS)
        grad_accum = 1 if grad_accum is None else grad_accum
        if isinstance(grad_accum, bool) or not isinstance(grad_accum, (int, np.integer)) or \
                grad_accum < 1:
            raise ValueError(f"{where}: grad_accum is {grad_accum!r}; expected an integer >= 1")
        kind = tokenizer if isinstance(tokenizer, str) or tokenizer is None else None
        given = None if kind is not None else tokenizer
        if kind is not None and kind not in TOKENIZERS:
            raise ValueError(f"{where}: tokenizer is {kind!r}; expected one of {TOKENIZERS} or a "
                             "tokenizer (load_tokenizer)")
        made = given is None and tokens is None and init is None      # learnt on the text
        if not made and vocab_size is not None:
            raise ValueError(f"{where}: vocab_size applies to a BPE tokenizer learnt here; the "
                             "tokenizer of this run is given (a file, the token files or init)")
        if kind in ("bpe", "char") and (tokens is not None or init is not None):
            raise ValueError(f"{where}: tokenizer {kind!r} is learnt from a text, but the run "
                             "reads token files or starts from init; pass the tokenizer that "
                             "made them as a file, or none (theirs is used)")
        if kind == "byte" and not made:
            given = make_tokenizer("byte", "")
        if tokens is not None:
            tokens, tok = _stream(tokens, given, "tokens")
            if val_tokens is not None:
                val_tokens, _ = _stream(val_tokens, tok, "val_tokens")
            data = _token_data(tokens, val_tokens, tok, (tokens_source, val_tokens_source), where)
            given = tok
        if init is not None:
            params, config, tok, init_path = _init_model(init, given, model, where)
        else:
            fields = {**PRETRAIN_MODEL, "context": PRETRAIN_DEFAULTS["context"], **(model or {})}
            context = fields.pop("context")
        if tokens is None:
            train, val, source, val_source = _texts(text, val_text, source, val_source)
            if init is None:
                tok = given if given is not None else make_tokenizer(
                    kind or PRETRAIN_DEFAULTS["tokenizer"], train, vocab_size)
            data = _Data(tok, encode_text(tok, train), encode_text(tok, val), train, val,
                         {"source": source, "val_source": val_source,
                          "train_sha256": _sha256(train), "val_sha256": _sha256(val)})
        if init is None:
            config = GPTConfig(vocab_size=tok.vocab_size, max_len=context, **fields)
            params = init_gpt(config, rng=step_rng(settings.seed, 0, STREAM_INIT))
        data.tok = tok
        if tokenizer_out is not None:
            save_tokenizer(tok, tokenizer_out)
        data.record = {"task": "text", "tokenizer": tokenizer_kind(tok),
                       "tokenizer_source": tokenizer_source if given is not None else None,
                       "vocab_size": vocab_size if made and kind in (None, "bpe") else None,
                       "context": config.max_len, "grad_accum": int(grad_accum),
                       "tokenizer_out": None if tokenizer_out is None else
                       os.fspath(tokenizer_out),
                       "init": None if init_path is None else os.path.dirname(init_path),
                       "source": None, "val_source": None, "tokens_source": None,
                       "val_tokens_source": None, **data.record}
    return _run(params, config, data, settings, grad_accum, opt_state, history, start, deadline,
                minutes, out, progress, log, n_samples, sample_tokens, baselines)


def _stream(tokens, tokenizer, name):
    """A token stream given as ids, or as ``(ids, tokenizer)`` of :func:`read_token_file`."""
    if isinstance(tokens, tuple):
        ids, tok = tokens
        differs = None if tokenizer is None else tokenizer_difference(tok, tokenizer)
        if differs is not None:
            raise ValueError(f"pretrain: {name} were made by another tokenizer than the run's "
                             f"({differs})")
        return ids, tok
    if tokenizer is None:
        raise ValueError(f"pretrain: {name} are ids without their tokenizer; pass tokenizer= "
                         "(load_tokenizer) or the (ids, tokenizer) of read_token_file")
    return tokens, tokenizer


def _resumed_data(record, tok, text, val_text, source, val_source, tokens, val_tokens, where):
    """The data of a resumed run: given again, or read again from the recorded sources."""
    if record.get("tokens_source") is not None or tokens is not None:
        if tokens is None:
            tokens, _ = read_token_file(record["tokens_source"], tok)
            if record.get("val_tokens_source") is not None:
                val_tokens, _ = read_token_file(record["val_tokens_source"], tok,
                                                what="--val-tokens")
        else:
            tokens, _ = _stream(tokens, tok, "tokens")
            val_tokens = None if val_tokens is None else _stream(val_tokens, tok, "val_tokens")[0]
        return _token_data(tokens, val_tokens, tok, (record.get("tokens_source"),
                                                     record.get("val_tokens_source")), where)
    train, val, source, val_source = _texts(text, val_text, source, val_source, record)
    return _Data(tok, encode_text(tok, train), encode_text(tok, val), train, val,
                 {"train_sha256": _sha256(train), "val_sha256": _sha256(val)})


def _run(params, config, data, settings, grad_accum, opt_state, history, start, deadline,
         minutes, out, progress, log, n_samples, sample_tokens, baselines):
    """Train and evaluate (:func:`pretrain` after it has gathered what the run reads)."""
    where = "pretrain"
    tok, train_ids, val_ids, context = data.tok, data.train_ids, data.val_ids, config.max_len
    if train_ids.size < context + 1 or val_ids.size < 2:
        raise ValueError(f"{where}: the training text is {train_ids.size} tokens and the held-out "
                         f"text {val_ids.size}; expected more than context={context} training "
                         "tokens and at least 2 held-out tokens")
    lengths = token_byte_lengths(tok)
    ngrams = {}
    if baselines:
        train_text = data.train_text if data.train_text is not None else tok.decode(train_ids)
        val_text = data.val_text if data.val_text is not None else tok.decode(val_ids)
        ngrams = ngram_baselines(train_text, val_text)

    def evaluate(p):
        return evaluate_text(p, config, val_ids, lengths)

    grad_arrays = {}             # the previous step's gradients, written over by the next
    B = settings.batch_size

    def batch_loss(p, step):
        x, y = get_batch(train_ids, B * grad_accum, context, rng=step_rng(settings.seed, step))
        drop = step_rng(settings.seed, step, STREAM_DROPOUT) if config.dropout > 0 else None
        total, grads = 0.0, None
        for k in range(grad_accum):                  # micro-batches of B windows
            loss, g = gpt_loss(p, x[k * B:(k + 1) * B], y[k * B:(k + 1) * B], config=config,
                               rng=drop, train=drop is not None,
                               out=grad_arrays.get("g") if grad_accum == 1 else None)
            total += loss / grad_accum
            if grads is None:
                grads = g if grad_accum == 1 else {k2: v / grad_accum for k2, v in g.items()}
            else:
                for k2, v in g.items():
                    grads[k2] += v / grad_accum      # the mean over the B * grad_accum windows
        grad_arrays["g"] = grads
        return total, grads, x.size

    stop = {"at": deadline}       # training stops here: the deadline less the finish

    def loss_and_grads(p, step):
        if stop["at"] is not None and time.perf_counter() > stop["at"]:
            raise _BudgetUsed
        return batch_loss(p, step)

    last = {}

    def save(p, state, hist):
        last.update(params=p, opt_state=state, history=hist)
        if out is not None:
            save_checkpoint(out, kind="gpt", config=config.to_dict(), params=p, opt_state=state,
                            meta={"tokenizer": tok.to_dict(), "task": data.record,
                                  "settings": settings.to_dict(), "state": hist})

    if out is not None:
        os.makedirs(out, exist_ok=True)
        save_tokenizer(tok, os.path.join(out, TOKENIZER_FILE))
    eval_seconds = None
    if history is None:                     # a new run: the curve starts at the initial model
        t0 = time.perf_counter()
        history = {"step": 0, "seconds": 0.0, "tokens": 0, "loss": [],
                   "evals": [{"step": 0, **evaluate(params)}]}
        eval_seconds = time.perf_counter() - t0
        if minutes is not None:
            settings = _planned_settings(settings, params, batch_loss, deadline, eval_seconds,
                                         minutes)
    planned = {"settings": settings}
    if minutes is None:
        replan = None
    else:
        replanner = _replanner(deadline, eval_seconds, history["step"])

        def replan(h, s):                    # the plan as it stands, for a stop by the budget
            new = replanner(h, s)
            if new is not None:
                planned["settings"] = new
            return new
        if eval_seconds is not None:     # stopped by the budget, the run still ends in time
            stop["at"] = deadline - FINISH_EVALS * eval_seconds
    begin = history["step"]
    bar = Progress(max(settings.steps - begin, 1),
                   "pretrain" if not begin else f"pretrain from {begin}") if progress else None
    stopped = False
    try:
        params, opt_state, history, settings = run_loop(
            params, loss_and_grads, settings, opt_state=opt_state, history=history,
            evaluate=evaluate, save=save, progress=bar, log=log, replan=replan, fast=True)
    except _BudgetUsed:
        stopped = True
        settings = planned["settings"]
        if last:
            params, opt_state, history = last["params"], last["opt_state"], last["history"]
    finally:
        if bar is not None:
            bar.close()
    if stopped and log is not None:
        log(f"the budget of {minutes:g} minutes is used: stopped at step {history['step']} "
            f"of {settings.steps}")
    appended = history["evals"][-1]["step"] != history["step"]
    if appended:            # stopped between evaluations: the curve ends at the final figure
        history["evals"].append({"step": history["step"], **evaluate(params)})
    final = history["evals"][-1]
    samples = _samples(params, config, tok, settings.seed, n_samples, sample_tokens) \
        if n_samples else []
    record = data.record
    summary = _summary(history, settings, final, ngrams, {
        "tokenizer": record["tokenizer"], "tokenizer_source": record.get("tokenizer_source"),
        "vocab_size": config.vocab_size, "context": context,
        "source": record.get("source"), "val_source": record.get("val_source"),
        "tokens_source": record.get("tokens_source"),
        "val_tokens_source": record.get("val_tokens_source"), "init": record.get("init"),
        "train_bytes": int(lengths[train_ids].sum()), "val_bytes": int(lengths[val_ids].sum()),
        "train_tokens": int(train_ids.size), "val_tokens": int(val_ids.size),
        "bytes_per_token": float(lengths[val_ids[1:]].sum() / (val_ids.size - 1)),
        "stopped_by_budget": stopped, "minutes": minutes,
        "wall_seconds": time.perf_counter() - start,
        "samples": samples, "config": config.to_dict(),
        "checkpoint": None if out is None else checkpoint_file(out),
        "tokenizer_file": None if out is None else os.path.join(out, TOKENIZER_FILE),
        "tokenizer_out": record.get("tokenizer_out")},
        {"grad_accum": record.get("grad_accum", 1), "dropout": config.dropout,
         "context": context, "minutes": minutes})
    if appended and out is not None and opt_state is not None:
        save(params, opt_state, history)       # the checkpoint holds the whole curve
    return params, summary


def _planned_settings(settings, params, batch_loss, deadline, eval_seconds, minutes):
    """``settings`` with the number of steps that fits before ``deadline``
    (``loop.plan_steps``): two steps are run on a scratch copy (the first warms up, the
    second is timed), and the finish (FINISH_EVALS evaluations) is kept aside.
    :func:`_replanner` corrects the plan as the run goes."""
    seconds = step_seconds(params, batch_loss, settings.lr)
    left = deadline - time.perf_counter() - FINISH_EVALS * eval_seconds     # the finish
    if left <= 0:
        raise ValueError(f"pretrain: the budget of {minutes:g} minutes was used before training "
                         "began (reading and tokenizing the text); give more --minutes")
    return plan_steps(settings, seconds, eval_seconds, left)


def _replanner(deadline, eval_seconds, first_step):
    """``loop.budget_replanner`` with the finish of a pretraining run: the final
    evaluation, the samples and the save, FINISH_EVALS times the step-0 evaluation."""
    return budget_replanner(deadline, None if eval_seconds is None else
                            FINISH_EVALS * eval_seconds, first_step)


def _summary(history, settings, final, ngrams, extra, run_settings):
    seconds = history["seconds"]
    best = min(ngrams, key=ngrams.get) if ngrams else None
    baseline = ngrams[best] if best else None
    recent = history["loss"][-50:]
    return {"val_bits_per_byte": final["val_bits_per_byte"],
            "baseline_bits_per_byte": baseline,
            "baseline": best,
            "ratio_to_baseline": final["val_bits_per_byte"] / baseline if baseline else None,
            "val_perplexity": final["val_perplexity"],
            "val_loss": final["val_loss"],
            "initial_val_bits_per_byte": history["evals"][0]["val_bits_per_byte"],
            "ngram_bits_per_byte": ngrams,
            "train_loss": float(np.mean(recent)) if recent else None,
            "steps": history["step"],
            "seconds": seconds,
            "tokens_per_second": history["tokens"] / seconds if seconds > 0 else None,
            "tokens": history["tokens"],
            **extra,
            "settings": {**settings.to_dict(), **run_settings},
            "evals": history["evals"],
            "loss_history": history["loss"]}
