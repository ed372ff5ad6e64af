"""Export to Hugging Face: gpt_to_hf and save_hf_checkpoint.

- the key table read backwards: gpt_from_hf(gpt_to_hf(...)) and load_hf_checkpoint of an
  export give the same parameters bit for bit and an equal config (NumPy only);
- the model.safetensors file, read by hand;
- configurations with no transformers counterpart are ValueErrors naming the field;
- the folder: written whole or not at all, never over a non-empty folder unless forced;
- tokenizers: numpytfmr's CharTokenizer / WordTokenizer and the byte-level BPE;
- transformers.AutoModelForCausalLM.from_pretrained of an export gives the same logits
  (float32: 1e-5 relative; float64: 1e-10), skipped without torch/transformers.
"""
import json
import os
import warnings

import numpy as np
import pytest

from conftest import well_conditioned
from numpytfmr.gpt import GPTConfig, gpt_forward, gpt_param_shapes, init_gpt
from numpytfmr.positional import rope_frequencies
from numpytfmr.run.data import CharTokenizer, WordTokenizer
from numpytfmr.run.hf import (gpt_config_from_hf, gpt_from_hf, gpt_to_hf, load_hf_checkpoint,
                              save_hf_checkpoint)
from test_hf import float64_reference  # noqa: F401  (a fixture: transformers' LLaMA in float64)

LLAMA = dict(positional="rope", rope_layout="half", norm_type="rmsnorm", activation="swiglu",
             bias=False)

# configs that map one to one: the round trip gives an equal config back
EXACT = {
    "gpt2-tied": GPTConfig(vocab_size=41, n_layers=2, d_model=16, n_heads=4, d_ff=24, max_len=20,
                           activation="gelu_tanh"),
    "gpt2-untied-relu": GPTConfig(vocab_size=37, n_layers=2, d_model=12, n_heads=3, max_len=16,
                                  activation="relu", tie_embeddings=False, norm_eps=1e-6),
    "gpt2-gelu": GPTConfig(vocab_size=29, n_layers=1, d_model=8, n_heads=2, max_len=12,
                                   activation="gelu"),
    "llama-gqa-untied": GPTConfig(vocab_size=43, n_layers=2, d_model=16, n_heads=4, n_kv_heads=2,
                                  d_ff=20, max_len=32, tie_embeddings=False, rope_base=500.0,
                                  norm_eps=1e-6, **LLAMA),
    "llama-mqa-tied-linear": GPTConfig(vocab_size=31, n_layers=2, d_model=24, n_heads=3,
                                       n_kv_heads=1, d_ff=28, max_len=64, tie_embeddings=True,
                                       rope_scaling={"type": "linear", "factor": 2.0}, **LLAMA),
    "llama-yarn": GPTConfig(vocab_size=33, n_layers=1, d_model=32, n_heads=2, d_ff=24, max_len=64,
                            tie_embeddings=False,
                            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_positions": 16,
                                          "beta_fast": 16.0}, **LLAMA),
}
# configs written in an equivalent form (the loaded config differs, the function does not)
EQUIVALENT = {
    "llama-interleaved": GPTConfig(vocab_size=35, n_layers=2, d_model=16, n_heads=2, n_kv_heads=1,
                                   d_ff=20, max_len=32,
                                   **dict(LLAMA, rope_layout="interleaved")),
    "llama-ntk": GPTConfig(vocab_size=35, n_layers=1, d_model=16, n_heads=2, d_ff=20, max_len=32,
                           rope_scaling={"type": "ntk", "factor": 4.0}, **LLAMA),
}
ALL = {**EXACT, **EQUIVALENT}


def _params(config, dtype=np.float64, seed=0):
    """Parameters at a well-conditioned point (logits far from uniform)."""
    rng = np.random.default_rng(seed)
    p = well_conditioned(init_gpt(config, rng=rng, dtype=np.float64), rng)
    return {k: a.astype(dtype) for k, a in p.items()}


def _ids(config, shape=(2, 9), seed=1):
    return np.random.default_rng(seed).integers(0, config.vocab_size, size=shape)


def _same(p, q):
    return set(p) == set(q) and all(p[k].dtype == q[k].dtype and np.array_equal(p[k], q[k])
                                    for k in p)


