"""Real architectures: SiLU and the SwiGLU FFN, the LLaMA options of GPTConfig, and GPT-2 /
LLaMA checkpoints of Hugging Face transformers converted with gpt_from_hf and
load_hf_checkpoint -- the same logits, gradients and greedy tokens as transformers.

The transformers models are tiny, randomly initialised from configs written here
(nothing is downloaded). The tests that need torch/transformers/safetensors skip
without them.
"""
import json
import os
import sys

import numpy as np
import pytest

from numpytfmr.activations import silu_backward, silu_forward
from numpytfmr.ffn import swiglu_ffn_backward, swiglu_ffn_forward
from numpytfmr.gpt import GPTConfig, generate, gpt_forward, gpt_loss, gpt_param_shapes
from numpytfmr.gradcheck import check_gradients, rel_error
from numpytfmr.run.hf import gpt_config_from_hf, gpt_from_hf, load_hf_checkpoint


# ---------------------------------------------------------------------------------------
# SiLU and SwiGLU
# ---------------------------------------------------------------------------------------

def test_silu_closed_form_and_tails():
    x = np.array([-800.0, -40.0, -1.0, 0.0, 0.5, 40.0, 800.0])
    out, cache = silu_forward(x)
    with np.errstate(over="ignore"):
        expected = x / (1.0 + np.exp(-x))       # the textbook form, fine away from overflow
    assert np.allclose(out[1:-1], expected[1:-1], rtol=1e-15, atol=0)
    assert out[0] == 0.0 and out[-1] == 800.0 and out[3] == 0.0
    # silu'(x) = s (1 + x (1 - s)): 1/2 at 0, -> 0 at -inf, -> 1 at +inf, never NaN
    dx = silu_backward(np.ones_like(x), cache)
    assert np.all(np.isfinite(dx))
    assert dx[3] == 0.5 and dx[0] == 0.0 and dx[-1] == 1.0
    s = 1.0 / (1.0 + np.exp(-x[2]))
    assert np.isclose(dx[2], s * (1.0 + x[2] * (1.0 - s)), rtol=1e-15)


def test_silu_keeps_float32():
    x = np.linspace(-5, 5, 11, dtype=np.float32)
    out, cache = silu_forward(x)
    assert out.dtype == np.float32 and silu_backward(np.ones_like(x), cache).dtype == np.float32


def _swiglu_args(rng, lead=(2, 3), d=7, d_ff=11, d_out=5):
    return (rng.standard_normal(lead + (d,)), rng.standard_normal((d, d_ff)) / np.sqrt(d),
            rng.standard_normal((d, d_ff)) / np.sqrt(d), rng.standard_normal((d_ff, d_out)))


def test_swiglu_ffn_is_the_formula_and_its_gradients_check():
    rng = np.random.default_rng(0)
    x, Wg, Wu, Wd = _swiglu_args(rng)
    out, _ = swiglu_ffn_forward(x, Wg, Wu, Wd)
    g = x @ Wg
    expected = (g / (1.0 + np.exp(-g)) * (x @ Wu)) @ Wd
    assert np.allclose(out, expected, rtol=1e-13, atol=1e-14)
    res = check_gradients(swiglu_ffn_forward, swiglu_ffn_backward, (x, Wg, Wu, Wd))
    assert res.passed and max(res.errors.values()) <= 1e-7, str(res)


@pytest.mark.parametrize("args, message", [
    (lambda a: (a[0][..., :6],) + a[1:], "swiglu_ffn_forward: x has shape (2, 3, 6)"),
    (lambda a: (a[0], a[1], a[2][:, :10], a[3]), "swiglu_ffn_forward: W_up has shape (7, 10)"),
    (lambda a: a[:3] + (a[3][:10],), "swiglu_ffn_forward: W_down has shape (10, 5)"),
])
def test_swiglu_ffn_shape_errors_name_the_argument(args, message):
    a = _swiglu_args(np.random.default_rng(1))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        swiglu_ffn_forward(*args(a))


# ---------------------------------------------------------------------------------------
# GPTConfig with the LLaMA options (no transformers needed)
# ---------------------------------------------------------------------------------------

