"""Training loops, checkpoints and evaluation: what ``numpytfmr train``, ``train-seq2seq``
and ``generate`` run, written as plain functions so that notebooks, the LoRA and DPO
commands and the tests call the same code.

One optimisation step is the recipe of the notes (003 §2.1.2: minimise the mean
next-token cross-entropy) with the usual transformer optimiser::

    batch  = data(seed, step)                         a fixed function of (seed, step)
    loss, g = loss_and_grads(params, batch)           forward, cross-entropy, backward
    g, N   = clip_grad_norm(g, clip_norm)             global L2 norm at most clip_norm
    lr     = lr_schedule(step, ...)                   linear warmup, cosine decay
    params, opt_state = adamw_step(params, g, opt_state, lr=lr, ...)

Because a batch depends only on ``(seed, step)`` and the whole training state (weights,
AdamW moments, step, loss history) is saved, a run stopped after ``k`` steps and
resumed continues exactly -- bit for bit -- as if it had never stopped.

Checkpoints. A checkpoint is a directory::

    checkpoint.json           kind, config, tokenizer(s), task, settings, training state,
                              and the names and SHA-256 digests of the two array files
    weights-<step>.npz        the parameters (np.load gives the flat dict of init_gpt)
    optimizer-<step>.npz      the AdamW state (optim.py's flat dict)

Every file is written atomically (fileio) and ``checkpoint.json`` is written last: it is
the commit record. A run killed while saving leaves the previous ``checkpoint.json``
and the files it names untouched; files of an unfinished save are removed. Loading
checks the digests, the config against the weights' keys and shapes, and the
tokenizer against the vocabulary, and refuses anything that does not fit with a
``ValueError`` saying what is wrong.
"""
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
import ctypes
import hashlib
import json
import math
import os
import time
import zipfile

import numpy as np

from . import fileio
from .data import (BOS_ID, EOS_ID, SEP_ID, CharTokenizer, decode_completion, evaluate_generation,
                   exact_match, make_task, make_translation, next_token_arrays,
                   tokenizer_from_dict, translation_tokenizers)
from .losses import cross_entropy_forward
from .optim import adamw_init, adamw_step, clip_grad_norm, decay_exempt_keys, lr_schedule

__all__ = [
    "TrainSettings", "limit_blas_threads", "blas_threads", "step_rng", "train_loop",
    "save_checkpoint", "load_checkpoint", "load_model", "checkpoint_file",
    "GPT_TASK_DEFAULTS", "default_gpt_config", "gpt_task_data", "gpt_task_loss", "evaluate_gpt",
    "train_gpt", "replace_config", "encode_prompt", "complete",
    "SEQ2SEQ_SETTINGS", "seq2seq_model", "evaluate_seq2seq", "train_seq2seq", "translate",
    "alignment_table",
]

CHECKPOINT_FORMAT = "numpytfmr.checkpoint"
CHECKPOINT_VERSION = 1
CHECKPOINT_JSON = "checkpoint.json"
IGNORE = -1                      # label of positions left out of the loss (prompt, padding)

# Independent random streams of a run, all derived from its seed.
STREAM_INIT, STREAM_DATA, STREAM_DROPOUT, STREAM_TEST = 0, 1, 2, 3


