"""The task harness: train and evaluate the models of ``numpytfmr train``,
``train-seq2seq`` and ``generate`` on the built-in tasks (data.py), as plain functions that
notebooks, the LoRA and DPO commands and the tests call too.

    GPT on a character task     ``<bos> prompt <sep> answer <eos>``, the loss on the answer
                                (:func:`train_gpt`, :func:`evaluate_gpt`, :func:`complete`)
    seq2seq on the translation  the transformer or the recurrent model on the toy English ->
                                French task (:func:`train_seq2seq`, :func:`translate`,
                                :func:`alignment_table`)

Every run is the training loop of loop.py with a checkpoint (checkpoint.py) saved at each
evaluation, so ``resume=True`` continues it exactly.
"""
import re

import numpy as np

from ..fast import generate, gpt_forward, gpt_loss
from ..gpt import init_gpt
from ..losses import cross_entropy_forward
from .checkpoint import checkpoint_file, resume_checkpoint, resumed_settings, save_checkpoint
from .data import (BOS_ID, BRACKETS, DIGITS, EOS_ID, MAX_SOURCE_WORDS, SEP_ID, SPECIAL_TOKENS,
                   CharTokenizer, decode_completion, evaluate_generation, exact_match, make_task,
                   make_translation, next_token_arrays, translation_tokenizers)
from .loop import STREAM_DROPOUT, STREAM_INIT, STREAM_TEST, TrainSettings, step_rng, run_loop
from .models import SEQ2SEQ_KINDS, default_gpt_config, seq2seq_model
from .progress import Progress

__all__ = [
    "IGNORE", "GPT_TASK_DEFAULTS", "gpt_task_data", "gpt_task_loss", "evaluate_gpt", "train_gpt",
    "task_symbols", "task_record", "split_special", "unknown_words", "encode_prompt", "token_budget",
    "complete",
    "SEQ2SEQ_DEFAULTS", "SEQ2SEQ_SETTINGS", "evaluate_seq2seq", "train_seq2seq", "translate",
    "alignment_table",
]

IGNORE = -1                      # label of positions left out of the loss (prompt, padding)


# ---------------------------------------------------------------------------------------
# GPT on a character task
# ---------------------------------------------------------------------------------------

# The default run of ``numpytfmr train``: sort digit strings of 1 to 8 digits.
GPT_TASK_DEFAULTS = {"task": "sort", "min_len": 1, "max_len": 8, "n_test": 500}


def gpt_task_data(task, step, *, seed, batch_size, min_len, max_len, tokenizer=None):
    """The training batch of ``step``: ``batch_size`` fresh examples from the train split,
    drawn with ``step_rng(seed, step)``; returns ``(inputs, labels)`` of shape (B, T-1),
    labels ``IGNORE`` (-1) where no loss is taken (prompt and padding)."""
    data = make_task(task, batch_size, rng=step_rng(seed, step), split="train", min_len=min_len,
                     max_len=max_len, tokenizer=tokenizer)
    inputs, labels, label_mask = next_token_arrays(data["ids"], data["loss_mask"])
    return inputs, np.where(label_mask, labels, IGNORE)


def gpt_task_loss(params, inputs, labels, *, config, rng=None, out=None):
    """Mean cross-entropy over the answer tokens and its gradients: ``(loss, grads)``
    (``gpt_loss`` with the prompt and padding positions ignored; computed by the fast path,
    ``numpytfmr.fast``, which gives the reference's numbers; the gradients written into
    ``out``, e.g. the previous step's, when given)."""
    return gpt_loss(params, inputs, labels, config=config, ignore_index=IGNORE, rng=rng,
                    train=rng is not None, out=out)


def evaluate_gpt(params, config, test_data, *, batch_size=256):
    """Held-out metrics of a GPT on a ``make_task`` dict: ``{"exact_match", "test_loss"}``.

    exact_match: greedy decoding with the KV cache from ``<bos> prompt <sep>`` until
    ``<eos>``, compared with the answer as a string; test_loss: the teacher-forced mean
    cross-entropy of the answer tokens. Run by the fast path (``numpytfmr.fast``).
    """
    acc, _ = evaluate_generation(
        lambda p, m: generate(params, p, config=config, max_new_tokens=m, top_k=1,
                              eos_id=EOS_ID, use_cache=True), test_data, batch_size=batch_size)
    inputs, labels, label_mask = next_token_arrays(test_data["ids"], test_data["loss_mask"])
    logits, _ = gpt_forward(params, inputs, config=config)
    loss, _ = cross_entropy_forward(logits, np.where(label_mask, labels, IGNORE),
                                    ignore_index=IGNORE)
    return {"exact_match": float(acc), "test_loss": float(loss)}


