"""Real architectures: GPT-2 and LLaMA checkpoints of Hugging Face ``transformers`` as
numpytfmr parameters.

Both are the decoder-only model of ``gpt.py`` (004 "Transformer Decoder", pre-norm
eq. 30) with different options:

    GPT-2:  learned positions (004 eq. 12), LayerNorm with bias, FFN with the tanh GELU,
            biases everywhere, output layer tied to the token table
    LLaMA:  RoPE in the "half" layout inside attention (003 §7.3), RMSNorm, the SwiGLU
            FFN (silu(x W_gate) * (x W_up)) W_down, no biases, GQA (003 §5.2), an
            untied output layer (unless tie_word_embeddings)

:func:`gpt_config_from_hf` reads the ``config.json`` dict, :func:`gpt_from_hf` converts a
state dict of NumPy arrays, and :func:`load_hf_checkpoint` does both for a local
directory written by ``save_pretrained`` (``config.json`` + ``model.safetensors``). Nothing
here touches the network.

Converting the weights is bookkeeping, with one rule: numpytfmr computes ``y = x W``
with ``W`` of shape (d_in, d_out).

* GPT-2 stores its projections as ``Conv1D`` modules whose weight is already
  (d_in, d_out); ``c_attn`` holds ``[Wq | Wk | Wv]`` side by side and is split in three.
* LLaMA's ``nn.Linear`` computes ``x W^T`` with a weight of shape (d_out, d_in), so each
  weight is transposed.
* LLaMA rotates the query/key pairs ``(j, j + d_head/2)`` (``rotate_half``; its
  conversion script permuted the original rows for that). numpytfmr's
  ``rope_layout="half"`` uses the same pairs, so no permutation is needed.

Keys (module docstring of ``gpt.py`` for ours)::

    GPT-2 (prefix "transformer." optional)      numpytfmr
    wte.weight, wpe.weight                      wte, wpe
    h.{l}.ln_1.weight / .bias                   h{l}.attn_norm.gamma / .beta
    h.{l}.attn.c_attn.weight / .bias            h{l}.attn.Wq, .Wk, .Wv / .bq, .bk, .bv
    h.{l}.attn.c_proj.weight / .bias            h{l}.attn.Wo / .bo
    h.{l}.ln_2.weight / .bias                   h{l}.mlp_norm.gamma / .beta
    h.{l}.mlp.c_fc.weight / .bias               h{l}.mlp.W1 / .b1
    h.{l}.mlp.c_proj.weight / .bias             h{l}.mlp.W2 / .b2
    ln_f.weight / .bias                         norm_f.gamma / .beta

    LLaMA (prefix "model." optional)            numpytfmr
    embed_tokens.weight                         wte
    layers.{l}.input_layernorm.weight           h{l}.attn_norm.gamma
    layers.{l}.self_attn.{q,k,v,o}_proj.weight  h{l}.attn.Wq, .Wk, .Wv, .Wo   (transposed)
    layers.{l}.post_attention_layernorm.weight  h{l}.mlp_norm.gamma
    layers.{l}.mlp.{gate,up,down}_proj.weight   h{l}.mlp.W_gate, .W_up, .W_down (transposed)
    norm.weight                                 norm_f.gamma
    lm_head.weight                              lm_head.W (transposed; untied only)
"""
import json
import os

import numpy as np

from ..gpt import GPTConfig, gpt_param_shapes

__all__ = ["gpt_config_from_hf", "gpt_from_hf", "load_hf_checkpoint"]

MODEL_TYPES = ("gpt2", "llama")

# GPT-2's activation_function -> our FFN activation. "gelu_new", "gelu_fast" and
# "gelu_pytorch_tanh" are all x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
                     "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}

# Buffers (not parameters) that older checkpoints carry: the causal mask of GPT-2's
# attention and LLaMA's precomputed RoPE frequencies. They hold no learned value.
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


