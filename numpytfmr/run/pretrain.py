"""Pretraining a GPT on real text, against the n-gram baselines: what ``numpytfmr pretrain``
runs, as plain functions that the notebook and the tests call too.

A language model is pre-trained by predicting the next token of raw text (000 §1.2-1.3,
003 §1.3). The text becomes one long stream of token ids; every step reads random windows
of it and takes the mean cross-entropy of every next token (003 eq. 2.2)::

    text -> tokenizer (byte-level BPE, bytes or characters) -> ids, one stream
    x, y = get_batch(train_ids, B, T, rng=step_rng(seed, step))    y: x shifted by one
    loss, grads = fast.gpt_loss(params, x, y)                       train_loop (loop.py):
    params = AdamW(params, grads), warmup then cosine decay         clip, schedule, checkpoint

The held-out text is scored in **bits per byte**::

    bits/byte = sum_i -ln P(w_i | w_<i)  /  ln 2  /  (UTF-8 bytes of the predicted tokens)

which, unlike perplexity per token, does not depend on the tokenizer: a byte model and a
BPE model of the same text are compared on one scale. Perplexity per token is reported
too, ``exp(L_CE)`` with ``L_CE`` the mean of ``-ln P`` (003 §2.1.1; eq. 2.1 needs the log,
see the README's errata). Beside them stand the n-gram models of 003 ch. 2 (smoothed
unigram, bigram and trigram over bytes, ``classical.ngram_model``), fitted on the same
training text and scored on the same held-out text: the transformer has to beat counting.

A run is the training loop of loop.py with a checkpoint (checkpoint.py) at each
evaluation; the batch of a step is a fixed function of ``(seed, step)``, so ``resume=True``
continues a stopped run bit for bit. ``minutes=`` gives a wall-clock budget: the number of
steps (and so the learning-rate schedule) is planned from the measured speed of the first
steps, and training stops when the budget is used, whatever the plan said.
"""
from dataclasses import dataclass
import hashlib
import json
import math
import os
import time

import numpy as np

from ..classical import bits_per_byte, ngram_bits_per_byte
from .checkpoint import checkpoint_file, load_checkpoint, resumed_settings, save_checkpoint
from .corpus import default_corpus, split_text
from .loop import STREAM_INIT, TrainSettings, step_rng, train_loop
from .progress import Progress
from .tasks import token_budget
from .tokenizers import (DEFAULT_VOCAB_SIZE, TEXT_TOKENIZERS, TextCharTokenizer, make_tokenizer,
                         token_byte_lengths, tokenizer_from_dict)

__all__ = [
    "PRETRAIN_DEFAULTS", "PRETRAIN_MODEL", "PRETRAIN_SETTINGS", "TOKENIZERS", "SAMPLE_PROMPTS",
    "DEFAULT_SOURCE", "TextCharTokenizer", "make_tokenizer",
    "token_byte_lengths", "encode_text", "text_windows", "text_nats", "evaluate_text",
    "ngram_baselines",
    "complete_text", "is_text_checkpoint", "load_text_model", "pretrain",
]

# The default run of ``numpytfmr pretrain`` (README, "Pretraining on real text").
PRETRAIN_DEFAULTS = {"tokenizer": "bpe", "vocab_size": DEFAULT_VOCAB_SIZE, "context": 64, "minutes": 4.5}
PRETRAIN_MODEL = {"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": None, "d_ff": None,
                  "positional": "learned", "norm": "pre", "activation": "gelu"}
PRETRAIN_SETTINGS = {"steps": 2000, "batch_size": 32, "lr": 3e-3, "warmup_steps": 100,
                     "weight_decay": 0.1, "clip_norm": 1.0, "seed": 0, "eval_every": 200}
TOKENIZERS = TEXT_TOKENIZERS
SAMPLE_PROMPTS = ("The ", "Return ", "If ")
DEFAULT_SOURCE = "stdlib-docstrings"      # the ``source`` of the default corpus (corpus.py)
EVAL_WINDOWS = 64                         # windows of held-out text in a periodic evaluation


def encode_text(tokenizer, text):
    """``text`` as a 1-D int64 array of token ids."""
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


# ---------------------------------------------------------------------------------------
# Held-out evaluation and baselines
# ---------------------------------------------------------------------------------------

def _window_nats(params, config, x, y):
    """``sum -ln softmax(logits)[y]`` over a batch of windows (float64 log-sum-exp)."""
    from ..fast import gpt_forward
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
# Sampling
# ---------------------------------------------------------------------------------------