def task_symbols(task):
    """The characters of a built-in task's sequences (prompts and answers): the digits, or
    the brackets for ``"dyck"``; None for a task this module does not know."""
    if task == "dyck":
        return BRACKETS
    if task in ("reverse", "sort", "sort_desc", "sort_either", "rotate"):
        return DIGITS
    return None


def task_record(task, min_len, max_len, n_test):
    """The ``"task"`` entry of a GPT checkpoint: what the model was trained on. ``generate``
    refuses prompt characters outside ``symbols`` and warns about prompts longer than
    ``max_prompt_len``."""
    return {"task": task, "min_prompt_len": min_len, "max_prompt_len": max_len,
            "n_test": n_test, "symbols": task_symbols(task)}


def split_special(text):
    """``text`` cut around its spelled-out special tokens: ``"<bos>31<sep>"`` ->
    ``["<bos>", "31", "<sep>"]`` (no empty pieces)."""
    pattern = "(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")"
    return [piece for piece in re.split(pattern, text) if piece]


def unknown_words(tokenizer, text):
    """The words of ``text`` (whitespace-separated) that ``tokenizer`` (a WordTokenizer)
    does not have, each once, in order; the spelled-out special tokens count as unknown
    (no source sentence holds them)."""
    known = set(tokenizer.words)
    return list(dict.fromkeys(w for w in text.split() if w not in known))


def _test_set(task, n_test, min_len, max_len, tokenizer=None):
    """The held-out set: distinct test-split prompts, the same for every training seed."""
    return make_task(task, n_test, rng=np.random.default_rng((0, STREAM_TEST)), split="test",
                     min_len=min_len, max_len=max_len, unique=True, tokenizer=tokenizer)


def _summary(history, settings, extra):
    evals = history["evals"]
    last = evals[-1] if evals else {}
    recent = history["loss"][-50:]
    seconds = history["seconds"]
    return {"exact_match": last.get("exact_match"),
            "loss": float(np.mean(recent)) if recent else None,
            "test_loss": last.get("test_loss"),
            "steps": history["step"],
            "seconds": seconds,
            "tokens_per_second": history["tokens"] / seconds if seconds > 0 else None,
            "tokens": history["tokens"],
            **extra,
            "settings": settings.to_dict(),
            "evals": evals,
            "loss_history": history["loss"]}