LLAMA_LIKE = dict(vocab_size=11, n_layers=2, d_model=8, n_heads=4, n_kv_heads=2, d_ff=6,
                  positional="rope", rope_layout="half", rope_base=100.0, norm_type="rmsnorm",
                  activation="swiglu", bias=False, tie_embeddings=False, norm_eps=1e-6)


def test_swiglu_config_keys_and_bias_error():
    shapes = gpt_param_shapes(GPTConfig(**LLAMA_LIKE))
    assert shapes["h1.mlp.W_gate"] == (8, 6) and shapes["h1.mlp.W_up"] == (8, 6)
    assert shapes["h1.mlp.W_down"] == (6, 8)
    assert not any(k.endswith(("W1", "W2", ".b1", ".b2", ".beta", ".bq")) for k in shapes)
    with pytest.raises(ValueError, match="GPTConfig: activation is 'swiglu' and bias is True"):
        GPTConfig(**{**LLAMA_LIKE, "bias": True})


def test_llama_like_gpt_gradients_match_finite_differences():
    """Directional derivatives of the loss along random directions over all parameters."""
    config = GPTConfig(**LLAMA_LIKE)
    rng = np.random.default_rng(3)
    params = {k: (1.0 + 0.3 * rng.standard_normal(s)) if k.endswith("gamma")
              else rng.standard_normal(s) / np.sqrt(s[0]) for k, s in gpt_param_shapes(config).items()}
    ids = rng.integers(0, 11, size=(2, 5))
    targets = rng.integers(0, 11, size=(2, 5))
    _, grads = gpt_loss(params, ids, targets, config=config)
    h = 1e-4
    for _ in range(3):
        direction = {k: rng.standard_normal(a.shape) for k, a in params.items()}
        shifted = lambda t: {k: a + t * direction[k] for k, a in params.items()}  # noqa: E731
        f = lambda t: gpt_loss(shifted(t), ids, targets, config=config)[0]  # noqa: E731
        numeric = (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)
        analytic = sum(np.sum(grads[k] * direction[k]) for k in params)
        assert abs(numeric - analytic) <= 1e-7 * max(1.0, abs(analytic))


# ---------------------------------------------------------------------------------------
# Config conversion and its errors (plain dicts, no transformers needed)
# ---------------------------------------------------------------------------------------

GPT2_JSON = dict(model_type="gpt2", vocab_size=29, n_embd=12, n_layer=2, n_head=3,
                 n_positions=16, n_inner=20, activation_function="gelu_new",
                 layer_norm_epsilon=1e-5, tie_word_embeddings=True)
LLAMA_JSON = dict(model_type="llama", vocab_size=31, hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=20,
                  max_position_embeddings=64, rms_norm_eps=1e-5, hidden_act="silu",
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False)


def test_configs_map_to_the_two_families():
    g = gpt_config_from_hf(GPT2_JSON)
    assert (g.positional, g.norm, g.norm_type, g.activation, g.bias, g.tie_embeddings) == \
        ("learned", "pre", "layernorm", "gelu_tanh", True, True)
    assert (g.d_model, g.n_heads, g.n_kv_heads, g.d_ff, g.max_len) == (12, 3, 3, 20, 16)
    m = gpt_config_from_hf(LLAMA_JSON)
    assert (m.positional, m.rope_layout, m.rope_base, m.norm_type, m.norm_eps, m.activation) == \
        ("rope", "half", 500.0, "rmsnorm", 1e-5, "swiglu")
    assert (m.bias, m.tie_embeddings, m.n_heads, m.n_kv_heads, m.d_ff) == (False, False, 4, 2, 20)
    # the spelling of transformers < 5: rope_theta and rope_scaling at the top level
    old = {k: v for k, v in LLAMA_JSON.items() if k != "rope_parameters"}
    old.update(rope_theta=1234.0, rope_scaling={"type": "linear", "factor": 2.0})
    m = gpt_config_from_hf(old)
    assert m.rope_base == 1234.0 and m.rope_scaling == {"type": "linear", "factor": 2.0}


