"""The checkpoint format: save a run, load it back, rebuild its model, resume it.

A checkpoint is a directory::

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
import hashlib
import json
import os
from typing import NamedTuple
import zipfile

import numpy as np

from ..gpt import GPTConfig, gpt_param_shapes
from ..shared import fileio
from .data import tokenizer_from_dict
from .loop import TrainSettings
from .models import SEQ2SEQ_KINDS, seq2seq_model

__all__ = ["save_checkpoint", "load_checkpoint", "load_model", "load_run", "Run",
           "checkpoint_file", "resume_checkpoint", "resumed_settings", "RESUME_CHANGEABLE"]

CHECKPOINT_FORMAT = "numpytfmr.checkpoint"
CHECKPOINT_VERSION = 1
CHECKPOINT_JSON = "checkpoint.json"


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


def _free_name(stem, taken):
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

    The array files come first, under names no committed checkpoint uses; the previous
    checkpoint's files are removed only once ``checkpoint.json`` is in place.
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
            name = _free_name(f"{role}-{step:06d}", old)
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
        parts = [f"{what} {keys[:4]}{' ...' if len(keys) > 4 else ''}"
                 for what, keys in (("missing", missing), ("unexpected", extra)) if keys]
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


class Run(NamedTuple):
    """A trained GPT as :func:`load_run` gives it: ``params, config, tokenizer = run``."""
    params: dict        # flat dict of arrays (gpt.py's keys)
    config: object      # GPTConfig
    tokenizer: object   # the tokenizer it was trained with (tokenizers.py)


def load_run(path):
    """The model of a run folder of ``numpytfmr pretrain``, ``train``, ``lora`` or ``dpo``
    (or its checkpoint.json): ``(params, config, tokenizer)``, checked as :func:`load_model`
    checks them, ready for ``gpt_forward``, ``generate`` or ``save_hf_checkpoint``
    (docs/learner.md, "Real models"). A run of ``train-seq2seq`` (two tokenizers) is a
    ValueError: read it with load_model."""
    ck = load_model(path)
    if ck["kind"] != "gpt":
        raise ValueError(f"load_run: {ck['path']} holds a {ck['kind']!r} model; load_run reads "
                         "GPT runs (pretrain, train, lora, dpo); use load_model for it")
    return Run(ck["params"], ck["model_config"], ck["tokenizer"])


RESUME_CHANGEABLE = ("steps", "eval_every")


def resume_checkpoint(out, kinds, where):
    """The checkpoint of a run to continue (``load_model``), with its training state checked:
    settings, task, optimizer state and one loss per step taken."""
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


def resumed_settings(ck, changes, where):
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