def train_gpt(*, config=None, settings=None, task=None, min_len=None, max_len=None, n_test=None,
              out=None, resume=False, changes=None, progress=False, log=None):
    """Train a GPT on a character task (``data.make_task``) and evaluate it: what
    ``numpytfmr train`` runs.

    config:   a GPTConfig (None: :func:`default_gpt_config` for the task's vocabulary and
              sequence length);  settings: TrainSettings (None: the defaults)
    task, min_len, max_len: the task and its prompt lengths (GPT_TASK_DEFAULTS)
    n_test:   held-out prompts for the exact-match evaluation
    out:      checkpoint directory (None: no checkpoint)
    resume:   continue the run saved in ``out``: model, task and settings come from the
              checkpoint (leave config, settings and task None)
    changes:  with resume, a dict of options the caller asked for: ``steps`` (a new
              total) and ``eval_every`` are applied; any other setting, config field or
              task field must equal the checkpoint's (else ValueError: a resumed run that
              silently trained something else would not be a continuation)
    progress: show a progress bar (stderr);  log: ``f(str)`` for evaluation lines
    Returns ``(params, summary)``; the summary is the dict ``--summary`` writes.
    """
    opt_state = history = None
    if resume:
        if config is not None or settings is not None or task is not None:
            raise ValueError("train_gpt: with resume=True the model, task and settings come from "
                             "the checkpoint; pass what should change as changes={...}")
        ck = resume_checkpoint(out, ("gpt",), "train_gpt")
        config, params, opt_state, history = (ck["model_config"], ck["params"], ck["opt_state"],
                                              ck["state"])
        settings = resumed_settings(ck, changes, "train_gpt")
        tokenizer = ck["tokenizer"]
        t = ck["task"]
        task, min_len, max_len, n_test = (t["task"], t["min_prompt_len"], t["max_prompt_len"],
                                          t["n_test"])
    else:
        settings = settings or TrainSettings()
        task = task or GPT_TASK_DEFAULTS["task"]
        min_len = GPT_TASK_DEFAULTS["min_len"] if min_len is None else min_len
        max_len = GPT_TASK_DEFAULTS["max_len"] if max_len is None else max_len
        n_test = GPT_TASK_DEFAULTS["n_test"] if n_test is None else n_test
        tokenizer = CharTokenizer()
        if config is None:
            config = default_gpt_config(tokenizer.vocab_size, max_len)
        if config.vocab_size != tokenizer.vocab_size:
            raise ValueError(f"train_gpt: config.vocab_size is {config.vocab_size} but the task's "
                             f"tokenizer has {tokenizer.vocab_size} tokens")
        params = init_gpt(config, rng=step_rng(settings.seed, 0, STREAM_INIT))
    width = 2 * max_len + 3                     # <bos> prompt <sep> answer <eos>
    if config.positional == "learned" and config.max_len < width - 1:
        raise ValueError(f"train_gpt: config.max_len is {config.max_len} but the task's "
                         f"sequences need {width - 1} positions (prompts up to {max_len})")
    test_data = _test_set(task, n_test, min_len, max_len, tokenizer)
    task_meta = task_record(task, min_len, max_len, n_test)

    grad_arrays = {}             # the previous step's gradients, written over by the next

    def loss_and_grads(p, step):
        inputs, labels = gpt_task_data(task, step, seed=settings.seed,
                                       batch_size=settings.batch_size, min_len=min_len,
                                       max_len=max_len, tokenizer=tokenizer)
        rng = step_rng(settings.seed, step, STREAM_DROPOUT) if config.dropout > 0 else None
        loss, grad_arrays["g"] = gpt_task_loss(p, inputs, labels, config=config, rng=rng,
                                               out=grad_arrays.get("g"))
        return loss, grad_arrays["g"], inputs.size

    def save(p, state, hist):
        save_checkpoint(out, kind="gpt", config=config.to_dict(), params=p, opt_state=state,
                        meta={"tokenizer": tokenizer.to_dict(), "task": task_meta,
                              "settings": settings.to_dict(), "state": hist})

    start = 0 if history is None else history["step"]
    bar = Progress(max(settings.steps - start, 1),
                   "train" if not start else f"train from {start}") if progress else None
    try:
        params, opt_state, history, _ = run_loop(
            params, loss_and_grads, settings, opt_state=opt_state, history=history,
            evaluate=lambda p: evaluate_gpt(p, config, test_data),
            save=save if out is not None else None, progress=bar, log=log, fast=True)
    finally:
        if bar is not None:
            bar.close()
    if not history["evals"] or history["evals"][-1]["step"] != history["step"]:
        # resumed a finished run: evaluate what is there
        history["evals"].append({"step": history["step"],
                                 **evaluate_gpt(params, config, test_data)})
    summary = _summary(history, settings, {
        "task": task, "model": "gpt", "n_test": n_test, "config": config.to_dict(),
        "checkpoint": None if out is None else checkpoint_file(out)})
    return params, summary


def encode_prompt(tokenizer, prompt, *, raw=False):
    """Token ids a task model continues: ``<bos> prompt <sep>`` (or ``prompt`` as written,
    special tokens spelled out, when ``raw``), shape (1, T)."""
    ids = tokenizer.encode(prompt)
    if not raw:
        special = [tokenizer.tokens[i] for i in ids.tolist() if i in (0, BOS_ID, EOS_ID, SEP_ID)]
        if special:
            raise ValueError(f"encode_prompt: the prompt {prompt!r} holds the special token "
                             f"{special[0]}; <bos> and <sep> are added around the prompt (use "
                             "raw=True / --raw to write the whole sequence yourself)")
        ids = np.concatenate([[BOS_ID], ids, [SEP_ID]])
    if ids.size == 0:
        raise ValueError("encode_prompt: the prompt is empty; expected at least one token "
                         "(without --raw, <bos> and <sep> are added)")
    return ids.astype(np.int64)[None, :]