@pytest.mark.parametrize("change, error, message", [
    (dict(model_type="mistral"), ValueError, "model_type'] is 'mistral'"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
     ValueError, "RoPE scaling of type 'llama3' is not supported"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     ValueError, "RoPE scaling of type 'yarn'"),
    (dict(attention_bias=True), ValueError, "attention_bias'] is true"),
    (dict(mlp_bias=True), ValueError, "mlp_bias'] is true"),
    (dict(hidden_act="gelu"), ValueError, "hidden_act'] is 'gelu'"),
    (dict(head_dim=8), ValueError, "head_dim'] is 8"),
    (dict(hidden_size=None), ValueError, r"has no \['hidden_size'\]"),
    (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4}), ValueError,
     "type 'linear' has no 'factor'"),
])
def test_unsupported_llama_configs_are_value_errors(change, error, message):
    with pytest.raises(error, match=message):
        gpt_config_from_hf({**LLAMA_JSON, **change})


@pytest.mark.parametrize("change, message", [
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx'] is true"),
    (dict(scale_attn_weights=False), "scale_attn_weights'] is false"),
    (dict(add_cross_attention=True), "add_cross_attention'] is true"),
    (dict(activation_function="quick_gelu"), "activation_function'] is 'quick_gelu'"),
])
def test_unsupported_gpt2_configs_are_value_errors(change, message):
    with pytest.raises(ValueError, match=message):
        gpt_config_from_hf({**GPT2_JSON, **change})


def _fake_gpt2_state_dict(rng, prefix="transformer."):
    """A GPT-2 state dict in transformers' naming and layout, built by hand."""
    d, dff, V = 12, 20, 29
    sd = {"wte.weight": rng.standard_normal((V, d)), "wpe.weight": rng.standard_normal((16, d)),
          "ln_f.weight": rng.standard_normal(d), "ln_f.bias": rng.standard_normal(d)}
    for l in range(2):
        h = f"h.{l}."
        sd.update({h + "ln_1.weight": rng.standard_normal(d), h + "ln_1.bias": rng.standard_normal(d),
                   h + "attn.c_attn.weight": rng.standard_normal((d, 3 * d)),
                   h + "attn.c_attn.bias": rng.standard_normal(3 * d),
                   h + "attn.c_proj.weight": rng.standard_normal((d, d)),
                   h + "attn.c_proj.bias": rng.standard_normal(d),
                   h + "ln_2.weight": rng.standard_normal(d), h + "ln_2.bias": rng.standard_normal(d),
                   h + "mlp.c_fc.weight": rng.standard_normal((d, dff)),
                   h + "mlp.c_fc.bias": rng.standard_normal(dff),
                   h + "mlp.c_proj.weight": rng.standard_normal((dff, d)),
                   h + "mlp.c_proj.bias": rng.standard_normal(d),
                   h + "attn.bias": np.tril(np.ones((1, 1, 16, 16), dtype=bool))})   # a buffer
    return {prefix + k: a for k, a in sd.items()}


def test_gpt2_state_dict_layout_by_hand():
    rng = np.random.default_rng(0)
    sd = _fake_gpt2_state_dict(rng)
    before = {k: a.copy() for k, a in sd.items()}
    params, config = gpt_from_hf(sd, GPT2_JSON)
    assert set(params) == set(gpt_param_shapes(config))
    W = sd["transformer.h.1.attn.c_attn.weight"]
    assert np.array_equal(params["h1.attn.Wq"], W[:, :12])
    assert np.array_equal(params["h1.attn.Wk"], W[:, 12:24])
    assert np.array_equal(params["h1.attn.Wv"], W[:, 24:])
    assert np.array_equal(params["h1.attn.bv"], sd["transformer.h.1.attn.c_attn.bias"][24:])
    assert np.array_equal(params["h0.mlp.W2"], sd["transformer.h.0.mlp.c_proj.weight"])
    assert all(p.dtype == np.float64 for p in params.values())
    # new arrays: the state dict is neither modified nor shared
    params["wte"][0, 0] += 1.0
    assert all(np.array_equal(sd[k], before[k]) for k in sd)
    # the bare GPT2Model naming (no prefix) reads the same; float32 on request
    p32, _ = gpt_from_hf(_fake_gpt2_state_dict(np.random.default_rng(0), prefix=""), GPT2_JSON,
                         dtype=np.float32)
    assert all(p.dtype == np.float32 for p in p32.values())
    assert np.array_equal(p32["h1.attn.Wk"], W[:, 12:24].astype(np.float32))


