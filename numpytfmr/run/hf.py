"""Real architectures: GPT-2 and LLaMA checkpoints of Hugging Face ``transformers`` as
numpytfmr parameters, and numpytfmr models as such checkpoints.

Both are the decoder-only model of ``gpt.py`` (004 "Transformer Decoder", pre-norm
eq. 30) with different options:

    GPT-2:  learned positions (004 eq. 12), LayerNorm with bias, FFN with the tanh GELU,
            biases everywhere, output layer tied to the token table
    LLaMA:  RoPE in the "half" layout inside attention (003 §7.3), RMSNorm, the SwiGLU
            FFN (silu(x W_gate) * (x W_up)) W_down, no biases, GQA (003 §5.2), an
            untied output layer (unless tie_word_embeddings)

In: :func:`gpt_config_from_hf` (``config.json``), :func:`gpt_from_hf` (a state dict) and
:func:`load_hf_checkpoint` (a local ``save_pretrained`` folder). Out: :func:`gpt_to_hf`,
their inverse, and :func:`save_hf_checkpoint`, a folder ``from_pretrained`` loads with the
same logits (docs/learner.md, "Real models, and moving on to PyTorch"). Nothing here
touches the network.

Converting the weights is bookkeeping, with one rule: numpytfmr computes ``y = x W``
with ``W`` of shape (d_in, d_out).

* GPT-2 stores its projections as ``Conv1D`` modules whose weight is already
  (d_in, d_out); ``c_attn`` holds ``[Wq | Wk | Wv]`` side by side and is split in three.
* LLaMA's ``nn.Linear`` computes ``x W^T`` with a weight of shape (d_out, d_in), so each
  weight is transposed.
* LLaMA rotates the query/key pairs ``(j, j + d_head/2)`` (``rotate_half``; its
  conversion script permuted the original rows for that). numpytfmr's
  ``rope_layout="half"`` uses the same pairs, so no permutation is needed; a model in
  the notes' "interleaved" layout is exported with its W_q and W_k columns permuted.

One table per family (``_gpt2_plan``, ``_llama_plan``) lists every weight as (hf key,
hf shape, layout, our keys), the key map in full; both directions read it, so import and
export cannot drift.
"""
from dataclasses import replace
import json
import os
import secrets
import shutil
import warnings

import numpy as np

from ..contract import flag
from ..gpt import GPTConfig, gpt_param_shapes
from ..positional import yarn_correction_range
from ..shared.fileio import atomic_file, atomic_write_text
from ..transformer import check_model
from .data import SPECIAL_TOKENS, CharTokenizer, WordTokenizer

__all__ = ["gpt_config_from_hf", "gpt_from_hf", "load_hf_checkpoint", "gpt_to_hf",
           "save_hf_checkpoint"]

MODEL_TYPES = ("gpt2", "llama")

# GPT-2's activation_function -> our FFN activation. "gelu_new", "gelu_fast" and
# "gelu_pytorch_tanh" are all x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
                     "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}

# Buffers (not parameters) that older checkpoints carry: the causal mask of GPT-2's
# attention and LLaMA's precomputed RoPE frequencies. They hold no learned value.
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


# -------------------------------------------------------------- config.json -> GPTConfig

def _need(hf, keys, where, model_type):
    """The size fields a config must state; a missing one is an error, not a silent default."""
    missing = [k for k in keys if hf.get(k) is None]
    if missing:
        raise ValueError(f"{where}: hf_config (model_type {model_type!r}) has no {missing}; "
                         "expected the config.json of the checkpoint")


def _flag(hf, key, default, where):
    value = hf.get(key, default)
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: hf_config[{key!r}] is {value!r}; expected true or false")
    return bool(value)