def token_budget(config, T, max_new_tokens, where, *, prompt_note=""):
    """How many tokens to generate after a prompt of ``T`` tokens: ``max_new_tokens``, or
    None = fill the context (learned positions: generate reads at most max_len positions)
    or 64 tokens; a ValueError when the prompt leaves no room or too little."""
    if config.positional != "learned":
        return 64 if max_new_tokens is None else max_new_tokens
    room = config.max_len - T + 1
    if room < 1:
        raise ValueError(f"{where}: the prompt is {T} tokens long{prompt_note} but the model "
                         f"reads at most max_len={config.max_len} positions")
    if max_new_tokens is None:
        return room
    if max_new_tokens > room:
        raise ValueError(f"{where}: max_new_tokens is {max_new_tokens} but a prompt of {T} "
                         f"tokens leaves room for {room} (max_len={config.max_len})")
    return max_new_tokens


def complete(params, config, tokenizer, prompt, *, max_new_tokens=None, temperature=0.0,
             top_k=None, rng=None, use_cache=True, raw=False):
    """The completion of one prompt by a GPT, decoded until ``<eos>``: ``(text, ids)``.

    max_new_tokens: None = fill the context (learned positions) or 64 tokens.
    Generated by the fast path (``numpytfmr.fast.generate``: the reference's tokens).
    """
    ids = encode_prompt(tokenizer, prompt, raw=raw)
    T = ids.shape[1]
    max_new_tokens = token_budget(config, T, max_new_tokens, "complete",
                                  prompt_note=" (with <bos> and <sep>)")
    out = generate(params, ids, config=config, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, rng=rng, use_cache=use_cache,
                   eos_id=EOS_ID)
    new = out[0, T:]
    return decode_completion(new, tokenizer), new


# ---------------------------------------------------------------------------------------
# Sequence to sequence: the encoder-decoder transformer and the recurrent model
# ---------------------------------------------------------------------------------------

SEQ2SEQ_DEFAULTS = {"n_test": 400}
# Both models translate every held-out sentence after a few hundred steps.
SEQ2SEQ_SETTINGS = TrainSettings(steps=500, eval_every=100)


_BATCH_KEYS = ("src_ids", "src_mask", "tgt_ids", "loss_mask")


def _rows(data, sl):
    return {k: data[k][sl] for k in _BATCH_KEYS}


def evaluate_seq2seq(params, kind, config, test_data, *, batch_size=200):
    """Held-out metrics of a seq2seq model on a ``make_translation`` dict:
    ``{"exact_match", "test_loss"}`` (greedy decoding until ``<eos>``; teacher-forced loss)."""
    model = seq2seq_model(kind)
    tok = test_data["tgt_tokenizer"]
    max_new = test_data["tgt_ids"].shape[1] - 1        # the words and <eos>
    preds = []
    for start in range(0, len(test_data["sources"]), batch_size):
        sl = slice(start, start + batch_size)
        out, _ = model["generate"](params, test_data["src_ids"][sl], test_data["src_mask"][sl],
                                   config, max_new)
        preds += [decode_completion(row[1:], tok) for row in out]
    loss, _ = model["loss"](params, _rows(test_data, slice(None)), config)
    return {"exact_match": float(exact_match(preds, test_data["targets"])),
            "test_loss": float(loss)}


def translate(params, kind, config, src_tokenizer, tgt_tokenizer, sentence, *,
              max_new_tokens=None, use_cache=True):
    """Greedy translation of one sentence: ``(target words, source words, weights)`` with
    ``weights`` (n_target, n_source) the attention each target word paid to each source
    word (row t: the attention used to choose word t; the ``<eos>`` row last, when reached)."""
    model = seq2seq_model(kind)
    src = src_tokenizer.encode(sentence)
    if src.size == 0:
        raise ValueError("translate: the sentence is empty; expected at least one word")
    # learned positions bound the sentence and the output; the recurrent model has no bound
    learned = getattr(config, "positional", None) == "learned"
    limit = config.max_len if learned else None
    if limit is not None and src.size > limit:
        raise ValueError(f"translate: the sentence has {src.size} words but the model reads at "
                         f"most max_len={limit}")
    if max_new_tokens is None:
        max_new_tokens = limit if limit is not None else 2 * src.size + 2
    elif limit is not None and max_new_tokens > limit:
        raise ValueError(f"translate: max_new_tokens is {max_new_tokens} but the model reads at "
                         f"most max_len={limit} target positions")
    out, weights = model["generate"](params, src[None, :], np.ones((1, src.size), bool), config,
                                     max_new_tokens, use_cache)
    new = out[0, 1:]
    stop = np.flatnonzero(new == EOS_ID)
    n = int(stop[0]) + 1 if stop.size else new.size             # the words and the <eos>
    words = [tgt_tokenizer.tokens[i] for i in new[:n].tolist()]
    return words, src_tokenizer.decode(src).split(), np.asarray(weights[0, :n])