# ---------------------------------------------------------------------------------------
# Settings, threads, randomness
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainSettings:
    """The optimisation settings of a run (saved in its checkpoint).

    steps:        total number of AdamW updates of the run
    batch_size:   examples per update
    lr:           peak learning rate, reached after ``warmup_steps`` (``lr_schedule``)
    min_lr:       learning rate at the end of the cosine decay
    weight_decay: AdamW's decoupled decay, on matrices and tables only (``decay_exempt_keys``)
    clip_norm:    the global gradient norm is clipped to this (``clip_grad_norm``)
    seed:         initial weights and the data of every step derive from it
    eval_every:   evaluate (and save a checkpoint) every this many steps, and at the end
    """
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr: float = 0.0
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    seed: int = 0
    eval_every: int = 250

    def __post_init__(self):
        where = "TrainSettings"
        for name in ("steps", "batch_size", "eval_every"):
            _positive_int(getattr(self, name), name, where)
        for name in ("warmup_steps", "seed"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{where}: {name} is {v!r}; expected an integer >= 0")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"{where}: warmup_steps is {self.warmup_steps} but steps is "
                             f"{self.steps}; expected fewer warmup steps than steps")
        for name, low_open in (("lr", True), ("min_lr", False), ("weight_decay", False),
                               ("clip_norm", True)):
            v = getattr(self, name)
            ok = isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and \
                math.isfinite(v) and (v > 0 if low_open else v >= 0)
            if not ok:
                raise ValueError(f"{where}: {name} is {v!r}; expected a finite number "
                                 f"{'> 0' if low_open else '>= 0'}")
        if self.min_lr > self.lr:
            raise ValueError(f"{where}: min_lr is {self.min_lr} but lr is {self.lr}; expected "
                             "min_lr <= lr")

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or set(d) - names:
            raise ValueError(f"TrainSettings.from_dict: got {d!r}; expected a dict with keys among "
                             f"{sorted(names)}")
        return cls(**d)


def _positive_int(v, name, where):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{where}: {name} is {v!r}; expected an integer >= 1")
    return int(v)