# ---------------------------------------------------------------------------------------
# config.json -> GPTConfig
# ---------------------------------------------------------------------------------------

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
    raise ValueError(f"{where}: RoPE scaling of type {kind!r} is not supported; expected "
                     "'default' or 'linear' (dynamic NTK, YaRN with its attention factor, llama3 "
                     "and longrope differ from numpytfmr's rope_frequencies)")


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

    ``model_type`` picks the family. GPT-2: learned positions, LayerNorm
    (``layer_norm_epsilon``), ``activation_function`` "gelu_new" -> "gelu_tanh", biases,
    tied output layer. LLaMA: RoPE with ``rope_layout="half"`` and base ``rope_theta``,
    RMSNorm (``rms_norm_eps``), activation "swiglu", no biases, ``num_key_value_heads``
    (GQA), ``tie_word_embeddings``. Dropout is 0 (the config of a trained model).

    A config numpytfmr cannot reproduce exactly is a ValueError naming the field: other
    model types, RoPE scalings other than "linear", LLaMA with biases, GPT-2 with
    cross-attention or per-layer attention scaling, ...
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


# ---------------------------------------------------------------------------------------
# state dict -> params
# ---------------------------------------------------------------------------------------

def _strip_prefix(state_dict, prefix):
    """Keys without the prefix of the ``...ForCausalLM`` wrapper (``transformer.``/``model.``),
    so the bare ``GPT2Model``/``LlamaModel`` state dicts read the same way."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): a for k, a in state_dict.items()}


def _gpt2_plan(c):
    """(hf key, expected hf shape, function hf array -> {our key: array}) for every weight."""
    d, dff = c.d_model, c.d_ff
    plan = [("wte.weight", (c.vocab_size, d), lambda a: {"wte": a}),
            ("wpe.weight", (c.max_len, d), lambda a: {"wpe": a})]

    def split3(names):
        # c_attn computes [Q | K | V] in one matmul: columns 0..d-1 are Q, then K, then V
        return lambda a: {n: a[..., i * d:(i + 1) * d] for i, n in enumerate(names)}

    for l in range(c.n_layers):
        h, p = f"h.{l}.", f"h{l}."
        plan += [
            (h + "ln_1.weight", (d,), lambda a, p=p: {p + "attn_norm.gamma": a}),
            (h + "ln_1.bias", (d,), lambda a, p=p: {p + "attn_norm.beta": a}),
            (h + "attn.c_attn.weight", (d, 3 * d), split3([p + "attn.Wq", p + "attn.Wk", p + "attn.Wv"])),
            (h + "attn.c_attn.bias", (3 * d,), split3([p + "attn.bq", p + "attn.bk", p + "attn.bv"])),
            (h + "attn.c_proj.weight", (d, d), lambda a, p=p: {p + "attn.Wo": a}),
            (h + "attn.c_proj.bias", (d,), lambda a, p=p: {p + "attn.bo": a}),
            (h + "ln_2.weight", (d,), lambda a, p=p: {p + "mlp_norm.gamma": a}),
            (h + "ln_2.bias", (d,), lambda a, p=p: {p + "mlp_norm.beta": a}),
            (h + "mlp.c_fc.weight", (d, dff), lambda a, p=p: {p + "mlp.W1": a}),
            (h + "mlp.c_fc.bias", (dff,), lambda a, p=p: {p + "mlp.b1": a}),
            (h + "mlp.c_proj.weight", (dff, d), lambda a, p=p: {p + "mlp.W2": a}),
            (h + "mlp.c_proj.bias", (d,), lambda a, p=p: {p + "mlp.b2": a}),
        ]
    plan += [("ln_f.weight", (d,), lambda a: {"norm_f.gamma": a}),
             ("ln_f.bias", (d,), lambda a: {"norm_f.beta": a})]
    return plan


def _llama_plan(c):
    d, dff, hd, kvd = c.d_model, c.d_ff, c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    T = lambda key: (lambda a: {key: a.T})   # noqa: E731  nn.Linear weight (out, in) -> W (in, out)
    plan = [("embed_tokens.weight", (c.vocab_size, d), lambda a: {"wte": a})]
    for l in range(c.n_layers):
        h, p = f"layers.{l}.", f"h{l}."
        plan += [
            (h + "input_layernorm.weight", (d,), lambda a, p=p: {p + "attn_norm.gamma": a}),
            (h + "self_attn.q_proj.weight", (hd, d), T(p + "attn.Wq")),
            (h + "self_attn.k_proj.weight", (kvd, d), T(p + "attn.Wk")),
            (h + "self_attn.v_proj.weight", (kvd, d), T(p + "attn.Wv")),
            (h + "self_attn.o_proj.weight", (d, hd), T(p + "attn.Wo")),
            (h + "post_attention_layernorm.weight", (d,), lambda a, p=p: {p + "mlp_norm.gamma": a}),
            (h + "mlp.gate_proj.weight", (dff, d), T(p + "mlp.W_gate")),
            (h + "mlp.up_proj.weight", (dff, d), T(p + "mlp.W_up")),
            (h + "mlp.down_proj.weight", (d, dff), T(p + "mlp.W_down")),
        ]
    plan.append(("norm.weight", (d,), lambda a: {"norm_f.gamma": a}))
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
    sd = _strip_prefix(state_dict, "transformer." if family == "gpt2" else "model.")
    plan = _gpt2_plan(config) if family == "gpt2" else _llama_plan(config)
    if not config.tie_embeddings:
        plan.append(("lm_head.weight", (config.vocab_size, config.d_model),
                     lambda a: {"lm_head.W": a.T}))    # logits = x W_out, W_out = lm_head^T

    missing = [k for k, _, _ in plan if k not in sd]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ValueError(f"{where}: state_dict has no {missing[:5]}{more}; expected every weight "
                         f"of a {family} model with this config")
    used = {k for k, _, _ in plan}
    extra = [k for k in sd if k not in used and not k.endswith(_BUFFER_SUFFIXES)
             and not (k == "lm_head.weight" and config.tie_embeddings)]
    if extra:
        raise ValueError(f"{where}: state_dict has unexpected keys {extra[:5]}; they are not part "
                         f"of a {family} model with this config")

    arrays = {k: _read_array(sd, k, where) for k in used}
    dt = _out_dtype(arrays.values(), dtype, where)
    params = {}
    for key, shape, convert in plan:
        a = arrays[key]
        if a.shape != shape:
            raise ValueError(f"{where}: state_dict[{key!r}] has shape {a.shape}; expected {shape} "
                             "for this config")
        for ours, value in convert(a).items():
            params[ours] = np.array(value, dtype=dt, order="C", copy=True)   # never a view
    if config.tie_embeddings and "lm_head.weight" in sd:
        head, table = _read_array(sd, "lm_head.weight", where), arrays[plan[0][0]]  # plan[0]: wte
        if head.shape != table.shape or not np.array_equal(head, table):
            raise ValueError(f"{where}: tie_word_embeddings is true but state_dict['lm_head.weight'] "
                             "differs from the token embedding table; expected the tied copy")
    assert set(params) == set(gpt_param_shapes(config))   # the plan covers every parameter
    return params, config


# ---------------------------------------------------------------------------------------
# A checkpoint directory (config.json + safetensors)
# ---------------------------------------------------------------------------------------

def _safetensors_numpy(where):
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError(f"{where}: reading .safetensors files needs the 'safetensors' package; "
                          "install it with pip install 'numpytfmr[hf]' (or pip install "
                          "safetensors)") from None
    return safe_open


def _safetensors_header(path):
    """The JSON header of a .safetensors file and where its data starts.

    Layout: 8 bytes little-endian u64 header length N, N bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, then the data.
    """
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return header, 8 + n


def _read_bf16(path, name):
    """A bfloat16 tensor (NumPy has no such dtype) as float32: bfloat16 is the top 16 bits
    of a float32, so shifting them up 16 bits gives the same number exactly."""
    header, start = _safetensors_header(path)
    entry = header[name]
    begin, end = entry["data_offsets"]
    raw = np.fromfile(path, dtype="<u2", count=(end - begin) // 2, offset=start + begin)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _read_safetensors(path, where):
    safe_open = _safetensors_numpy(where)
    header, _ = _safetensors_header(path)
    tensors = {}
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            if header[name]["dtype"] == "BF16":
                tensors[name] = _read_bf16(path, name)
            else:
                tensors[name] = f.get_tensor(name)
    return tensors


def load_hf_checkpoint(directory, *, dtype=None):
    """Load a local GPT-2 or LLaMA checkpoint: ``(params, config)`` as :func:`gpt_from_hf`.

    directory: a folder written by ``save_pretrained``, holding ``config.json`` and the
               weights as ``model.safetensors``, or sharded as
               ``model.safetensors.index.json`` + the shards it lists. bfloat16 weights
               are read exactly (as float32).
    dtype:     as in :func:`gpt_from_hf`

    Only local files are read (nothing is downloaded). Reading safetensors needs the
    optional package ``safetensors`` (``pip install 'numpytfmr[hf]'``); PyTorch
    ``.bin`` pickles are not read.
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