def alignment_table(target_words, source_words, weights, *, digits=2):
    """A text table like the notes' Je/suis/en example (003 §5.1): one row per target word,
    one column per source word, the attention weights in between."""
    w = max([len(t) for t in target_words] + [4])
    cols = [max(len(s), digits + 2) for s in source_words]
    lines = [" " * w + "  " + "  ".join(f"{s:>{c}}" for s, c in zip(source_words, cols))]
    for t, row in zip(target_words, np.asarray(weights)):
        lines.append(f"{t:<{w}}  " + "  ".join(f"{x:>{c}.{digits}f}" for x, c in zip(row, cols)))
    return "\n".join(lines)


def train_seq2seq(*, kind="encdec", config=None, settings=None, n_test=None, out=None,
                  resume=False, changes=None, progress=False, log=None):
    """Train a seq2seq model on the toy English -> French translation task
    (``data.make_translation``) and evaluate it: what ``numpytfmr train-seq2seq`` runs.

    kind: ``"encdec"`` (the transformer) or ``"rnn"`` (the GRU encoder-decoder with
    Bahdanau attention); other arguments as in :func:`train_gpt`.
    Returns ``(params, config, summary)``.
    """
    opt_state = history = None
    if resume:
        if config is not None or settings is not None:
            raise ValueError("train_seq2seq: with resume=True the model and settings come from "
                             "the checkpoint; pass what should change as changes={...}")
        ck = resume_checkpoint(out, SEQ2SEQ_KINDS, "train_seq2seq")
        if changes and changes.get("kind") not in (None, ck["kind"]):
            raise ValueError(f"train_seq2seq: the checkpoint in {out} holds a {ck['kind']!r} model "
                             f"but kind={changes['kind']!r} was asked for")
        kind, config, params, opt_state, history = (ck["kind"], ck["model_config"], ck["params"],
                                                    ck["opt_state"], ck["state"])
        settings = resumed_settings(ck, {k: v for k, v in (changes or {}).items() if k != "kind"},
                                     "train_seq2seq")
        n_test = ck["task"]["n_test"]
        model = seq2seq_model(kind)
    else:
        model = seq2seq_model(kind)
        settings = settings or SEQ2SEQ_SETTINGS
        n_test = SEQ2SEQ_DEFAULTS["n_test"] if n_test is None else n_test
        src_tok, tgt_tok = translation_tokenizers()
        if config is None:
            config = model["default_config"](src_tok.vocab_size, tgt_tok.vocab_size)
        params = model["init"](config, step_rng(settings.seed, 0, STREAM_INIT))
    src_tok, tgt_tok = translation_tokenizers()
    test_data = make_translation(n_test, rng=np.random.default_rng((0, STREAM_TEST)),
                                 split="test", unique=True)
    task_meta = {"task": "translation", "n_test": n_test, "max_source_words": MAX_SOURCE_WORDS}

    def loss_and_grads(p, step):
        batch = make_translation(settings.batch_size, rng=step_rng(settings.seed, step),
                                 split="train")
        loss, grads = model["loss"](p, _rows(batch, slice(None)), config)
        return loss, grads, batch["src_ids"].size + batch["tgt_ids"].size - settings.batch_size

    def save(p, state, hist):
        save_checkpoint(out, kind=kind, config=config.to_dict(), params=p, opt_state=state,
                        meta={"src_tokenizer": src_tok.to_dict(),
                              "tgt_tokenizer": tgt_tok.to_dict(), "task": task_meta,
                              "settings": settings.to_dict(), "state": hist})

    start = 0 if history is None else history["step"]
    bar = Progress(max(settings.steps - start, 1),
                   kind if not start else f"{kind} from {start}") if progress else None

    def evaluate(p):
        return evaluate_seq2seq(p, kind, config, test_data)
    try:
        params, opt_state, history, _ = run_loop(
            params, loss_and_grads, settings, opt_state=opt_state, history=history,
            evaluate=evaluate, save=save if out is not None else None, progress=bar, log=log,
            fast=True)
    finally:
        if bar is not None:
            bar.close()
    if not history["evals"] or history["evals"][-1]["step"] != history["step"]:
        history["evals"].append({"step": history["step"], **evaluate(params)})
    summary = _summary(history, settings, {
        "task": "translation", "model": kind, "n_test": n_test, "config": config.to_dict(),
        "checkpoint": None if out is None else checkpoint_file(out)})
    return params, config, summary