def _openblas_functions():
    """``(set_num_threads, get_num_threads)`` pairs of every OpenBLAS loaded in this process."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:                  # not Linux: nothing to find this way
        return []
    found = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("openblas", ""), ("scipy_openblas", "64_"), ("openblas", "64_"),
                               ("scipy_openblas", "")):
            setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            if setter is not None and getter is not None:
                getter.restype = ctypes.c_int
                found.append((setter, getter))
                break
    return found


def limit_blas_threads(n):
    """Ask the BLAS library NumPy uses (OpenBLAS) to use ``n`` threads.

    Returns the number of threads it used before, or None when no OpenBLAS was found (MKL,
    Accelerate and other builds are left alone). Prefer the context manager
    :func:`blas_threads`, which restores the previous number.

    Why: the matrices of these small models (64 x 256) are far too small to share
    between threads. With both cores of a small machine busy, a multithreaded OpenBLAS
    spends most of its time waiting, and a training step gets several times slower than
    with one thread. ``OPENBLAS_NUM_THREADS`` works only before NumPy is imported, so this
    calls OpenBLAS's own setter, found among the loaded libraries.
    """
    n = _positive_int(n, "n", "limit_blas_threads")
    previous = None
    for setter, getter in _openblas_functions():
        previous = int(getter())
        setter(ctypes.c_int(n))
    return previous


@contextmanager
def blas_threads(n):
    """``with blas_threads(1): ...`` runs the block with ``n`` BLAS threads (see
    :func:`limit_blas_threads`) and restores the previous number afterwards."""
    previous = limit_blas_threads(n)
    try:
        yield previous
    finally:
        if previous is not None:
            limit_blas_threads(previous)


def step_rng(seed, step, stream=STREAM_DATA):
    """The random generator of one step: a fixed function of ``(seed, stream, step)``.

    Data drawn with it at step ``s`` is the same whether the run got there in one go or
    was stopped and resumed, which makes resuming exact.
    """
    return np.random.default_rng((int(seed), int(stream), int(step)))


# ---------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------

def _new_history():
    return {"step": 0, "seconds": 0.0, "tokens": 0, "loss": [], "evals": []}


def train_loop(params, loss_and_grads, settings, *, opt_state=None, history=None, evaluate=None,
               save=None, progress=None, log=None):
    """Run AdamW from ``history["step"]`` up to ``settings.steps`` (module docstring).

    params:         flat dict of float arrays (the trainable ones)
    loss_and_grads: ``f(params, step) -> (loss, grads, n_tokens)``; it draws its batch
                    from ``step_rng(settings.seed, step)`` so the data of a step is fixed
    settings:       :class:`TrainSettings`
    opt_state:      AdamW state to continue from (``None``: fresh, ``adamw_init``)
    history:        the training state to continue from (``None``: a new run): a dict
                    ``{"step", "seconds", "tokens", "loss": [per step], "evals": [...]}``
    evaluate:       optional ``f(params) -> dict`` of metrics, run every
                    ``settings.eval_every`` steps and after the last one; appended to
                    ``history["evals"]`` with the step
    save:           optional ``f(params, opt_state, history)``, called after each
                    evaluation, and when the run is interrupted (Ctrl-C) before the
                    KeyboardInterrupt goes on
    progress:       optional ``numpytfmr.progress.Progress`` over the remaining steps
    log:            optional ``f(str)`` for one line per evaluation
    Returns ``(params, opt_state, history)``; nothing passed in is modified.
    """
    history = _new_history() if history is None else json.loads(json.dumps(history))
    opt_state = adamw_init(params) if opt_state is None else dict(opt_state)
    no_decay = decay_exempt_keys(params)
    s = settings
    start_time = time.perf_counter()
    seconds_before = history["seconds"]
    try:
        while history["step"] < s.steps:
            step = history["step"]
            loss, grads, n_tokens = loss_and_grads(params, step)
            if not math.isfinite(loss):
                raise ValueError(f"train_loop: the loss is {loss} at step {step}; training "
                                 "diverged (try a smaller lr)")
            grads, _ = clip_grad_norm(grads, s.clip_norm)      # ||g|| <= clip_norm
            lr = lr_schedule(step, base_lr=s.lr, warmup_steps=s.warmup_steps,
                             total_steps=s.steps, min_lr=s.min_lr)
            new_params, new_state = adamw_step(params, grads, opt_state, lr=lr,
                                               weight_decay=s.weight_decay, no_decay=no_decay)
            params, opt_state = new_params, new_state
            history["loss"].append(float(loss))
            history["tokens"] += int(n_tokens)
            history["step"] = step + 1
            history["seconds"] = seconds_before + time.perf_counter() - start_time
            if progress is not None:
                recent = history["loss"][-20:]
                progress.update(metrics={"loss": float(np.mean(recent)), "lr": lr},
                                tokens=int(n_tokens))
            last = history["step"] == s.steps
            if evaluate is not None and (history["step"] % s.eval_every == 0 or last):
                metrics = dict(evaluate(params))
                history["evals"].append({"step": history["step"], **metrics})
                if progress is not None and "exact_match" in metrics:
                    progress.update(0, metrics={"exact": float(metrics["exact_match"])})
                if log is not None:
                    log(f"step {history['step']}: " + "  ".join(
                        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in metrics.items()))
                history["seconds"] = seconds_before + time.perf_counter() - start_time
                if save is not None:
                    save(params, opt_state, history)
    except KeyboardInterrupt:
        if save is not None and history["step"] > 0:
            history["seconds"] = seconds_before + time.perf_counter() - start_time
            save(params, opt_state, history)
        raise
    return params, opt_state, history


# ---------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------

def checkpoint_file(path):
    """The ``checkpoint.json`` of ``path`` (a checkpoint directory or that file itself)."""
    path = os.fspath(path)
    return os.path.join(path, CHECKPOINT_JSON) if os.path.isdir(path) or not path.endswith(
        ".json") else path


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _free_name(directory, stem, taken):
    """``stem.npz``, or ``stem-2.npz``, ... if the current checkpoint already names it (a
    save must never overwrite a file the committed checkpoint still depends on)."""
    name, k = f"{stem}.npz", 1
    while name in taken:
        k += 1
        name = f"{stem}-{k}.npz"
    return name


def _referenced_files(json_path):
    """The array files named by an existing checkpoint.json (empty if none or unreadable)."""
    try:
        with open(json_path, encoding="utf-8") as f:
            meta = json.load(f)
        return {entry["name"] for entry in meta.get("files", {}).values()}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return set()


def save_checkpoint(directory, *, kind, config, params, opt_state=None, meta=None):
    """Save a checkpoint directory atomically (module docstring); returns the JSON path.

    kind:      the model family, ``"gpt"``, ``"encdec"`` or ``"rnn"``
    config:    a JSON-ready dict (``GPTConfig.to_dict()``, ...)
    params:    flat dict of arrays;  opt_state: optional optimizer state (flat dict)
    meta:      further JSON-ready entries (tokenizer, task, settings, training state)

    The array files are written first, under names that no committed checkpoint uses,
    then ``checkpoint.json`` in one atomic rename; only then are the files of the
    previous checkpoint removed. If anything fails on the way, the files of this save
    are deleted and the previous checkpoint stays as it was.
    """
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    json_path = os.path.join(directory, CHECKPOINT_JSON)
    old = _referenced_files(json_path)
    step = int((meta or {}).get("state", {}).get("step", 0))
    arrays = {"weights": params}
    if opt_state is not None:
        arrays["optimizer"] = opt_state
    written, files = [], {}
    try:
        for role, values in arrays.items():
            name = _free_name(directory, f"{role}-{step:06d}", old)
            path = os.path.join(directory, name)
            fileio.save_arrays(path, values)
            written.append(path)
            files[role] = {"name": name, "sha256": _sha256(path)}
        record = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "kind": kind,
                  "config": config, **(meta or {}), "files": files}
        fileio.write_json(json_path, record)
    except BaseException:
        for path in written:
            if os.path.exists(path):
                os.unlink(path)
        raise
    for name in old - {f["name"] for f in files.values()}:   # the previous checkpoint's files
        stale = os.path.join(directory, name)
        if os.path.dirname(os.path.abspath(stale)) == os.path.abspath(directory) and \
                os.path.exists(stale):
            os.unlink(stale)
    return json_path


def load_checkpoint(path, *, kind=None):
    """Read a checkpoint written by :func:`save_checkpoint`.

    path: the checkpoint directory or its ``checkpoint.json``;  kind: the expected kind
    (or a tuple of kinds), None for any.
    Returns the JSON record (a dict) with two more entries, ``"params"`` and
    ``"opt_state"`` (None when absent), and ``"path"``. Raises ``ValueError`` naming the
    file for a missing, unreadable, truncated or inconsistent checkpoint. The model's
    config is checked against the weights by the model-specific loaders below.
    """
    where = "load_checkpoint"
    json_path = checkpoint_file(path)
    if not os.path.exists(json_path):
        raise ValueError(f"{where}: no checkpoint at {os.fspath(path)!r} (expected a directory "
                         f"holding {CHECKPOINT_JSON}, or that file)")
    try:
        with open(json_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: {json_path} is not a readable checkpoint record "
                         f"({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{where}: {json_path} is not a numpytfmr checkpoint (no "
                         f"'format': {CHECKPOINT_FORMAT!r} entry)")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{where}: {json_path} has version {meta.get('version')!r}; this "
                         f"numpytfmr reads version {CHECKPOINT_VERSION}")
    if kind is not None:
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        if meta.get("kind") not in kinds:
            raise ValueError(f"{where}: {json_path} holds a {meta.get('kind')!r} model; expected "
                             f"{' or '.join(repr(k) for k in kinds)}")
    files = meta.get("files")
    if not isinstance(files, dict) or "weights" not in files or \
            not isinstance(meta.get("config"), dict):
        raise ValueError(f"{where}: {json_path} lacks its 'config' or 'files' entries")
    folder = os.path.dirname(os.path.abspath(json_path))
    out = dict(meta, path=json_path, opt_state=None)
    for role, key in (("weights", "params"), ("optimizer", "opt_state")):
        if role not in files:
            continue
        entry = files[role]
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or \
                os.path.basename(entry["name"]) != entry["name"]:
            raise ValueError(f"{where}: {json_path} has a malformed files[{role!r}] entry "
                             f"{entry!r}")
        file = os.path.join(folder, entry["name"])
        if not os.path.exists(file):
            raise ValueError(f"{where}: {json_path} names {entry['name']!r}, which is missing")
        if entry.get("sha256") != _sha256(file):
            raise ValueError(f"{where}: {file} does not match the SHA-256 recorded in "
                             f"{CHECKPOINT_JSON}; the file is truncated, corrupt or was replaced")
        try:
            out[key] = fileio.load_arrays(file)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
            raise ValueError(f"{where}: {file} is not a readable .npz file ({exc})") from None
    return out


def _check_weights(params, shapes, json_path):
    """The weights of a checkpoint must be exactly the parameters its config describes."""
    missing = sorted(set(shapes) - set(params))
    extra = sorted(set(params) - set(shapes))
    if missing or extra:
        parts = []
        for what, keys in (("missing", missing), ("unexpected", extra)):
            if keys:
                parts.append(f"{what} {keys[:4]}{' ...' if len(keys) > 4 else ''}")
        raise ValueError(f"load_checkpoint: the weights of {json_path} do not match its config "
                         f"({'; '.join(parts)})")
    dtypes = set()
    for k, shape in shapes.items():
        p = params[k]
        if p.shape != tuple(shape):
            raise ValueError(f"load_checkpoint: the weights of {json_path} do not match its "
                             f"config: {k} has shape {p.shape}, the config gives {tuple(shape)}")
        if p.dtype not in (np.float32, np.float64):
            raise ValueError(f"load_checkpoint: the weights of {json_path} hold {k} with dtype "
                             f"{p.dtype}; expected float32 or float64")
        dtypes.add(p.dtype)
    if len(dtypes) > 1:
        raise ValueError(f"load_checkpoint: the weights of {json_path} mix dtypes "
                         f"{sorted(map(str, dtypes))}")


def _config_from(cls, d, json_path):
    try:
        return cls.from_dict(d)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"load_checkpoint: the config of {json_path} is invalid: {exc}") from None


def _tokenizer_from(d, json_path, vocab_size, name="tokenizer"):
    try:
        tok = tokenizer_from_dict(d)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"load_checkpoint: the {name} of {json_path} is invalid: {exc}") from None
    if tok.vocab_size != vocab_size:
        raise ValueError(f"load_checkpoint: the {name} of {json_path} has {tok.vocab_size} tokens "
                         f"but the model's vocabulary has {vocab_size}")
    return tok


def load_model(path, *, kind=None):
    """Load a checkpoint and rebuild its model: the record of :func:`load_checkpoint` plus
    ``"model_config"`` (a GPTConfig / EncDecConfig / RNN config object) and the tokenizers
    (``"tokenizer"`` for a GPT; ``"src_tokenizer"``, ``"tgt_tokenizer"`` for seq2seq)."""
    ck = load_checkpoint(path, kind=kind)
    json_path = ck["path"]
    if ck["kind"] == "gpt":
        from .gpt import GPTConfig, gpt_param_shapes
        cfg = _config_from(GPTConfig, ck["config"], json_path)
        _check_weights(ck["params"], gpt_param_shapes(cfg), json_path)
        ck["tokenizer"] = _tokenizer_from(ck.get("tokenizer"), json_path, cfg.vocab_size)
    elif ck["kind"] in SEQ2SEQ_KINDS:
        model = seq2seq_model(ck["kind"])
        cfg = _config_from(model["config_cls"], ck["config"], json_path)
        _check_weights(ck["params"], model["shapes"](cfg), json_path)
        ck["src_tokenizer"] = _tokenizer_from(ck.get("src_tokenizer"), json_path,
                                              model["src_vocab"](cfg), "src_tokenizer")
        ck["tgt_tokenizer"] = _tokenizer_from(ck.get("tgt_tokenizer"), json_path,
                                              model["tgt_vocab"](cfg), "tgt_tokenizer")
    else:
        raise ValueError(f"load_checkpoint: {json_path} holds an unknown kind of model "
                         f"{ck['kind']!r}; expected 'gpt', 'encdec' or 'rnn'")
    if ck.get("opt_state") is not None:
        expected = {"step"} | {f"{p}/{k}" for p in ("m", "v") for k in ck["params"]}
        if set(ck["opt_state"]) != expected:
            raise ValueError(f"load_checkpoint: the optimizer state of {json_path} does not "
                             "match its weights (different parameter names)")
    ck["model_config"] = cfg
    return ck


RESUME_CHANGEABLE = ("steps", "eval_every")


def _resume_checkpoint(out, kinds, where):
    if out is None:
        raise ValueError(f"{where}: resume=True needs the checkpoint directory out=")
    ck = load_model(out, kind=kinds)
    state = ck.get("state")
    if ck["opt_state"] is None or not isinstance(state, dict) or not isinstance(
            ck.get("settings"), dict) or not isinstance(ck.get("task"), dict):
        raise ValueError(f"{where}: {ck['path']} holds no training state to resume from "
                         "(settings, task, optimizer state)")
    expected = {"step", "seconds", "tokens", "loss", "evals"}
    if set(state) != expected or len(state["loss"]) != state["step"]:
        raise ValueError(f"{where}: {ck['path']} has a malformed training state; expected keys "
                         f"{sorted(expected)} with one loss per step")
    if int(np.asarray(ck["opt_state"]["step"])) != state["step"]:
        raise ValueError(f"{where}: {ck['path']} records step {state['step']} but its optimizer "
                         f"state has taken {int(np.asarray(ck['opt_state']['step']))} steps")
    return ck


def _resumed_settings(ck, changes, where):
    """The checkpoint's settings with the allowed changes; other changes must be no-ops."""
    saved = TrainSettings.from_dict(ck["settings"])
    new = saved.to_dict()
    current = {**ck["config"], **ck["task"], **new}
    for name, value in (changes or {}).items():
        if value is None:
            continue
        if name in RESUME_CHANGEABLE:
            new[name] = value
        elif name not in current:
            raise ValueError(f"{where}: changes has the unknown option {name!r}")
        elif current[name] != value:
            raise ValueError(f"{where}: {name} is {value!r} but the run in {ck['path']} has "
                             f"{current[name]!r}; a resumed run keeps its model, task and "
                             f"settings (only {' and '.join(RESUME_CHANGEABLE)} may change)")
    if new["steps"] < ck["state"]["step"]:
        raise ValueError(f"{where}: steps is {new['steps']} but the checkpoint is already at step "
                         f"{ck['state']['step']}; expected steps >= {ck['state']['step']}")
    return TrainSettings(**new)


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