def _gpt2_config(hf, where):
    _need(hf, ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"), where, "gpt2")
    act = hf.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise ValueError(f"{where}: hf_config['activation_function'] is {act!r}; expected one of "
                         f"{', '.join(map(repr, _GPT2_ACTIVATIONS))}")
    if not _flag(hf, "scale_attn_weights", True, where):
        raise ValueError(f"{where}: hf_config['scale_attn_weights'] is false; numpytfmr's "
                         "attention always scales the logits by 1/sqrt(d_head)")
    if _flag(hf, "scale_attn_by_inverse_layer_idx", False, where):
        raise ValueError(f"{where}: hf_config['scale_attn_by_inverse_layer_idx'] is true; "
                         "expected false (numpytfmr has no per-layer attention scale)")
    if _flag(hf, "add_cross_attention", False, where):
        raise ValueError(f"{where}: hf_config['add_cross_attention'] is true; expected false "
                         "(a decoder-only GPT-2 has no cross-attention)")
    # reorder_and_upcast_attn changes only the order of float operations, not the math
    return GPTConfig(vocab_size=hf["vocab_size"], n_layers=hf["n_layer"], d_model=hf["n_embd"],
                     n_heads=hf["n_head"], d_ff=hf.get("n_inner"), max_len=hf["n_positions"],
                     positional="learned", norm="pre", activation=_GPT2_ACTIVATIONS[act],
                     tie_embeddings=_flag(hf, "tie_word_embeddings", True, where),
                     norm_type="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5), bias=True)


def _llama_rope(hf, where):
    """(base, scaling) of RoPE from ``rope_parameters`` (transformers >= 5) or the older
    ``rope_theta`` + ``rope_scaling``."""
    params = hf.get("rope_parameters")
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    if not isinstance(params, dict):
        raise TypeError(f"{where}: hf_config['rope_parameters'] is {params!r}; expected a dict")
    kind = params.get("rope_type", params.get("type", "default"))
    base = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{where}: RoPE has partial_rotary_factor "
                         f"{params['partial_rotary_factor']}; numpytfmr rotates every dimension "
                         "of a head (expected 1.0)")
    if kind == "default":
        return base, None
    if kind == "linear":   # position interpolation: every frequency divided by the factor
        if params.get("factor") is None:
            raise ValueError(f"{where}: RoPE scaling of type 'linear' has no 'factor'; expected "
                             "the interpolation factor s >= 1")
        return base, {"type": "linear", "factor": params["factor"]}
    if kind == "yarn":
        return base, _llama_yarn(params, where)
    raise ValueError(f"{where}: RoPE scaling of type {kind!r} is not supported; expected "
                     "'default', 'linear' or 'yarn' (dynamic NTK, llama3 and longrope differ "
                     "from numpytfmr's rope_frequencies)")


def _llama_yarn(params, where):
    """numpytfmr's YaRN scaling dict of transformers' "yarn" ``rope_parameters``.

    transformers builds the same by-parts frequencies (003 §7.6.1) but also multiplies cos
    and sin by ``attention_factor`` (default ``0.1 ln s + 1``, YaRN's temperature), which
    numpytfmr's RoPE leaves to the attention scale (``yarn_attention_scale``): only an
    explicit ``attention_factor`` of 1.0 is the same model.
    """
    if params.get("attention_factor") != 1.0:
        raise ValueError(f"{where}: RoPE scaling of type 'yarn' has attention_factor "
                         f"{params.get('attention_factor')!r}; transformers then scales cos and "
                         "sin by YaRN's temperature, which numpytfmr's RoPE does not (expected "
                         "attention_factor 1.0)")
    for key in ("factor", "original_max_position_embeddings"):
        if params.get(key) is None:
            raise ValueError(f"{where}: RoPE scaling of type 'yarn' has no {key!r}; expected the "
                             "extension factor s and the training context L")
    spec = {"type": "yarn", "factor": params["factor"],
            "original_max_positions": params["original_max_position_embeddings"]}
    spec.update({k: params[k] for k in ("beta_fast", "beta_slow", "truncate")
                 if params.get(k) is not None})
    return spec


def _llama_config(hf, where):
    _need(hf, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size"), where, "llama")
    d, H = hf["hidden_size"], hf["num_attention_heads"]
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hf_config['hidden_act'] is {act!r}; expected 'silu' (the "
                         "SwiGLU feed-forward layer)")
    for key in ("attention_bias", "mlp_bias"):
        if _flag(hf, key, False, where):
            raise ValueError(f"{where}: hf_config[{key!r}] is true; numpytfmr's LLaMA has no "
                             "biases (expected false)")
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * H != d:
        raise ValueError(f"{where}: hf_config['head_dim'] is {head_dim} but hidden_size / "
                         f"num_attention_heads = {d} / {H}; expected head_dim = hidden_size / "
                         "num_attention_heads")
    base, scaling = _llama_rope(hf, where)
    return GPTConfig(vocab_size=hf["vocab_size"], n_layers=hf["num_hidden_layers"], d_model=d,
                     n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H,
                     d_ff=hf["intermediate_size"], max_len=hf.get("max_position_embeddings", 2048),
                     positional="rope", rope_base=base, rope_layout="half", rope_scaling=scaling,
                     norm="pre", activation="swiglu",
                     tie_embeddings=_flag(hf, "tie_word_embeddings", False, where),
                     norm_type="rmsnorm", norm_eps=hf.get("rms_norm_eps", 1e-6), bias=False)


def gpt_config_from_hf(hf_config):
    """The :class:`GPTConfig` of a GPT-2 or LLaMA ``config.json`` (a dict).

    ``model_type`` picks the family (module docstring; the fields each reads: ``_gpt2_config``,
    ``_llama_config``). Dropout is 0 (the config of a trained model).

    RoPE scaling: "linear" and "yarn" (the latter only with ``attention_factor`` 1.0,
    as :func:`save_hf_checkpoint` writes it: transformers' default multiplies cos and sin
    by YaRN's temperature).

    A config numpytfmr cannot reproduce exactly is a ValueError naming the field: other
    model types, other RoPE scalings, LLaMA with biases, GPT-2 with cross-attention or
    per-layer attention scaling, ...
    """
    where = "gpt_config_from_hf"
    if not isinstance(hf_config, dict):
        raise TypeError(f"{where}: hf_config is a {type(hf_config).__name__}; expected the "
                        "config.json dict (json.load of the file, or model.config.to_dict())")
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{where}: hf_config['model_type'] is {model_type!r}; expected one of "
                         f"{', '.join(map(repr, MODEL_TYPES))}")
    if model_type == "gpt2":
        return _gpt2_config(hf_config, where)
    return _llama_config(hf_config, where)


# ------------------------------------------------------------------ state dict -> params

def _strip_prefix(state_dict, prefix):
    """Keys without the prefix of the ``...ForCausalLM`` wrapper (``transformer.``/``model.``),
    so the bare ``GPT2Model``/``LlamaModel`` state dicts read the same way."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): a for k, a in state_dict.items()}


# How one Hugging Face tensor holds numpytfmr parameters, in both directions:
# (hf array, number of our arrays) -> our arrays, and our arrays -> hf array.
#   "copy":      the same array
#   "transpose": nn.Linear computes x W^T with a (d_out, d_in) weight; ours is W (d_in, d_out)
#   "columns":   GPT-2's c_attn holds [W_q | W_k | W_v] side by side (the last axis split in n)
_LAYOUTS = {
    "copy": (lambda a, n: [a], lambda parts: parts[0]),
    "transpose": (lambda a, n: [a.T], lambda parts: parts[0].T),
    "columns": (lambda a, n: np.split(a, n, axis=-1), lambda parts: np.concatenate(parts, axis=-1)),
}

# The ...ForCausalLM wrapper's prefix of every key but lm_head.weight, and its class name
_PREFIXES = {"gpt2": "transformer.", "llama": "model."}
_ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def _gpt2_plan(c):
    """(hf key without prefix, hf shape, layout, our keys) of every GPT-2 weight. The one
    table behind both :func:`gpt_from_hf` and :func:`gpt_to_hf`."""
    d, dff = c.d_model, c.d_ff
    plan = [("wte.weight", (c.vocab_size, d), "copy", ("wte",)),
            ("wpe.weight", (c.max_len, d), "copy", ("wpe",))]
    for l in range(c.n_layers):
        h, p = f"h.{l}.", f"h{l}."
        # (hf module, weight shape, layout, our weights, our biases); a bias is (d_out,)
        for module, shape, layout, weights, biases in (
                ("ln_1", (d,), "copy", ("attn_norm.gamma",), ("attn_norm.beta",)),
                ("attn.c_attn", (d, 3 * d), "columns", ("attn.Wq", "attn.Wk", "attn.Wv"),
                 ("attn.bq", "attn.bk", "attn.bv")),
                ("attn.c_proj", (d, d), "copy", ("attn.Wo",), ("attn.bo",)),
                ("ln_2", (d,), "copy", ("mlp_norm.gamma",), ("mlp_norm.beta",)),
                ("mlp.c_fc", (d, dff), "copy", ("mlp.W1",), ("mlp.b1",)),
                ("mlp.c_proj", (dff, d), "copy", ("mlp.W2",), ("mlp.b2",))):
            plan += [(f"{h}{module}.weight", shape, layout, tuple(p + k for k in weights)),
                     (f"{h}{module}.bias", shape[-1:], layout, tuple(p + k for k in biases))]
    plan += [("ln_f.weight", (d,), "copy", ("norm_f.gamma",)),
             ("ln_f.bias", (d,), "copy", ("norm_f.beta",))]
    return plan


def _llama_plan(c):
    """As :func:`_gpt2_plan`, for LLaMA."""
    d, dff, hd, kvd = c.d_model, c.d_ff, c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    plan = [("embed_tokens.weight", (c.vocab_size, d), "copy", ("wte",))]
    for l in range(c.n_layers):
        h, p = f"layers.{l}.", f"h{l}."
        plan += [
            (h + "input_layernorm.weight", (d,), "copy", (p + "attn_norm.gamma",)),
            (h + "self_attn.q_proj.weight", (hd, d), "transpose", (p + "attn.Wq",)),
            (h + "self_attn.k_proj.weight", (kvd, d), "transpose", (p + "attn.Wk",)),
            (h + "self_attn.v_proj.weight", (kvd, d), "transpose", (p + "attn.Wv",)),
            (h + "self_attn.o_proj.weight", (d, hd), "transpose", (p + "attn.Wo",)),
            (h + "post_attention_layernorm.weight", (d,), "copy", (p + "mlp_norm.gamma",)),
            (h + "mlp.gate_proj.weight", (dff, d), "transpose", (p + "mlp.W_gate",)),
            (h + "mlp.up_proj.weight", (dff, d), "transpose", (p + "mlp.W_up",)),
            (h + "mlp.down_proj.weight", (d, dff), "transpose", (p + "mlp.W_down",)),
        ]
    plan.append(("norm.weight", (d,), "copy", ("norm_f.gamma",)))
    return plan


def _plan(c, family):
    """The whole table of a model: its family's plan, plus the output layer when untied
    (logits = x W_out with W_out = lm_head.weight^T)."""
    plan = _gpt2_plan(c) if family == "gpt2" else _llama_plan(c)
    if not c.tie_embeddings:
        plan.append(("lm_head.weight", (c.vocab_size, c.d_model), "transpose", ("lm_head.W",)))
    return plan


def _read_array(state_dict, key, where):
    a = state_dict[key]
    try:
        a = np.asarray(a)
    except Exception as exc:
        raise TypeError(f"{where}: state_dict[{key!r}] could not be read as a NumPy array "
                        f"({exc}); expected NumPy arrays") from None
    if a.dtype.kind != "f":
        raise TypeError(f"{where}: state_dict[{key!r}] has dtype {a.dtype}; expected a "
                        "floating-point array")
    return a


def _out_dtype(arrays, dtype, where):
    """float64 if asked for, or if every weight is float64; float32 otherwise (float16
    weights are widened: numpytfmr computes in float32 or float64 only)."""
    if dtype is None:
        return np.dtype(np.float64) if all(a.dtype == np.float64 for a in arrays) \
            else np.dtype(np.float32)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{where}: dtype is {dtype!r}; expected None, np.float32 or np.float64")
    return dt


def gpt_from_hf(state_dict, hf_config, *, dtype=None):
    """numpytfmr parameters and config of a GPT-2 or LLaMA Hugging Face model.

    state_dict: ``{name: array}`` as NumPy arrays (e.g. ``{k: v.numpy() for k, v in
                model.state_dict().items()}``), of ``GPT2LMHeadModel``/``GPT2Model`` or
                ``LlamaForCausalLM``/``LlamaModel``; the ``transformer.``/``model.``
                prefixes are optional. Buffers (GPT-2's ``attn.bias`` mask, LLaMA's
                ``rotary_emb.inv_freq``) are ignored; a tied ``lm_head.weight`` must equal
                the token table.
    hf_config:  the ``config.json`` dict (see :func:`gpt_config_from_hf`)
    dtype:      None (float64 if every weight is float64, else float32), np.float32 or
                np.float64
    returns (params, config): ``params`` has exactly the keys of
                ``gpt_param_shapes(config)``, new arrays (the inputs are not modified),
                ready for ``gpt_forward``/``gpt_backward``/``generate``.

    Missing or unexpected weights and wrong shapes are ValueErrors naming the key.
    The conversion is linear (slices and transposes), so applying it to a state dict of
    gradients gives the gradients in numpytfmr's layout.
    """
    where = "gpt_from_hf"
    config = gpt_config_from_hf(hf_config)
    if not isinstance(state_dict, dict):
        raise TypeError(f"{where}: state_dict is a {type(state_dict).__name__}; expected a dict "
                        "of NumPy arrays")
    family = hf_config["model_type"]
    sd = _strip_prefix(state_dict, _PREFIXES[family])
    plan = _plan(config, family)

    missing = [k for k, *_ in plan if k not in sd]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ValueError(f"{where}: state_dict has no {missing[:5]}{more}; expected every weight "
                         f"of a {family} model with this config")
    used = {k for k, *_ in plan}
    extra = [k for k in sd if k not in used and not k.endswith(_BUFFER_SUFFIXES)
             and not (k == "lm_head.weight" and config.tie_embeddings)]
    if extra:
        raise ValueError(f"{where}: state_dict has unexpected keys {extra[:5]}; they are not part "
                         f"of a {family} model with this config")

    arrays = {k: _read_array(sd, k, where) for k in used}
    dt = _out_dtype(arrays.values(), dtype, where)
    params = {}
    for key, shape, layout, ours in plan:
        a = arrays[key]
        if a.shape != shape:
            raise ValueError(f"{where}: state_dict[{key!r}] has shape {a.shape}; expected {shape} "
                             "for this config")
        to_ours = _LAYOUTS[layout][0]
        for name, value in zip(ours, to_ours(a, len(ours))):
            params[name] = np.array(value, dtype=dt, order="C", copy=True)   # never a view
    if config.tie_embeddings and "lm_head.weight" in sd:
        head, table = _read_array(sd, "lm_head.weight", where), arrays[plan[0][0]]  # plan[0]: wte
        if head.shape != table.shape or not np.array_equal(head, table):
            raise ValueError(f"{where}: tie_word_embeddings is true but state_dict['lm_head.weight'] "
                             "differs from the token embedding table; expected the tied copy")
    assert set(params) == set(gpt_param_shapes(config))   # the plan covers every parameter
    return params, config


# ------------------------------------ A checkpoint directory (config.json + safetensors)

def _safetensors_header(path):
    """The JSON header of a .safetensors file and where its data starts.

    Layout: 8 bytes little-endian u64 header length N, N bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, then the data.
    """
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return header, 8 + n


def _read_safetensors(path, where):
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError(f"{where}: reading .safetensors files needs the 'safetensors' package; "
                          "install it with pip install 'numpytfmr[hf]' (or pip install "
                          "safetensors)") from None
    header, start = _safetensors_header(path)
    tensors = {}
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            entry = header[name]
            if entry["dtype"] != "BF16":
                tensors[name] = f.get_tensor(name)
                continue
            # NumPy has no bfloat16: it is the top 16 bits of a float32, so shifting them up
            # 16 bits gives the same number exactly
            begin, end = entry["data_offsets"]
            raw = np.fromfile(path, dtype="<u2", count=(end - begin) // 2, offset=start + begin)
            tensors[name] = (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])
    return tensors


def load_hf_checkpoint(directory, *, dtype=None):
    """Load a local GPT-2 or LLaMA checkpoint: ``(params, config)`` as :func:`gpt_from_hf`.

    directory: a folder written by ``save_pretrained``, holding ``config.json`` and the
               weights as ``model.safetensors``, or sharded as
               ``model.safetensors.index.json`` + the shards it lists. bfloat16 weights
               are read exactly (as float32).
    dtype:     as in :func:`gpt_from_hf`

    Reading needs the optional package ``safetensors`` (``pip install 'numpytfmr[hf]'``);
    PyTorch ``.bin`` pickles are not read.
    """
    where = "load_hf_checkpoint"
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"{where}: directory is a {type(directory).__name__}; expected a path")
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{where}: directory {directory!r} does not exist or is not a "
                                "folder; expected a local checkpoint folder (config.json + "
                                "model.safetensors)")
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{where}: {config_path!r} not found; expected the checkpoint's "
                                "config.json")
    with open(config_path, encoding="utf-8") as f:
        hf_config = json.load(f)

    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        files = [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
    else:
        found = sorted(os.listdir(directory))
        raise FileNotFoundError(f"{where}: {directory!r} has no model.safetensors nor "
                                f"model.safetensors.index.json (found {found}); expected "
                                "safetensors weights (save_pretrained(..., "
                                "safe_serialization=True))")
    state_dict = {}
    for path in files:
        state_dict.update(_read_safetensors(path, where))
    return gpt_from_hf(state_dict, hf_config, dtype=dtype)


# ------------------------- numpytfmr -> transformers: the same table, read the other way

# numpytfmr's FFN activation -> GPT-2's activation_function: the table above read backwards,
# the first name listed for each winning ("gelu_tanh" -> "gelu_new")
_GPT2_ACTIVATION_NAMES = {ours: hf for hf, ours in reversed(list(_GPT2_ACTIVATIONS.items()))}


def _family(c, where):
    """``"gpt2"`` or ``"llama"``: the transformers model that computes exactly this
    config's function, or a ValueError naming the first field that has no counterpart.

    Learned positions make a GPT-2 (LayerNorm, biases, GELU/tanh-GELU/ReLU, MHA); RoPE
    makes a LLaMA (RMSNorm, SwiGLU, no biases, any GQA).
    """
    def refuse(field, why):
        raise ValueError(f"{where}: config.{field} is {getattr(c, field)!r}; {why}")

    if c.norm != "pre":
        refuse("norm", "transformers' GPT-2 and LLaMA are pre-norm (004 eq. 30); a post-norm "
               "model (004 eq. 31) has no counterpart there")
    if c.positional == "learned":
        if c.norm_type != "layernorm":
            refuse("norm_type", "learned positions make a GPT-2, whose norms are LayerNorms; "
                   "RMSNorm needs the LLaMA style (positional='rope', activation='swiglu', "
                   "bias=False)")
        if c.activation not in _GPT2_ACTIVATION_NAMES:
            refuse("activation", "GPT-2's activation_function offers gelu_new (our "
                   "'gelu_tanh'), gelu and relu; SwiGLU needs the LLaMA style "
                   "(positional='rope', norm_type='rmsnorm')")
        if not c.bias:
            refuse("bias", "GPT-2's linear layers and LayerNorms all have biases; a GPT-2-style "
                   "export needs bias=True")
        if c.n_kv_heads != c.n_heads:
            refuse("n_kv_heads", f"GPT-2 has one key/value head per query head (n_heads="
                   f"{c.n_heads}); grouped key/value heads need the LLaMA style "
                   "(positional='rope')")
        return "gpt2"
    if c.positional == "rope":
        if c.norm_type != "rmsnorm":
            refuse("norm_type", "RoPE makes a LLaMA, whose norms are RMSNorms (transformers' "
                   "LLaMA has no LayerNorm option)")
        if c.activation != "swiglu":
            refuse("activation", "RoPE makes a LLaMA, whose FFN is SwiGLU (hidden_act 'silu'); "
                   "a GELU or ReLU FFN with RoPE has no counterpart in transformers' GPT-2 or "
                   "LLaMA")
        return "llama"
    refuse("positional", "transformers' GPT-2 learns its positions ('learned') and LLaMA "
           "rotates them ('rope'); neither adds fixed sinusoidal positions")


def _scaling_field(s, *names):
    """A field of a ``rope_scaling`` dict under either of its spellings (ours or HF's)."""
    return next((s[n] for n in names if n in s), None)


def _interleaved_as_half(params, c, notes):
    """RoPE's "interleaved" pairs (2j, 2j+1) (the notes, 003 §7.3) as LLaMA's "half" pairs
    (j, j + d_head/2), the same rotation by alpha_j once the columns of W_q and W_k are
    reordered within each head: q'_j = q_2j, q'_(j + d_head/2) = q_(2j+1). Queries and
    keys move together, so every score q . k is unchanged."""
    if c.rope_layout == "half":
        return params, c
    dh = c.d_head
    within = np.concatenate([np.arange(0, dh, 2), np.arange(1, dh, 2)])   # new column <- old
    out = dict(params)
    for l in range(c.n_layers):
        for W, heads in (("Wq", c.n_heads), ("Wk", c.n_kv_heads)):
            columns = (dh * np.arange(heads)[:, None] + within).ravel()
            out[f"h{l}.attn.{W}"] = params[f"h{l}.attn.{W}"][:, columns]
    notes.append("rope_layout 'interleaved' is written as LLaMA's 'half' layout with the columns "
                 "of W_q and W_k reordered within each head; load_hf_checkpoint returns "
                 "rope_layout='half' and the reordered weights (the same model)")
    return out, replace(c, rope_layout="half")


def _ntk_as_base(c, notes):
    """NTK-aware scaling (003 §7.5) is a change of base, b' = b s^(d/(d-2)) with d = d_head:
    written as a plain RoPE with rope_theta b' (transformers' "dynamic" type differs)."""
    s = c.rope_scaling
    if s is None or _scaling_field(s, "type", "rope_type") != "ntk":
        return c
    d = c.d_head
    base = c.rope_base * _scaling_field(s, "factor") ** (d / (d - 2))
    notes.append(f"rope_scaling {s!r} is written as rope_theta {base!r} (NTK-aware scaling is "
                 "that change of base); load_hf_checkpoint returns rope_base "
                 f"{base!r} and rope_scaling None (the same frequencies)")
    return replace(c, rope_base=base, rope_scaling=None)


def _rope_parameters(c, where):
    """transformers' ``rope_parameters`` of this config (``_llama_rope`` reads them back)."""
    rope = {"rope_type": "default", "rope_theta": float(c.rope_base)}
    s = c.rope_scaling
    if s is None:
        return rope
    kind, factor = _scaling_field(s, "type", "rope_type"), float(_scaling_field(s, "factor"))
    if kind == "linear":
        return dict(rope, rope_type="linear", factor=factor)
    # yarn (ntk became a base in _ntk_as_base); the config checked the fields already
    L = int(_scaling_field(s, "original_max_positions", "original_max_position_embeddings"))
    extra = {k: float(s[k]) for k in ("beta_fast", "beta_slow") if k in s}
    extra.update({"truncate": bool(s["truncate"])} if "truncate" in s else {})
    low, high = yarn_correction_range(c.d_head, base=c.rope_base, original_max_positions=L, **extra)
    if high < low:
        raise ValueError(f"{where}: config.rope_scaling is {s!r}; its YaRN ramp is empty (planes "
                         f"{low} to {high}), where numpytfmr uses a step and transformers divides "
                         "by high - low < 0: no equivalent")
    return dict(rope, rope_type="yarn", factor=factor, original_max_position_embeddings=L,
                attention_factor=1.0, **extra)   # 1.0: no temperature on cos/sin (_llama_yarn)


def _hf_config_of(c, family, where, notes):
    """The ``config.json`` dict of this config (``gpt_config_from_hf`` reads it back)."""
    if family == "gpt2":
        # numpytfmr's dropout acts on the embeddings and the sublayer outputs: GPT-2's embd_pdrop
        # and resid_pdrop; numpytfmr has no dropout on the attention weights (attn_pdrop)
        if c.dropout:
            notes.append(f"dropout {c.dropout} is written as embd_pdrop and resid_pdrop (for "
                         "training in transformers); load_hf_checkpoint returns dropout 0")
        return {"architectures": [_ARCHITECTURES[family]], "model_type": "gpt2",
                "vocab_size": int(c.vocab_size), "n_positions": int(c.max_len),
                "n_embd": int(c.d_model), "n_layer": int(c.n_layers), "n_head": int(c.n_heads),
                "n_inner": int(c.d_ff), "activation_function": _GPT2_ACTIVATION_NAMES[c.activation],
                "layer_norm_epsilon": float(c.norm_eps),
                "tie_word_embeddings": bool(c.tie_embeddings),
                "embd_pdrop": float(c.dropout), "resid_pdrop": float(c.dropout), "attn_pdrop": 0.0,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "add_cross_attention": False}
    if c.dropout:
        notes.append(f"dropout {c.dropout} is not written: LLaMA has no dropout on embeddings or "
                     "sublayer outputs (only attention_dropout, on the weights, written as 0)")
    rope = _rope_parameters(c, where)
    legacy = None if rope["rope_type"] == "default" else \
        {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"architectures": [_ARCHITECTURES[family]], "model_type": "llama",
            "vocab_size": int(c.vocab_size), "hidden_size": int(c.d_model),
            "intermediate_size": int(c.d_ff), "num_hidden_layers": int(c.n_layers),
            "num_attention_heads": int(c.n_heads), "num_key_value_heads": int(c.n_kv_heads),
            "head_dim": int(c.d_head), "hidden_act": "silu",
            "max_position_embeddings": int(c.max_len), "rms_norm_eps": float(c.norm_eps),
            "tie_word_embeddings": bool(c.tie_embeddings), "attention_bias": False,
            "mlp_bias": False, "attention_dropout": 0.0,
            # transformers >= 5 reads rope_parameters; older versions rope_theta + rope_scaling
            "rope_parameters": rope, "rope_theta": rope["rope_theta"], "rope_scaling": legacy}


def _export(params, config, dtype, where):
    """``(state_dict, hf_config, family, notes)`` of a numpytfmr model."""
    c, _ = check_model(params, config, GPTConfig, gpt_param_shapes, where)
    dt = _out_dtype(params.values(), dtype, where)   # None: the parameters' own dtype
    family, notes = _family(c, where), []
    if family == "llama":
        params, c = _interleaved_as_half(params, c, notes)
        c = _ntk_as_base(c, notes)
    hf_config = _hf_config_of(c, family, where, notes)
    hf_config.update(bos_token_id=None, eos_token_id=None, pad_token_id=None, dtype=dt.name)
    state_dict = {}
    for key, _, layout, ours in _plan(c, family):
        to_hf = _LAYOUTS[layout][1]
        name = key if key == "lm_head.weight" else _PREFIXES[family] + key
        state_dict[name] = np.array(to_hf([params[k] for k in ours]), dtype=dt, order="C",
                                    copy=True)
    return state_dict, hf_config, family, notes


def gpt_to_hf(params, config, *, dtype=None):
    """The Hugging Face form of a numpytfmr GPT: ``(state_dict, hf_config)``, the inverse
    of :func:`gpt_from_hf` (one key table serves both).

    params, config: a pre-norm GPT (``gpt_param_shapes(config)``) of GPT-2 or LLaMA style
                    (module docstring)
    dtype:          None (the parameters' dtype), np.float32 or np.float64
    returns:        ``state_dict``: ``{name: array}`` with the names and layouts
                    ``save_pretrained`` writes for ``GPT2LMHeadModel`` /
                    ``LlamaForCausalLM`` (new C-ordered arrays; a tied output layer is
                    the token table, not a second tensor), and ``hf_config``: the
                    ``config.json`` dict.

    RoPE's "interleaved" layout and NTK scaling are written in an equivalent form
    (``_interleaved_as_half``, ``_ntk_as_base``); a config transformers cannot compute is a
    ValueError naming the field, its value and why (``_family``; docs/learner.md).
    """
    state_dict, hf_config, _, _ = _export(params, config, dtype, "gpt_to_hf")
    return state_dict, hf_config


# -------------------------------------------------------- Writing a checkpoint directory

_SAFETENSORS_DTYPES = {"f4": "F32", "f8": "F64"}   # dtype kind + item size -> code


def _write_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def _write_safetensors(path, tensors):
    """A ``.safetensors`` file in NumPy (the layout :func:`_safetensors_header` reads):
    u64 little-endian header length N, N bytes of JSON ``{name: {"dtype", "shape",
    "data_offsets": [begin, end]}, "__metadata__": {"format": "pt"}}`` padded with
    spaces to a multiple of 8, then every tensor's little-endian C-order bytes, back to
    back. (transformers refuses a file without the "pt" format tag.)"""
    header, data, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        header[name] = {"dtype": _SAFETENSORS_DTYPES[f"{a.dtype.kind}{a.dtype.itemsize}"],
                        "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        data.append(memoryview(a).cast("B"))
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with atomic_file(path) as f:
        for chunk in [len(text).to_bytes(8, "little"), text] + data:
            f.write(chunk)


def _new_folder(parent, name):
    """A new empty folder ``.tmp-<random>-<name>`` in ``parent`` (the mode the umask gives)."""
    for _ in range(100):
        path = os.path.join(parent, f".tmp-{secrets.token_hex(6)}-{name}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"save_hf_checkpoint: no free temporary name in {parent}")


def _target(directory, force, where):
    """The absolute path of the export folder: new, empty, or (force) replaceable."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"{where}: directory is a {type(directory).__name__}; expected a path")
    flag(force, "force", where)
    directory = os.path.abspath(os.fspath(directory))
    if os.path.islink(directory) or (os.path.exists(directory) and not os.path.isdir(directory)):
        raise FileExistsError(f"{where}: {directory!r} exists and is not a folder (a file or a "
                              "symbolic link); expected a new or empty folder")
    if os.path.isdir(directory) and os.listdir(directory) and not force:
        found = sorted(os.listdir(directory))
        raise FileExistsError(f"{where}: {directory!r} is not empty (it holds {found[:5]}"
                              f"{' ...' if len(found) > 5 else ''}); expected a new or empty "
                              "folder, or force=True to replace it and everything in it")
    return directory


def _move_into_place(tmp, directory):
    """Rename the finished folder to ``directory``: it appears whole or not at all. An old
    folder is moved aside first and deleted once the new one is in place."""
    if os.path.isdir(directory) and not os.listdir(directory):
        os.rmdir(directory)
    if not os.path.exists(directory):
        os.rename(tmp, directory)
        return
    old = os.path.join(os.path.dirname(directory),
                       f".old-{secrets.token_hex(6)}-{os.path.basename(directory)}")
    os.rename(directory, old)
    try:
        os.rename(tmp, directory)
    except BaseException:
        os.rename(old, directory)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _write_gpt2_bpe(tokenizer, folder, c, where):
    """vocab.json + merges.txt (the tokenizer's ``save_gpt2_files``) and a
    tokenizer_config.json that makes ``AutoTokenizer`` a ``GPT2Tokenizer`` with the
    special tokens kept whole. Returns the token ids for config.json."""
    tokenizer.save_gpt2_files(folder)
    for name in ("vocab.json", "merges.txt"):
        if not os.path.isfile(os.path.join(folder, name)):
            raise ValueError(f"{where}: tokenizer.save_gpt2_files wrote no {name}; expected "
                             "GPT-2's vocab.json and merges.txt")
    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    _check_tokenizer_size(max(vocab.values()) + 1, c, where)
    specials = [s for s in getattr(tokenizer, "special_tokens", None) or () if s in vocab]
    end = "<|endoftext|>" if "<|endoftext|>" in specials else None   # GPT-2's bos = eos
    _write_json(os.path.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "GPT2Tokenizer", "model_max_length": int(c.max_len),
        "add_prefix_space": False, "add_bos_token": False, "errors": "replace",
        "clean_up_tokenization_spaces": False, "bos_token": end, "eos_token": end,
        "unk_token": None, "pad_token": None,
        "added_tokens_decoder": {str(vocab[s]): _added_token(s) for s in specials}})
    end_id = None if end is None else vocab[end]
    return "GPT2Tokenizer", {"bos_token_id": end_id, "eos_token_id": end_id, "pad_token_id": None}


def _added_token(content):
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def _check_tokenizer_size(n, c, where):
    if n > c.vocab_size:
        raise ValueError(f"{where}: the tokenizer has {n} tokens but config.vocab_size is "
                         f"{c.vocab_size}; expected the tokenizer the model was trained with")


def _write_wordlevel(tokenizer, folder, c, where):
    """A CharTokenizer or WordTokenizer as a ``tokenizers`` tokenizer.json: a WordLevel model
    (token -> id, the same ids), the four special tokens as added tokens (never split),
    and a pre-tokenizer that cuts the text as ``encode`` does: every character
    (``Split`` on the regex ``[\\s\\S]``, decoded by ``Fuse``, which joins the pieces) or
    every whitespace-separated word (``WhitespaceSplit``; decoding joins with spaces). An
    unknown character or word is an error there too (the model's "<unk>" is no token)."""
    _check_tokenizer_size(tokenizer.vocab_size, c, where)
    tokens, n_special = tokenizer.tokens, len(SPECIAL_TOKENS)
    if isinstance(tokenizer, CharTokenizer):
        split = {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated",
                 "invert": False}
        decoder = {"type": "Fuse"}
    else:
        split, decoder = {"type": "WhitespaceSplit"}, None
    _write_json(os.path.join(folder, "tokenizer.json"), {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [dict(_added_token(t), id=i) for i, t in enumerate(tokens[:n_special])],
        "normalizer": None, "pre_tokenizer": split, "post_processor": None, "decoder": decoder,
        "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(tokens)},
                  "unk_token": "<unk>"}})
    pad, bos, eos, sep = SPECIAL_TOKENS
    _write_json(os.path.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(c.max_len),
        "clean_up_tokenization_spaces": False, "pad_token": pad, "bos_token": bos,
        "eos_token": eos, "sep_token": sep})
    return "PreTrainedTokenizerFast", {"bos_token_id": tokenizer.bos_id,
                                       "eos_token_id": tokenizer.eos_id,
                                       "pad_token_id": tokenizer.pad_id}


def _tokenizer_writer(tokenizer, where, notes):
    """The function that writes this tokenizer's files, or None (with a note why)."""
    if tokenizer is None:
        return None
    if callable(getattr(tokenizer, "save_gpt2_files", None)):
        return _write_gpt2_bpe
    if isinstance(tokenizer, (CharTokenizer, WordTokenizer)):
        return _write_wordlevel
    notes.append(f"tokenizer: a {type(tokenizer).__name__} has no transformers form here "
                 "(expected a BPE tokenizer with save_gpt2_files, a CharTokenizer or a "
                 "WordTokenizer); no tokenizer files were written")
    warnings.warn(f"{where}: {notes[-1]}", stacklevel=3)
    return None


def save_hf_checkpoint(params, config, directory, *, tokenizer=None, dtype=None, force=False):
    """Write a numpytfmr GPT as a Hugging Face checkpoint folder, which
    ``transformers.AutoModelForCausalLM.from_pretrained(directory)`` loads as a
    ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` with the same logits, and
    :func:`load_hf_checkpoint` reads back exactly (the same parameters, bit for bit, and an
    equal config; the exceptions are the notes below).

    params, config: the model; which configs map and how: :func:`gpt_to_hf`
    directory:      the folder to create; it must be new or empty unless ``force``
    tokenizer:      None, or the tokenizer the model was trained with, written so that
                    ``AutoTokenizer.from_pretrained(directory)`` gives the same ids: a BPE
                    tokenizer (``_write_gpt2_bpe``) or a CharTokenizer / WordTokenizer
                    (``_write_wordlevel``); others are skipped with a note and a warning.
    dtype:          None (the parameters' dtype), np.float32 or np.float64
    force:          replace an existing non-empty folder and everything in it

    Files: config.json, model.safetensors (written in NumPy) and the tokenizer's, written to
    a new folder beside ``directory`` that is then renamed into place. Returns a dict:
    ``directory`` (absolute), ``files``, ``model_type`` ("gpt2" or "llama"),
    ``architecture``, ``dtype``, ``tensors`` (their count), ``tokenizer`` (the transformers
    class, or None) and ``notes``: what was written in another but equivalent form (RoPE's
    interleaved layout, NTK scaling), a dropout that load_hf_checkpoint returns as 0, a
    tokenizer that was skipped.
    """
    where = "save_hf_checkpoint"
    state_dict, hf_config, family, notes = _export(params, config, dtype, where)
    directory = _target(directory, force, where)
    write_tokenizer = _tokenizer_writer(tokenizer, where, notes)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = _new_folder(parent, os.path.basename(directory))
    try:
        tokenizer_class = None
        if write_tokenizer is not None:
            tokenizer_class, ids = write_tokenizer(tokenizer, tmp, config, where)
            hf_config.update(ids)
        _write_json(os.path.join(tmp, "config.json"), hf_config)
        _write_safetensors(os.path.join(tmp, "model.safetensors"), state_dict)
        _move_into_place(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"directory": directory, "files": sorted(os.listdir(directory)),
            "model_type": family, "architecture": _ARCHITECTURES[family],
            "dtype": hf_config["dtype"], "tensors": len(state_dict),
            "tokenizer": tokenizer_class, "notes": notes}