def complete_text(params, config, tokenizer, prompt, *, max_new_tokens=None, temperature=0.8,
                  top_k=None, top_p=None, rng=None, use_cache=True):
    """The continuation of ``prompt`` by a GPT trained on text: ``(text, ids)``.

    The prompt is encoded as it is (no special tokens); the model then writes
    ``max_new_tokens`` tokens (None: fill the context, with learned positions, else 64)
    sampled with ``temperature``, ``top_k`` and ``top_p`` (nucleus) from ``rng``
    (greedy when temperature is 0). Generated by the fast path (``numpytfmr.fast``).
    """
    from ..fast import generate
    where = "complete_text"
    ids = encode_text(tokenizer, prompt)[None, :]
    T = ids.shape[1]
    if T == 0:
        raise ValueError(f"{where}: the prompt is empty; expected at least one character")
    max_new_tokens = token_budget(config, T, max_new_tokens, where)
    out = generate(params, ids, config=config, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, top_p=top_p, rng=rng,
                   use_cache=use_cache)
    new = out[0, T:]
    return tokenizer.decode(new), new


def _samples(params, config, tokenizer, seed, n, max_new_tokens):
    """``n`` continuations of the sample prompts (temperature 0.8, nucleus 0.95)."""
    rng = np.random.default_rng((int(seed), 7))
    out = []
    for prompt in SAMPLE_PROMPTS[:n]:
        room = config.max_len - len(encode_text(tokenizer, prompt)) + 1
        text, _ = complete_text(params, config, tokenizer, prompt, temperature=0.8, top_p=0.95,
                                max_new_tokens=max(1, min(max_new_tokens, room)), rng=rng)
        out.append(prompt + text)
    return out


# ---------------------------------------------------------------------------------------
# Checkpoints of text models
# ---------------------------------------------------------------------------------------