def gpt_task_loss(params, inputs, labels, *, config, rng=None):
    """Mean cross-entropy over the answer tokens and its gradients: ``(loss, grads)``
    (``gpt_loss`` with the prompt and padding positions ignored)."""
    from .gpt import gpt_loss
    return gpt_loss(params, inputs, labels, config=config, ignore_index=IGNORE, rng=rng,
                    train=rng is not None)


def evaluate_gpt(params, config, test_data, *, batch_size=256):
    """Held-out metrics of a GPT on a ``make_task`` dict: ``{"exact_match", "test_loss"}``.

    exact_match: greedy decoding with the KV cache from ``<bos> prompt <sep>`` until
    ``<eos>``, compared with the answer as a string; test_loss: the teacher-forced mean
    cross-entropy of the answer tokens.
    """
    from .gpt import generate, gpt_forward
    acc, _ = evaluate_generation(
        lambda p, m: generate(params, p, config=config, max_new_tokens=m, top_k=1,
                              eos_id=EOS_ID, use_cache=True), test_data, batch_size=batch_size)
    inputs, labels, label_mask = next_token_arrays(test_data["ids"], test_data["loss_mask"])
    logits, _ = gpt_forward(params, inputs, config=config)
    loss, _ = cross_entropy_forward(logits, np.where(label_mask, labels, IGNORE),
                                    ignore_index=IGNORE)
    return {"exact_match": float(acc), "test_loss": float(loss)}


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
    from .gpt import init_gpt
    from .progress import Progress
    opt_state = history = None
    if resume:
        if config is not None or settings is not None or task is not None:
            raise ValueError("train_gpt: with resume=True the model, task and settings come from "
                             "the checkpoint; pass what should change as changes={...}")
        ck = _resume_checkpoint(out, ("gpt",), "train_gpt")
        config, params, opt_state, history = (ck["model_config"], ck["params"], ck["opt_state"],
                                              ck["state"])
        settings = _resumed_settings(ck, changes, "train_gpt")
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
    task_meta = {"task": task, "min_prompt_len": min_len, "max_prompt_len": max_len,
                 "n_test": n_test}

    def loss_and_grads(p, step):
        inputs, labels = gpt_task_data(task, step, seed=settings.seed,
                                       batch_size=settings.batch_size, min_len=min_len,
                                       max_len=max_len, tokenizer=tokenizer)
        rng = step_rng(settings.seed, step, STREAM_DROPOUT) if config.dropout > 0 else None
        loss, grads = gpt_task_loss(p, inputs, labels, config=config, rng=rng)
        return loss, grads, inputs.size

    def save(p, state, hist):
        save_checkpoint(out, kind="gpt", config=config.to_dict(), params=p, opt_state=state,
                        meta={"tokenizer": tokenizer.to_dict(), "task": task_meta,
                              "settings": settings.to_dict(), "state": hist})

    start = 0 if history is None else history["step"]
    bar = Progress(max(settings.steps - start, 1),
                   "train" if not start else f"train from {start}") if progress else None
    try:
        params, opt_state, history = train_loop(
            params, loss_and_grads, settings, opt_state=opt_state, history=history,
            evaluate=lambda p: evaluate_gpt(p, config, test_data),
            save=save if out is not None else None, progress=bar, log=log)
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