def test_state_dict_errors_name_the_key():
    rng = np.random.default_rng(0)
    sd = _fake_gpt2_state_dict(rng)
    missing = {k: a for k, a in sd.items() if k != "transformer.h.1.ln_2.bias"}
    with pytest.raises(ValueError, match=r"state_dict has no \['h.1.ln_2.bias'\]"):
        gpt_from_hf(missing, GPT2_JSON)
    with pytest.raises(ValueError, match=r"unexpected keys \['h.0.attn.q_attn.weight'\]"):
        gpt_from_hf({**sd, "transformer.h.0.attn.q_attn.weight": sd["transformer.wte.weight"]},
                    GPT2_JSON)
    bad = dict(sd, **{"transformer.h.0.mlp.c_fc.weight": rng.standard_normal((20, 12))})
    with pytest.raises(ValueError, match=r"state_dict\['h.0.mlp.c_fc.weight'\] has shape \(20, 12\)"):
        gpt_from_hf(bad, GPT2_JSON)
    with pytest.raises(ValueError, match="lm_head.weight'\\] differs from the token embedding"):
        gpt_from_hf({**sd, "lm_head.weight": rng.standard_normal((29, 12))}, GPT2_JSON)
    with pytest.raises(TypeError, match=r"state_dict\['h.0.ln_1.weight'\] has dtype int64"):
        gpt_from_hf({**sd, "transformer.h.0.ln_1.weight": np.arange(12)}, GPT2_JSON)


def test_load_hf_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="load_hf_checkpoint: directory"):
        load_hf_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(GPT2_JSON))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_hf_checkpoint(tmp_path)


def test_missing_safetensors_is_a_clear_import_error(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(GPT2_JSON))
    (tmp_path / "model.safetensors").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "safetensors", None)   # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'numpytfmr\[hf\]'"):
        load_hf_checkpoint(tmp_path)