def is_text_checkpoint(path):
    """True when ``path`` (a directory or its checkpoint.json) holds a GPT saved by
    :func:`pretrain` (its task is ``"text"``); False for anything else. Reads the JSON
    record only."""
    try:
        with open(checkpoint_file(path), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    task = record.get("task") if isinstance(record, dict) else None
    return record.get("kind") == "gpt" and isinstance(task, dict) and task.get("task") == "text"


def load_text_model(path):
    """Load a checkpoint written by :func:`pretrain`: the record of ``load_checkpoint``
    plus ``"model_config"`` (a GPTConfig) and ``"tokenizer"`` (BPE or characters), with
    the weights checked against the config and the tokenizer against the vocabulary."""
    from ..gpt import GPTConfig, gpt_param_shapes
    ck = load_checkpoint(path, kind="gpt")
    json_path = ck["path"]
    if not isinstance(ck.get("task"), dict) or ck["task"].get("task") != "text":
        raise ValueError(f"load_text_model: {json_path} is not a checkpoint of 'numpytfmr "
                         "pretrain' (its task is not 'text')")
    try:
        cfg = GPTConfig.from_dict(ck["config"])
        tok = tokenizer_from_dict(ck.get("tokenizer"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"load_text_model: the config or tokenizer of {json_path} is invalid: "
                         f"{exc}") from None
    if tok.vocab_size != cfg.vocab_size:
        raise ValueError(f"load_text_model: the tokenizer of {json_path} has {tok.vocab_size} "
                         f"tokens but the model's vocabulary has {cfg.vocab_size}")
    shapes = gpt_param_shapes(cfg)
    params = ck["params"]
    bad = sorted(set(shapes) ^ set(params)) or [k for k in shapes
                                                if params[k].shape != tuple(shapes[k])]
    if bad:
        raise ValueError(f"load_text_model: the weights of {json_path} do not match its config "
                         f"(first mismatch: {bad[0]})")
    ck["model_config"], ck["tokenizer"] = cfg, tok
    return ck


def _resume_record(out, where):
    """The text checkpoint in ``out`` with its training state checked."""
    if out is None:
        raise ValueError(f"{where}: resume=True needs the checkpoint directory out=")
    ck = load_text_model(out)
    state = ck.get("state")
    if ck["opt_state"] is None or not isinstance(state, dict) or \
            not isinstance(ck.get("settings"), dict):
        raise ValueError(f"{where}: {ck['path']} holds no training state to resume from")
    if set(state) != {"step", "seconds", "tokens", "loss", "evals"} or \
            len(state["loss"]) != state["step"] or \
            int(np.asarray(ck["opt_state"]["step"])) != state["step"]:
        raise ValueError(f"{where}: {ck['path']} has a malformed training state")
    return ck


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def _sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
        train, val = split_text(text)
        val_source = None
    else:
        train, val = text, val_text
    if len(train) < 2 or len(val) < 2:
        raise ValueError(f"pretrain: the training text has {len(train)} characters and the "
                         f"held-out text {len(val)}; expected at least two each")
    return train, val, source, val_source


class _BudgetUsed(KeyboardInterrupt):
    """Raised inside a step when the wall-clock budget is used. ``train_loop`` treats it
    as an interruption (it saves the state and re-raises), which is what a budget stop is;
    :func:`pretrain` catches it and goes on to the final evaluation."""


def _check_out(out, resume, force):
    if out is None or resume or force:
        return
    if os.path.isdir(out) and os.listdir(out):
        raise ValueError(f"pretrain: {os.fspath(out)!r} already holds files (a run?); continue "
                         "it with --resume, or replace it with --force")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"pretrain: {os.fspath(out)!r} is a file; expected a directory for the "
                         "checkpoint")


def pretrain(*, text=None, val_text=None, source=None, val_source=None, tokenizer=None,
             vocab_size=None, model=None, settings=None, minutes=None, out=None, resume=False,
             force=False, changes=None, progress=False, log=None, n_samples=3,
             sample_tokens=100, baselines=True):
    """Train a GPT on text and score it against the n-gram baselines: what ``numpytfmr
    pretrain`` runs (module docstring).

    text, val_text: the training text and the held-out text (str); text None = the
              default corpus (corpus.py), val_text None = the last tenth of text
    source, val_source: where they come from (the file paths), recorded in the
              checkpoint so that a resumed run reads them again
    tokenizer: "bpe" | "byte" | "char" (default "bpe");  vocab_size: BPE's (default 4096)
    model:    GPTConfig fields to change from PRETRAIN_MODEL, and ``"context"`` (the
              window length T, the model's max_len; default 64)
    settings: TrainSettings (None: PRETRAIN_SETTINGS)
    minutes:  wall-clock budget of the run, counted from this call: for a new run the
              number of steps is planned from the speed of the first steps (replacing
              settings.steps); training stops when the budget is used in any case, and
              the final evaluation follows
    out:      checkpoint directory (None: none); a non-empty one is refused unless
              ``resume`` (continue its run) or ``force`` (replace it)
    resume:   continue the run in ``out``: model, tokenizer, settings and the text's
              source come from the checkpoint; ``text``/``val_text`` may be given again
              and must be the same texts; ``changes`` as in ``tasks.train_gpt`` (steps
              and eval_every may change)
    progress, log: a progress bar on stderr; ``f(str)`` for evaluation lines
    n_samples, sample_tokens: continuations printed in the summary's ``samples``
    baselines: fit and score the n-gram baselines (a second or two)
    Returns ``(params, summary)``; the summary is the dict ``--summary`` writes.
    """
    from ..fast import gpt_loss
    from ..gpt import GPTConfig, init_gpt
    from .batches import get_batch
    where = "pretrain"
    start = time.perf_counter()
    deadline = None if minutes is None else start + 60.0 * float(minutes)
    out = None if out is None else os.fspath(out)
    _check_out(out, resume, force)
    opt_state = history = None
    if resume:
        if tokenizer is not None or vocab_size is not None or model is not None or \
                settings is not None:
            raise ValueError(f"{where}: with resume=True the model, tokenizer and settings come "
                             "from the checkpoint; pass what should change as changes={...}")
        ck = _resume_record(out, where)
        config, params, opt_state, history = (ck["model_config"], ck["params"], ck["opt_state"],
                                              ck["state"])
        settings = resumed_settings(ck, changes, where)
        tok, data = ck["tokenizer"], ck["task"]
        train, val, source, val_source = _texts(text, val_text, source, val_source, data)
        if _sha256(train) != data.get("train_sha256") or _sha256(val) != data.get("val_sha256"):
            raise ValueError(f"{where}: the text is not the one the run in {out} was trained on "
                             "(its SHA-256 differs); a resumed run reads the same text")
        context = config.max_len
    else:
        settings = settings or TrainSettings(**PRETRAIN_SETTINGS)
        train, val, source, val_source = _texts(text, val_text, source, val_source)
        kind = tokenizer or PRETRAIN_DEFAULTS["tokenizer"]
        tok = make_tokenizer(kind, train, vocab_size)
        fields = {**PRETRAIN_MODEL, "context": PRETRAIN_DEFAULTS["context"], **(model or {})}
        context = fields.pop("context")
        config = GPTConfig(vocab_size=tok.vocab_size, max_len=context, **fields)
        params = init_gpt(config, rng=step_rng(settings.seed, 0, STREAM_INIT))
        data = {"task": "text", "tokenizer": kind,
                "vocab_size": vocab_size if kind == "bpe" else None, "context": context,
                "source": source, "val_source": val_source,
                "train_sha256": _sha256(train), "val_sha256": _sha256(val)}

    train_ids = encode_text(tok, train)
    val_ids = encode_text(tok, val)
    if train_ids.size < context + 1 or val_ids.size < 2:
        raise ValueError(f"{where}: the training text is {train_ids.size} tokens and the held-out "
                         f"text {val_ids.size}; expected more than context={context} training "
                         "tokens and at least 2 held-out tokens")
    lengths = token_byte_lengths(tok)
    spread = text_windows(val_ids.size, context, EVAL_WINDOWS)   # the periodic evaluation's
    ngrams = ngram_baselines(train, val) if baselines else {}

    def evaluate(p):
        return evaluate_text(p, config, val_ids, lengths, windows=spread)

    grad_arrays = {}             # the previous step's gradients, written over by the next

    def batch_loss(p, step):
        x, y = get_batch(train_ids, settings.batch_size, context,
                         rng=step_rng(settings.seed, step))
        loss, grad_arrays["g"] = gpt_loss(p, x, y, config=config, out=grad_arrays.get("g"))
        return loss, grad_arrays["g"], x.size

    def loss_and_grads(p, step):
        if deadline is not None and time.perf_counter() > deadline:
            raise _BudgetUsed
        return batch_loss(p, step)

    last = {}

    def save(p, state, hist):
        last.update(params=p, opt_state=state, history=hist)
        if out is not None:
            save_checkpoint(out, kind="gpt", config=config.to_dict(), params=p, opt_state=state,
                            meta={"tokenizer": tok.to_dict(), "task": data,
                                  "settings": settings.to_dict(), "state": hist})

    if history is None:                     # a new run: the curve starts at the initial model
        t0 = time.perf_counter()
        history = {"step": 0, "seconds": 0.0, "tokens": 0, "loss": [],
                   "evals": [{"step": 0, **evaluate(params)}]}
        if minutes is not None:
            settings = _planned_settings(settings, params, batch_loss, deadline,
                                         time.perf_counter() - t0, minutes)
    begin = history["step"]
    bar = Progress(max(settings.steps - begin, 1),
                   "pretrain" if not begin else f"pretrain from {begin}") if progress else None
    stopped = False
    try:
        params, opt_state, history = train_loop(
            params, loss_and_grads, settings, opt_state=opt_state, history=history,
            evaluate=evaluate, save=save, progress=bar, log=log)
    except _BudgetUsed:
        stopped = True
        if last:
            params, opt_state, history = last["params"], last["opt_state"], last["history"]
    finally:
        if bar is not None:
            bar.close()
    if stopped and log is not None:
        log(f"the budget of {minutes:g} minutes is used: stopped at step {history['step']} "
            f"of {settings.steps}")
    final = evaluate_text(params, config, val_ids, lengths)
    samples = _samples(params, config, tok, settings.seed, n_samples, sample_tokens) \
        if n_samples else []
    summary = _summary(history, settings, final, ngrams, {
        "tokenizer": data["tokenizer"], "vocab_size": config.vocab_size, "context": context,
        "source": source, "val_source": val_source,
        "train_bytes": int(lengths[train_ids].sum()), "val_bytes": int(lengths[val_ids].sum()),
        "train_tokens": int(train_ids.size), "val_tokens": int(val_ids.size),
        "bytes_per_token": float(lengths[val_ids[1:]].sum() / (val_ids.size - 1)),
        "stopped_by_budget": stopped, "wall_seconds": time.perf_counter() - start,
        "samples": samples, "config": config.to_dict(),
        "checkpoint": None if out is None else checkpoint_file(out)})
    return params, summary


def _planned_settings(settings, params, batch_loss, deadline, eval_seconds, minutes):
    """``settings`` with the number of steps that fits before ``deadline``: two steps are
    run on a scratch copy (the first warms up, the second is timed) and the evaluations
    every ``eval_every`` steps are counted in; the warmup stays at most a tenth."""
    from ..fast import adamw_step
    from ..optim import adamw_init
    state = adamw_init(params)
    for i in range(2):
        t0 = time.perf_counter()
        _, grads, _ = batch_loss(params, i)
        adamw_step(params, grads, state, lr=settings.lr)
        step_seconds = time.perf_counter() - t0
    left = deadline - time.perf_counter()
    if left <= 0:
        raise ValueError(f"pretrain: the budget of {minutes:g} minutes was used before training "
                         "began (reading and tokenizing the text); give more minutes")
    per_step = step_seconds + 1.5 * eval_seconds / settings.eval_every   # evaluation + save
    steps = max(2, int(0.95 * left / per_step))
    values = dict(settings.to_dict(), steps=steps,
                  warmup_steps=min(settings.warmup_steps, steps // 10))
    return TrainSettings(**values)


def _summary(history, settings, final, ngrams, extra):
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
            "ngram_bits_per_byte": ngrams,
            "train_loss": float(np.mean(recent)) if recent else None,
            "steps": history["step"],
            "seconds": seconds,
            "tokens_per_second": history["tokens"] / seconds if seconds > 0 else None,
            "tokens": history["tokens"],
            **extra,
            "settings": settings.to_dict(),
            "evals": history["evals"],
            "loss_history": history["loss"]}