def default_gpt_config(vocab_size, max_len=8):
    """The model ``numpytfmr train`` trains by default: 2 layers, d_model 64, 4 heads,
    learned positions, pre-norm, ReLU FFN (d_ff 256), tied embeddings; the context is the
    longest sequence of the task (``<bos>``, ``max_len`` digits, ``<sep>``, ``max_len``
    digits, ``<eos>``)."""
    from .gpt import GPTConfig
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


def complete(params, config, tokenizer, prompt, *, max_new_tokens=None, temperature=0.0,
             top_k=None, rng=None, use_cache=True, raw=False):
    """The completion of one prompt by a GPT, decoded until ``<eos>``: ``(text, ids)``.

    max_new_tokens: None = fill the context (learned positions) or 64 tokens.
    """
    from .gpt import generate
    ids = encode_prompt(tokenizer, prompt, raw=raw)
    T = ids.shape[1]
    if config.positional == "learned":
        room = config.max_len - T + 1          # generate reads at most max_len positions
        if room < 1:
            raise ValueError(f"complete: the prompt is {T} tokens long (with <bos> and <sep>) but "
                             f"the model reads at most max_len={config.max_len} positions")
        if max_new_tokens is None:
            max_new_tokens = room
        elif max_new_tokens > room:
            raise ValueError(f"complete: max_new_tokens is {max_new_tokens} but a prompt of {T} "
                             f"tokens leaves room for {room} (max_len={config.max_len})")
    elif max_new_tokens is None:
        max_new_tokens = 64
    out = generate(params, ids, config=config, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, rng=rng, use_cache=use_cache,
                   eos_id=EOS_ID)
    new = out[0, T:]
    return decode_completion(new, tokenizer), new