# ---------------------------------------------------------------------------------------
# The key table backwards (NumPy only)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(EXACT))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpt_to_hf_is_the_inverse_of_gpt_from_hf(name, dtype):
    config = EXACT[name]
    params = _params(config, dtype)
    state_dict, hf_config = gpt_to_hf(params, config)
    back, back_config = gpt_from_hf(state_dict, hf_config)
    assert back_config == config and _same(back, params)
    assert all(a.dtype == dtype and a.flags.c_contiguous for a in state_dict.values())
    # new arrays: changing the export changes nothing in the model
    for a in state_dict.values():
        a[...] = 0
    assert _same(params, _params(config, dtype))


def test_state_dict_names_and_layouts():
    config = EXACT["gpt2-tied"]
    params = _params(config)
    sd, hf = gpt_to_hf(params, config)
    assert hf["model_type"] == "gpt2" and hf["architectures"] == ["GPT2LMHeadModel"]
    assert (hf["activation_function"], hf["n_inner"], hf["tie_word_embeddings"]) == ("gelu_new", 24, True)
    assert "lm_head.weight" not in sd and "transformer.wte.weight" in sd   # tied: one table
    W = sd["transformer.h.1.attn.c_attn.weight"]                            # [Wq | Wk | Wv], (in, out)
    assert np.array_equal(W, np.concatenate([params[f"h1.attn.{k}"] for k in ("Wq", "Wk", "Wv")], 1))
    assert np.array_equal(sd["transformer.h.0.mlp.c_proj.weight"], params["h0.mlp.W2"])

    config = EXACT["llama-gqa-untied"]
    params = _params(config)
    sd, hf = gpt_to_hf(params, config)
    assert (hf["num_key_value_heads"], hf["head_dim"], hf["hidden_act"]) == (2, 4, "silu")
    assert hf["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (8, 16)    # nn.Linear (out, in)
    assert np.array_equal(sd["model.layers.0.self_attn.k_proj.weight"], params["h0.attn.Wk"].T)
    assert np.array_equal(sd["lm_head.weight"], params["lm_head.W"].T)
    assert len(sd) == len(gpt_param_shapes(config))


def test_yarn_rope_parameters_read_back():
    hf = gpt_to_hf(_params(EXACT["llama-yarn"]), EXACT["llama-yarn"])[1]
    assert hf["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 16, "beta_fast": 16.0,
                                     "attention_factor": 1.0}
    assert gpt_config_from_hf(hf).rope_scaling == EXACT["llama-yarn"].rope_scaling
    # YaRN's temperature on cos/sin (the default attention_factor) is not numpytfmr's RoPE
    hf["rope_parameters"].pop("attention_factor")
    with pytest.raises(ValueError, match="type 'yarn' has attention_factor None"):
        gpt_config_from_hf(hf)


def test_equivalent_forms_compute_the_same_logits():
    """RoPE's interleaved layout goes out as LLaMA's half layout with the columns of W_q and
    W_k reordered; NTK scaling as its base. The function is unchanged."""
    for name, config in EQUIVALENT.items():
        params = _params(config)
        sd, hf = gpt_to_hf(params, config)
        back, back_config = gpt_from_hf(sd, hf)
        assert back_config.rope_layout == "half" and back_config.rope_scaling is None
        ids = _ids(config)
        ours, _ = gpt_forward(params, ids, config=config)
        theirs, _ = gpt_forward(back, ids, config=back_config)
        assert np.max(np.abs(ours - theirs)) <= 1e-12 * np.max(np.abs(ours)), name
    c = EQUIVALENT["llama-ntk"]
    b = gpt_config_from_hf(gpt_to_hf(_params(c), c)[1])
    assert np.array_equal(rope_frequencies(c.d_head, base=c.rope_base, scaling=c.rope_scaling),
                          rope_frequencies(b.d_head, base=b.rope_base))   # bit for bit
    c = EQUIVALENT["llama-interleaved"]   # a real permutation of the columns
    assert not np.array_equal(gpt_to_hf(_params(c), c)[0]["model.layers.0.self_attn.q_proj.weight"],
                              _params(c)["h0.attn.Wq"].T)


# ---------------------------------------------------------------------------------------
# The checkpoint folder
# ---------------------------------------------------------------------------------------

def _read_safetensors_by_hand(path):
    """{name: array} of a .safetensors file with F32/F64 tensors, and its metadata."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    data, end = raw[8 + n:], 0
    tensors = {}
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, stop = entry["data_offsets"]
        assert begin == end          # back to back, no gaps
        dt = {"F32": "<f4", "F64": "<f8"}[entry["dtype"]]
        tensors[name] = np.frombuffer(data[begin:stop], dtype=dt).reshape(entry["shape"])
        end = stop
    assert end == len(data)
    return tensors, meta


@pytest.mark.parametrize("name", ["gpt2-untied-relu", "llama-mqa-tied-linear"])
def test_safetensors_written_in_numpy(name, tmp_path):
    config = EXACT[name]
    params = _params(config, np.float32)
    info = save_hf_checkpoint(params, config, tmp_path / "out")
    assert info["files"] == ["config.json", "model.safetensors"] and info["tokenizer"] is None
    assert (info["dtype"], info["notes"]) == ("float32", [])
    tensors, meta = _read_safetensors_by_hand(tmp_path / "out" / "model.safetensors")
    assert meta == {"format": "pt"}            # transformers refuses a file without it
    expected, hf_config = gpt_to_hf(params, config)
    assert _same(tensors, expected) and info["tensors"] == len(expected)
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == \
        dict(hf_config, bos_token_id=None, eos_token_id=None, pad_token_id=None)


@pytest.mark.parametrize("name", list(EXACT))
def test_load_hf_checkpoint_of_an_export_is_exact(name, tmp_path):
    pytest.importorskip("safetensors")
    config = EXACT[name]
    for dtype in (np.float32, np.float64):
        params = _params(config, dtype)
        info = save_hf_checkpoint(params, config, tmp_path / dtype.__name__)
        assert info["dtype"] == np.dtype(dtype).name
        back, back_config = load_hf_checkpoint(tmp_path / dtype.__name__)
        assert back_config == config and _same(back, params)


def test_dtype_conversion_and_notes(tmp_path):
    pytest.importorskip("safetensors")
    config = GPTConfig(**{**EXACT["gpt2-gelu"].to_dict(), "dropout": 0.1})
    params = _params(config)
    info = save_hf_checkpoint(params, config, tmp_path / "a", dtype=np.float32)
    assert info["dtype"] == "float32" and "dropout 0.1" in info["notes"][0]
    hf = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (hf["embd_pdrop"], hf["resid_pdrop"], hf["attn_pdrop"]) == (0.1, 0.1, 0.0)
    back, back_config = load_hf_checkpoint(tmp_path / "a")
    assert back_config.dropout == 0.0
    assert _same(back, {k: a.astype(np.float32) for k, a in params.items()})
    info = save_hf_checkpoint(_params(EQUIVALENT["llama-ntk"]), EQUIVALENT["llama-ntk"], tmp_path / "b")
    assert len(info["notes"]) == 1 and "rope_theta" in info["notes"][0]
    with pytest.raises(TypeError, match="save_hf_checkpoint: dtype is 'float16'"):
        save_hf_checkpoint(params, config, tmp_path / "c", dtype="float16")
    assert not (tmp_path / "c").exists()


BASE = dict(vocab_size=13, n_layers=1, d_model=8, n_heads=2, max_len=8)


@pytest.mark.parametrize("change, message", [
    (dict(norm="post"), "config.norm is 'post'; transformers' GPT-2 and LLaMA are pre-norm"),
    (dict(positional="sinusoidal"), "config.positional is 'sinusoidal'; .* neither adds fixed"),
    (dict(norm_type="rmsnorm"), "config.norm_type is 'rmsnorm'; learned positions make a GPT-2"),
    (dict(activation="swiglu", bias=False), "config.activation is 'swiglu'; GPT-2's "),
    (dict(bias=False), "config.bias is False; GPT-2's linear layers"),
    (dict(n_kv_heads=1), "config.n_kv_heads is 1; GPT-2 has one key/value head"),
    (dict(positional="rope", activation="relu"), "config.norm_type is 'layernorm'; RoPE makes a LLaMA"),
    (dict(positional="rope", norm_type="rmsnorm", activation="gelu_tanh"),
     "config.activation is 'gelu_tanh'; RoPE makes a LLaMA, whose FFN is SwiGLU"),
    (dict(LLAMA, d_model=8, rope_base=2.0,
          rope_scaling={"type": "yarn", "factor": 2.0, "original_max_positions": 1000}),
     "config.rope_scaling is .* its YaRN ramp is empty"),
])
def test_configs_without_a_transformers_counterpart_are_refused(change, message, tmp_path):
    config = GPTConfig(**{**BASE, **change})
    params = _params(config)
    with pytest.raises(ValueError, match="save_hf_checkpoint: " + message):
        save_hf_checkpoint(params, config, tmp_path / "out")
    assert os.listdir(tmp_path) == []            # nothing written, not even a temporary folder
    with pytest.raises(ValueError, match="gpt_to_hf: " + message):
        gpt_to_hf(params, config)


def test_params_are_checked_against_the_config(tmp_path):
    config = EXACT["gpt2-tied"]
    params = _params(config)
    del params["h1.mlp.b2"]
    with pytest.raises(ValueError, match="h1.mlp.b2"):
        save_hf_checkpoint(params, config, tmp_path / "out")
    with pytest.raises(TypeError, match="config is a dict"):
        save_hf_checkpoint(_params(config), config.to_dict(), tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_never_overwrites_unless_forced(tmp_path):
    config = EXACT["gpt2-tied"]
    target = tmp_path / "ckpt"
    save_hf_checkpoint(_params(config, seed=0), config, target)
    before = {f: (target / f).read_bytes() for f in os.listdir(target)}
    with pytest.raises(FileExistsError, match=r"is not empty .*force=True"):
        save_hf_checkpoint(_params(config, seed=1), config, target)
    assert {f: (target / f).read_bytes() for f in os.listdir(target)} == before
    (target / "notes.txt").write_text("mine")
    info = save_hf_checkpoint(_params(config, seed=1), config, target, force=True)
    assert info["files"] == ["config.json", "model.safetensors"]   # the old folder is replaced whole
    assert (target / "model.safetensors").read_bytes() != before["model.safetensors"]
    assert os.listdir(tmp_path) == ["ckpt"]                       # no temporary folder left
    # an empty folder is fine; a file is not; force must be a bool
    (tmp_path / "empty").mkdir()
    save_hf_checkpoint(_params(config), config, str(tmp_path / "empty"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is not a folder"):
        save_hf_checkpoint(_params(config), config, tmp_path / "file", force=True)
    with pytest.raises(TypeError, match="force is 'yes'"):
        save_hf_checkpoint(_params(config), config, tmp_path / "new", force="yes")


def test_a_failed_write_leaves_nothing(tmp_path):
    class Broken:
        def save_gpt2_files(self, directory):
            with open(os.path.join(directory, "vocab.json"), "w") as f:
                f.write("{")
            raise OSError("disk full")

    config = EXACT["gpt2-tied"]
    with pytest.raises(OSError, match="disk full"):
        save_hf_checkpoint(_params(config), config, tmp_path / "out", tokenizer=Broken())
    assert os.listdir(tmp_path) == []
    save_hf_checkpoint(_params(config, seed=0), config, tmp_path / "old")
    before = (tmp_path / "old" / "model.safetensors").read_bytes()
    with pytest.raises(OSError, match="disk full"):
        save_hf_checkpoint(_params(config, seed=1), config, tmp_path / "old", tokenizer=Broken(),
                           force=True)
    assert (tmp_path / "old" / "model.safetensors").read_bytes() == before
    assert os.listdir(tmp_path) == ["old"]


# ---------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------

CHAR_TEXT = "<bos>12 (ab)<sep>x=3.<eos><pad>"
WORDS = WordTokenizer(("le", "chat", "noir", "voit", "une", "voiture", "."))
WORD_TEXT = "<bos> le chat noir voit une voiture . <eos>"


def _tiny(vocab_size, **kw):
    return GPTConfig(vocab_size=vocab_size, n_layers=1, d_model=8, n_heads=2, max_len=16, **kw)


def test_char_and_word_tokenizers_as_tokenizer_json(tmp_path):
    for name, tok in (("char", CharTokenizer()), ("word", WORDS)):
        config = _tiny(tok.vocab_size + 3)          # a model may have spare rows
        info = save_hf_checkpoint(_params(config), config, tmp_path / name, tokenizer=tok)
        assert info["tokenizer"] == "PreTrainedTokenizerFast"
        assert info["files"] == ["config.json", "model.safetensors", "tokenizer.json",
                                 "tokenizer_config.json"]
        tj = json.loads((tmp_path / name / "tokenizer.json").read_text(encoding="utf-8"))
        assert tj["model"]["type"] == "WordLevel"
        assert tj["model"]["vocab"] == {t: i for i, t in enumerate(tok.tokens)}
        assert [(a["id"], a["content"], a["special"]) for a in tj["added_tokens"]] == \
            [(0, "<pad>", True), (1, "<bos>", True), (2, "<eos>", True), (3, "<sep>", True)]
        hf = json.loads((tmp_path / name / "config.json").read_text())
        assert (hf["bos_token_id"], hf["eos_token_id"], hf["pad_token_id"]) == (1, 2, 0)
    n = CharTokenizer().vocab_size
    with pytest.raises(ValueError, match=f"the tokenizer has {n} tokens but config.vocab_size "
                                         f"is {n - 1}; expected the tokenizer the model was"):
        save_hf_checkpoint(_params(_tiny(n - 1)), _tiny(n - 1), tmp_path / "small",
                           tokenizer=CharTokenizer())
    assert not (tmp_path / "small").exists()


def test_other_tokenizers_are_skipped_with_a_note(tmp_path):
    config = _tiny(20)
    with pytest.warns(UserWarning, match="a dict has no transformers form"):
        info = save_hf_checkpoint(_params(config), config, tmp_path / "out", tokenizer={"a": 1})
    assert info["tokenizer"] is None and "no tokenizer files" in info["notes"][0]
    assert info["files"] == ["config.json", "model.safetensors"]


def _transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("these comparisons use the transformers 5 API (rope_parameters)")
    return torch, transformers


def test_char_and_word_tokenizers_load_in_transformers(tmp_path):
    _, transformers = _transformers()
    for name, tok, text in (("char", CharTokenizer(), CHAR_TEXT), ("word", WORDS, WORD_TEXT)):
        config = _tiny(tok.vocab_size)
        save_hf_checkpoint(_params(config), config, tmp_path / name, tokenizer=tok)
        theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / name)
        ids = theirs(text)["input_ids"]
        assert ids == tok.encode(text).tolist()
        assert theirs.decode(ids) == tok.decode(ids) == text
        assert theirs.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special=True)
        assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (1, 2, 0)


def test_bpe_tokenizer_loads_as_gpt2_tokenizer(tmp_path):
    bpe = pytest.importorskip("numpytfmr.run.bpe")
    _, transformers = _transformers()
    text = ("the cat sat on the mat; the dog didn't. 42 cats, 7 dogs!\n\n  Ünïcödé<|endoftext|>"
            "l'été, 日本語 ") * 8
    vocab, merges = bpe.train_bpe(text, 300, special_tokens=["<|endoftext|>"])
    tok = bpe.BPETokenizer(vocab, merges, special_tokens=["<|endoftext|>"])
    config = _tiny(tok.vocab_size)
    info = save_hf_checkpoint(_params(config), config, tmp_path / "out", tokenizer=tok)
    assert info["tokenizer"] == "GPT2Tokenizer"
    assert {"vocab.json", "merges.txt", "tokenizer_config.json"} <= set(info["files"])
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert type(theirs).__name__ == "GPT2Tokenizer"
    sample = "the cats didn't sit<|endoftext|> on 42 mats  \n Ünïcödé, l'été 日本"
    ids = theirs(sample)["input_ids"]
    assert ids == list(tok.encode(sample)) and len(ids) < len(sample.encode("utf-8"))
    assert theirs.decode(ids) == tok.decode(ids) == sample
    end = tok.token_to_id("<|endoftext|>")
    assert theirs.eos_token_id == theirs.bos_token_id == end
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == end


# ---------------------------------------------------------------------------------------
# Against transformers
# ---------------------------------------------------------------------------------------

def _their_logits(torch, transformers, directory, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(directory,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        return model, model(torch.from_numpy(ids)).logits.numpy()


@pytest.mark.parametrize("name", list(ALL))
def test_transformers_loads_the_export_float32(name, tmp_path):
    torch, transformers = _transformers()
    config = ALL[name]
    params = _params(config, np.float32)
    info = save_hf_checkpoint(params, config, tmp_path)
    ids = _ids(config)
    ours, _ = gpt_forward(params, ids, config=config)
    model, theirs = _their_logits(torch, transformers, tmp_path, ids)
    assert type(model).__name__ == info["architecture"] and model.dtype == torch.float32
    assert np.max(np.abs(ours - theirs)) <= 1e-5 * np.max(np.abs(theirs))
    assert np.max(np.abs(theirs)) > 1.0       # logits far from uniform: the test has teeth
    tied = model.get_output_embeddings().weight.data_ptr() == \
        model.get_input_embeddings().weight.data_ptr()
    assert tied == config.tie_embeddings


@pytest.mark.parametrize("name", [n for n in ALL if n != "llama-yarn"])
def test_transformers_loads_the_export_float64(name, tmp_path, float64_reference):  # noqa: F811
    """float64 end to end (transformers' LLaMA with its float32 upcasts removed by the
    fixture, whose RoPE knows the default and linear types: not YaRN)."""
    torch, transformers = _transformers()
    config = ALL[name]
    params = _params(config, np.float64)
    save_hf_checkpoint(params, config, tmp_path)
    ids = _ids(config)
    ours, _ = gpt_forward(params, ids, config=config)
    model, theirs = _their_logits(torch, transformers, tmp_path, ids)
    assert model.dtype == torch.float64
    assert np.max(np.abs(ours - theirs)) <= 1e-10 * np.max(np.abs(theirs))


def test_greedy_generation_with_the_exported_tokenizer(tmp_path):
    """A GPT-2-style model and its character tokenizer, continued by transformers' generate
    and by numpytfmr's: the same text."""
    from numpytfmr.gpt import generate
    torch, transformers = _transformers()
    tok = CharTokenizer()
    config = _tiny(tok.vocab_size, activation="gelu_tanh")
    config = GPTConfig(**{**config.to_dict(), "max_len": 24})
    params = _params(config, np.float64, seed=4)
    save_hf_checkpoint(params, config, tmp_path, tokenizer=tok)
    their_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompt = their_tok("<bos>3142<sep>", return_tensors="pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False, eos_token_id=None)
    ours = generate(params, tok.encode("<bos>3142<sep>")[None], config=config, max_new_tokens=8,
                    top_k=1)
    assert their_tok.decode(out[0]) == tok.decode(ours[0])


# ---------------------------------------------------------------------------------------
# numpytfmr export and load_run: a run of pretrain, on to transformers in one command
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """A tiny pretrain run with a byte-level BPE learnt on its text, and the held-out text."""
    from numpytfmr.run.cli import main
    from numpytfmr.run.corpus import default_corpus, split_text
    tmp = tmp_path_factory.mktemp("bpe-run")
    text = default_corpus(max_bytes=20_000) + "\nÜnïcödé ½ 🙂 naïve café\n"
    (tmp / "own.txt").write_text(text, encoding="utf-8")
    assert main(["pretrain", "--text", str(tmp / "own.txt"), "--vocab-size", "400", "--steps",
                 "20", "--eval-every", "20", "--batch-size", "8", "--context", "32",
                 "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--quiet",
                 "--samples", "0", "--out", str(tmp / "run")]) == 0
    return tmp / "run", split_text(text)[1]


def test_load_run_gives_params_config_and_tokenizer(bpe_run, tmp_path):
    from numpytfmr.run.checkpoint import load_run
    from numpytfmr.run.pretrain import load_text_model
    run, _ = bpe_run
    params, config, tokenizer = load_run(run)
    ck = load_text_model(run)
    assert config == ck["model_config"] and set(params) == set(ck["params"])
    assert tokenizer.encode("The end") == ck["tokenizer"].encode("The end")
    assert load_run(run / "checkpoint.json").config == config


def test_export_writes_what_transformers_loads(bpe_run, tmp_path, capsys):
    """``numpytfmr export``: AutoTokenizer gives our ids on the held-out text, and the
    model's greedy continuation is ours."""
    from numpytfmr.run.checkpoint import load_run
    from numpytfmr.run.cli import main
    from numpytfmr.run.pretrain import complete_text
    torch, transformers = _transformers()
    run, held_out = bpe_run
    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(run), "-o", str(out), "--dtype", "float64"]) == 0
    assert "GPT2LMHeadModel" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt",
            "tokenizer_config.json"} <= set(os.listdir(out))
    params, config, tok = load_run(run)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert theirs(held_out)["input_ids"] == tok.encode(held_out)
        assert theirs.decode(tok.encode(held_out)) == held_out
        model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        for prompt in ("The ", "Return the value"):
            ids = theirs(prompt, return_tensors="pt")
            n = ids["input_ids"].shape[1]
            generated = model.generate(**ids, max_new_tokens=config.max_len - n + 1,
                                       do_sample=False, pad_token_id=0)
            ours, _ = complete_text({k: v.astype(np.float64) for k, v in params.items()},
                                    config, tok, prompt, temperature=0.0,
                                    max_new_tokens=config.max_len - n + 1)
            assert theirs.decode(generated[0, n:]) == ours