def _write_safetensors(path, tensors):
    """A .safetensors file by hand: u64 header length, JSON header, raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_bfloat16_and_float16_weights_load_exactly(tmp_path):
    pytest.importorskip("safetensors")
    rng = np.random.default_rng(0)
    sd = _fake_gpt2_state_dict(rng)
    del sd["transformer.h.0.attn.bias"], sd["transformer.h.1.attn.bias"]
    tensors, expected = {}, {}
    for i, (k, a) in enumerate(sd.items()):
        a32 = a.astype(np.float32)
        if i % 2:   # bfloat16 = the top 16 bits of a float32 (truncation is a valid bf16 value)
            top = (a32.view(np.uint32) >> 16).astype("<u2")
            tensors[k] = ("BF16", a.shape, top.tobytes())
            expected[k] = (top.astype(np.uint32) << 16).view(np.float32)
        else:
            a16 = a.astype("<f2")
            tensors[k] = ("F16", a.shape, a16.tobytes())
            expected[k] = a16.astype(np.float32)
    _write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(GPT2_JSON))
    params, _ = load_hf_checkpoint(tmp_path)
    ref, _ = gpt_from_hf(expected, GPT2_JSON)
    assert set(params) == set(ref)
    assert all(params[k].dtype == np.float32 and np.array_equal(params[k], ref[k]) for k in ref)
    assert params["wte"][0, 0] == expected["transformer.wte.weight"][0, 0] != 0.0


# ---------------------------------------------------------------------------------------
# Against transformers
# ---------------------------------------------------------------------------------------

def _hf():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("these comparisons use the transformers 5 API (rope_parameters)")
    return torch, transformers


HF_MODELS = {
    "gpt2": dict(model_type="gpt2", vocab_size=53, n_embd=24, n_layer=2, n_head=3,
                 n_positions=32, n_inner=40, activation_function="gelu_new"),
    "gpt2-untied-gelu": dict(model_type="gpt2", vocab_size=41, n_embd=16, n_layer=1, n_head=2,
                             n_positions=24, activation_function="gelu",
                             tie_word_embeddings=False),
    "llama-gqa": dict(model_type="llama", vocab_size=57, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=44,
                      max_position_embeddings=64, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": 300.0}),
    "llama-mqa-tied-linear": dict(model_type="llama", vocab_size=47, hidden_size=24,
                                  num_hidden_layers=2, num_attention_heads=3,
                                  num_key_value_heads=1, intermediate_size=28,
                                  max_position_embeddings=64, tie_word_embeddings=True,
                                  rope_parameters={"rope_type": "linear", "rope_theta": 1000.0,
                                                   "factor": 2.0}),
}


def _hf_model(name, *, seed=0):
    """A tiny transformers model from one of the configs above, eval mode, eager attention,
    with O(1/sqrt(fan_in)) random weights (transformers' 0.02 init makes every logit nearly
    equal, a weak test and near-ties in greedy decoding)."""
    torch, transformers = _hf()
    spec = dict(HF_MODELS[name])
    family = spec.pop("model_type")
    cls, lm = ((transformers.GPT2Config, transformers.GPT2LMHeadModel) if family == "gpt2"
               else (transformers.LlamaConfig, transformers.LlamaForCausalLM))
    # no end-of-sequence token: generate always produces max_new_tokens
    config = cls(**spec, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                 attn_implementation="eager")
    torch.manual_seed(seed)
    model = lm(config).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if p.ndim == 1 and key.endswith("weight"):        # norm gains
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:                                 # biases
                p.copy_(0.2 * torch.randn_like(p))
            elif key.endswith(("wte.weight", "wpe.weight", "embed_tokens.weight")):
                p.copy_(0.5 * torch.randn_like(p))            # tables
            else:   # GPT-2's Conv1D is (d_in, d_out), nn.Linear is (d_out, d_in)
                fan_in = p.shape[0] if ".c_" in key else p.shape[1]
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
    return model


@pytest.fixture
def float64_reference(monkeypatch):
    """transformers' LLaMA computes RMSNorm, the attention softmax and the RoPE angles in
    float32 even in a float64 model (an upcast meant for half precision), which limits the
    agreement to ~1e-7. For the float64 comparisons those three run in the model's dtype;
    the math is unchanged."""
    torch, _ = _hf()
    from transformers.models.llama import modeling_llama as ml

    def rmsnorm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = ml.repeat_kv(key, module.num_key_value_groups)
        value = ml.repeat_kv(value, module.num_key_value_groups)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    def rotary(self, x, position_ids):
        rope = self.config.rope_parameters
        dim = self.inv_freq.shape[0] * 2
        inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        if rope["rope_type"] == "linear":
            inv_freq = inv_freq / rope["factor"]
        angles = position_ids[..., None].to(torch.float64) * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", rmsnorm)
    monkeypatch.setattr(ml, "eager_attention_forward", eager_attention)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", rotary)


def _convert(model, dtype=None):
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return gpt_from_hf(sd, model.config.to_dict(), dtype=dtype)


def _ids(vocab, shape, seed=1):
    return np.random.default_rng(seed).integers(0, vocab, size=shape)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_logits_match_transformers_float64(name, float64_reference):
    torch, _ = _hf()
    model = _hf_model(name).double()
    params, config = _convert(model)
    assert config.activation == ("swiglu" if "llama" in name else config.activation)
    ids = _ids(config.vocab_size, (2, 9))
    ours, _ = gpt_forward(params, ids, config=config)
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids)).logits.numpy()
    assert ours.dtype == np.float64
    assert np.max(np.abs(ours - theirs)) <= 1e-10 * np.max(np.abs(theirs))
    assert np.max(np.abs(theirs)) > 1.0   # logits far from uniform: the test has teeth


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_logits_match_transformers_float32(name):
    torch, _ = _hf()
    model = _hf_model(name)
    params, config = _convert(model)
    assert all(p.dtype == np.float32 for p in params.values())
    ids = _ids(config.vocab_size, (2, 9))
    ours, _ = gpt_forward(params, ids, config=config)
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids)).logits.numpy()
    assert ours.dtype == np.float32
    assert np.max(np.abs(ours - theirs)) <= 1e-4 * max(1.0, np.max(np.abs(theirs)))


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_gradients_match_pytorch_autograd(name, float64_reference):
    """Cross-entropy on one batch: every gradient of gpt_backward against .grad of the
    corresponding transformers parameter (mapped by gpt_from_hf itself: the conversion is
    linear, so it maps gradients like weights)."""
    torch, _ = _hf()
    model = _hf_model(name).double()
    params, config = _convert(model)
    ids = _ids(config.vocab_size, (2, 7))
    targets = _ids(config.vocab_size, (2, 7), seed=2)
    loss, grads = gpt_loss(params, ids, targets, config=config)

    logits = model(torch.from_numpy(ids)).logits
    t_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size),
                                               torch.from_numpy(targets).reshape(-1))
    t_loss.backward()
    hf_grads = {k: p.grad.numpy() for k, p in model.named_parameters()}
    theirs, _ = gpt_from_hf(hf_grads, model.config.to_dict())
    assert abs(loss - t_loss.item()) <= 1e-12 * abs(loss)
    assert set(grads) == set(theirs) == set(params)
    errors = {k: rel_error(grads[k], theirs[k]) for k in grads}
    assert max(errors.values()) <= 1e-8, errors
    assert all(np.max(np.abs(theirs[k])) > 0 for k in theirs)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_greedy_generation_matches_transformers(name, float64_reference):
    torch, _ = _hf()
    model = _hf_model(name, seed=5).double()
    params, config = _convert(model)
    prompt = _ids(config.vocab_size, (2, 4), seed=3)
    with torch.no_grad():
        out = model.generate(torch.from_numpy(prompt), max_new_tokens=10, do_sample=False,
                             attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                             output_logits=True, return_dict_in_generate=True)
    theirs = out.sequences.numpy()
    their_logits = np.stack([step.numpy() for step in out.logits], axis=1)   # (B, 10, V)
    ours, our_logits = generate(params, prompt, config=config, max_new_tokens=10, top_k=1,
                                return_logits=True)
    assert theirs.shape == (2, 14)
    np.testing.assert_array_equal(ours, theirs)
    # every step's logits, not only their argmax: ours from the KV cache against a float64
    # forward of transformers over the whole sequence, and against generate's own logits
    # (which transformers hands out cast to float32)
    with torch.no_grad():
        full = model(torch.from_numpy(ours)).logits.numpy()[:, 3:-1]   # positions 3..12 predict 4..13
    scale = np.max(np.abs(full))
    assert np.max(np.abs(our_logits - full)) <= 1e-10 * scale
    assert np.max(np.abs(our_logits - their_logits)) <= 1e-6 * scale
    np.testing.assert_array_equal(
        generate(params, prompt, config=config, max_new_tokens=10, top_k=1, use_cache=False), ours)


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "llama-mqa-tied-linear"])
def test_save_pretrained_checkpoint_loads(name, tmp_path, float64_reference):
    torch, _ = _hf()
    pytest.importorskip("safetensors")
    model = _hf_model(name)
    model.save_pretrained(tmp_path)
    assert os.path.isfile(tmp_path / "model.safetensors")
    params, config = load_hf_checkpoint(tmp_path)
    expected, _ = _convert(model)
    assert set(params) == set(expected)
    assert all(np.array_equal(params[k], expected[k]) for k in params)
    ids = _ids(config.vocab_size, (2, 6))
    with torch.no_grad():
        theirs32 = model(torch.from_numpy(ids)).logits.numpy()
        theirs64 = model.double()(torch.from_numpy(ids)).logits.numpy()
    ours32, _ = gpt_forward(params, ids, config=config)
    assert np.max(np.abs(ours32 - theirs32)) <= 1e-4 * max(1.0, np.max(np.abs(theirs32)))
    # the float32 weights read as float64 give the float64 model's logits
    p64, _ = load_hf_checkpoint(str(tmp_path), dtype=np.float64)
    ours64, _ = gpt_forward(p64, ids, config=config)
    assert np.max(np.abs(ours64 - theirs64)) <= 1e-10 * np.max(np.abs(theirs64))


def test_sharded_and_bfloat16_checkpoints_load(tmp_path):
    torch, _ = _hf()
    pytest.importorskip("safetensors")
    model = _hf_model("llama-gqa")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert os.path.isfile(tmp_path / "sharded" / "model.safetensors.index.json")
    params, _ = load_hf_checkpoint(tmp_path / "sharded")
    expected, _ = _convert(model)
    assert all(np.array_equal(params[k], expected[k]) for k in expected)

    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    params, _ = load_hf_checkpoint(tmp_path / "bf16")
    expected, _ = _convert(model.float())   # bfloat16 -> float32 is exact
    assert all(params[k].dtype == np.float32 and np.array_equal(params[k], expected[k])
               for k in expected)