# ---------------------------------------------------------------------------------------
# Sequence to sequence: the encoder-decoder transformer and the recurrent model
# ---------------------------------------------------------------------------------------

SEQ2SEQ_KINDS = ("encdec", "rnn")
SEQ2SEQ_DEFAULTS = {"n_test": 400}
# Both models translate every held-out sentence after a few hundred steps.
SEQ2SEQ_SETTINGS = TrainSettings(steps=500, eval_every=100)


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
        from . import encdec as m

        def generate(params, src, src_mask, cfg, max_new, use_cache=True):
            out, per_layer = m.encdec_generate(params, src, config=cfg, max_new_tokens=max_new,
                                               bos_id=BOS_ID, eos_id=EOS_ID, src_mask=src_mask,
                                               use_cache=use_cache, return_cross_weights=True)
            return out, per_layer[-1].mean(axis=1)   # (B, heads, steps, S) -> (B, steps, S)

        return {
            "config_cls": m.EncDecConfig, "shapes": m.encdec_param_shapes,
            "src_vocab": lambda c: c.src_vocab_size, "tgt_vocab": lambda c: c.tgt_vocab_size,
            "init": lambda c, rng: m.init_encdec(c, rng=rng),
            "loss": lambda p, batch, c: m.encdec_loss(p, batch, config=c),
            "generate": generate,
            "default_config": lambda sv, tv: m.EncDecConfig(
                src_vocab_size=sv, tgt_vocab_size=tv, n_enc_layers=2, n_dec_layers=2,
                d_model=64, n_heads=4, d_ff=256, max_len=16, positional="learned",
                norm="pre", activation="relu"),
        }
    if kind == "rnn":
        from . import rnn as m

        def generate(params, src, src_mask, cfg, max_new, use_cache=True):
            # one GRU step per word: the state carries the past, there is no KV cache
            return m.rnn_seq2seq_generate(params, src, config=cfg, max_new_tokens=max_new,
                                          bos_id=BOS_ID, eos_id=EOS_ID, src_mask=src_mask,
                                          return_weights=True)

        return {
            "config_cls": m.RNNSeq2SeqConfig, "shapes": m.rnn_seq2seq_param_shapes,
            "src_vocab": lambda c: c.src_vocab_size, "tgt_vocab": lambda c: c.tgt_vocab_size,
            "init": lambda c, rng: m.init_seq2seq_rnn(c, rng=rng),
            "loss": lambda p, batch, c: m.rnn_seq2seq_loss(p, batch, config=c),
            "generate": generate,
            "default_config": lambda sv, tv: m.RNNSeq2SeqConfig(
                src_vocab_size=sv, tgt_vocab_size=tv, d_emb=32, d_hidden=64,
                bidirectional=True),
        }
    raise ValueError(f"seq2seq_model: kind is {kind!r}; expected one of {SEQ2SEQ_KINDS}")


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
        ck = _resume_checkpoint(out, SEQ2SEQ_KINDS, "train_seq2seq")
        if changes and changes.get("kind") not in (None, ck["kind"]):
            raise ValueError(f"train_seq2seq: the checkpoint in {out} holds a {ck['kind']!r} model "
                             f"but kind={changes['kind']!r} was asked for")
        kind, config, params, opt_state, history = (ck["kind"], ck["model_config"], ck["params"],
                                                    ck["opt_state"], ck["state"])
        settings = _resumed_settings(ck, {k: v for k, v in (changes or {}).items() if k != "kind"},
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
    task_meta = {"task": "translation", "n_test": n_test}

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

    from .progress import Progress
    start = 0 if history is None else history["step"]
    bar = Progress(max(settings.steps - start, 1),
                   kind if not start else f"{kind} from {start}") if progress else None

    def evaluate(p):
        return evaluate_seq2seq(p, kind, config, test_data)
    try:
        params, opt_state, history = train_loop(
            params, loss_and_grads, settings, opt_state=opt_state, history=history,
            evaluate=evaluate, save=save if out is not None else None, progress=bar, log=log)
    finally:
        if bar is not None:
            bar.close()
    if not history["evals"] or history["evals"][-1]["step"] != history["step"]:
        history["evals"].append({"step": history["step"], **evaluate(params)})
    summary = _summary(history, settings, {
        "task": "translation", "model": kind, "n_test": n_test, "config": config.to_dict(),
        "checkpoint": None if out is None else checkpoint_file(out)})
    return params, config, summary
