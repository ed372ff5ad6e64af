"""``numpytfmr pretrain`` and its harness (run/pretrain.py, run/corpus.py): the default corpus,
the text tokenizers, held-out bits per byte, nucleus sampling, a smoke run, exact resuming,
the summary and the command line. Tiny models and texts: seconds, not minutes."""
import json
import math

import numpy as np
import pytest

from conftest import budget_in_cpu_seconds
from numpytfmr import fast
from numpytfmr.gpt import GPTConfig, generate, init_gpt
from numpytfmr.run import pretrain as pt
from numpytfmr.run.batches import write_tokens
from numpytfmr.run.checkpoint import load_checkpoint
from numpytfmr.run.corpus import default_corpus, split_text, stdlib_docstrings
from numpytfmr.run.data import tokenizer_from_dict
from numpytfmr.run.loop import TrainSettings
from numpytfmr.run.tokenizers import (load_tokenizer, make_tokenizer, token_byte_lengths,
                                      tokenizer_digest)
from numpytfmr.transformer import nucleus

TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16}
SUMMARY_KEYS = {"val_bits_per_byte", "baseline_bits_per_byte", "val_perplexity", "bytes_per_token",
                "tokens_per_second", "steps", "seconds", "ngram_bits_per_byte", "evals",
                "loss_history", "val_loss", "ratio_to_baseline", "samples"}


@pytest.fixture(scope="module")
def text():
    """About 20 KB of the default corpus: English with code in it."""
    return default_corpus(max_bytes=20_000)


def tiny_settings(**kw):
    return TrainSettings(**{"steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1,
                            "eval_every": 3, **kw})


def run(text, **kw):
    args = dict(text=text, tokenizer="bpe", vocab_size=300, model=TINY_MODEL,
                settings=tiny_settings(), n_samples=1, sample_tokens=8)
    args.update(kw)
    return pt.pretrain(**args)


# ---------------------------------------------------------------------------------------
# The default corpus
# ---------------------------------------------------------------------------------------

def test_default_corpus_is_deterministic_non_empty_and_capped(text):
    again = default_corpus(max_bytes=20_000)
    assert again == text
    assert 10_000 < len(text.encode("utf-8")) <= 20_000
    assert text.count("\n\n") > 20                       # many docstrings, blank-line separated


def test_corpus_reads_only_the_libraries_own_docstrings(tmp_path):
    (tmp_path / "b.py").write_text('"""Module b: the second module of the fake library."""\n'
                                   'def f():\n    """Function f returns forty-two, always and '
                                   'forever."""\n', encoding="utf-8")
    (tmp_path / "a.py").write_text('"""Module a: the first module of the fake library."""\n'
                                   'class C:\n    """Function f returns forty-two, always and '
                                   'forever."""\n', encoding="utf-8")          # a duplicate
    for skipped in ("site-packages", "test", "__pycache__"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "x.py").write_text('"""Third-party text that must never be '
                                                 'read by the corpus."""\n', encoding="utf-8")
    (tmp_path / "broken.py").write_text("def (:\n", encoding="utf-8")
    docs = list(stdlib_docstrings(tmp_path))
    assert docs == ["Module a: the first module of the fake library.",
                    "Function f returns forty-two, always and forever.",
                    "Module b: the second module of the fake library."]
    with pytest.raises(ValueError, match="no docstrings"):
        default_corpus(root=tmp_path / "site-packages" / "nothing")


def test_split_holds_out_the_last_tenth_at_a_line_start():
    text = "".join(f"line {i}\n" for i in range(100))
    train, val = split_text(text)
    assert train + val == text
    assert val.startswith("line ") and train.endswith("\n")
    assert abs(len(val) - len(text) / 10) < 10


# ---------------------------------------------------------------------------------------
# Tokenizers and bits per byte
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bpe", "byte", "char"])
def test_tokenizers_round_trip_and_count_bytes(kind, text):
    vocab = 300 if kind == "bpe" else None
    tok = make_tokenizer(kind, text[:5000], vocab)
    s = text[5000:6000] + " naïve café — ∑ 😀"      # characters not in the training text
    ids = pt.encode_text(tok, s)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == s
    assert token_byte_lengths(tok)[ids].sum() == len(s.encode("utf-8"))
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.decode(pt.encode_text(again, s)) == s and again.vocab_size == tok.vocab_size


def test_text_nats_scores_every_token_but_the_first_once():
    """Scored window by window (batched), the total is the token-by-token sum of -log P from
    the reference forward over each window; every token but the first is predicted once."""
    from numpytfmr.gpt import gpt_forward
    cfg = GPTConfig(vocab_size=20, n_layers=1, d_model=8, n_heads=2, max_len=5)
    params = init_gpt(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, 20, 13)       # 12 predicted: 5 + 5 + 2
    assert pt.text_windows(13, 5) == [(0, 5), (5, 5), (10, 2)]
    nats, targets = pt.text_nats(params, cfg, ids)
    assert sorted(targets.tolist()) == sorted(ids[1:].tolist())
    expected = 0.0
    for a, length in pt.text_windows(13, 5):
        x, y = ids[a:a + length], ids[a + 1:a + 1 + length]
        logits, _ = gpt_forward(params, x[None], config=cfg)
        logp = logits[0] - np.log(np.exp(logits[0]).sum(-1, keepdims=True))
        expected -= logp[np.arange(length), y].sum()
    assert nats == pytest.approx(expected, rel=1e-10)
    lengths = np.arange(20) % 3 + 1                          # bytes per token
    m = pt.evaluate_text(params, cfg, ids, lengths)
    assert m["val_bits_per_byte"] == pytest.approx(nats / math.log(2) / lengths[ids[1:]].sum())
    assert m["val_perplexity"] == pytest.approx(math.exp(nats / 12))
    spread = pt.text_windows(1001, 10, 4)                    # 4 windows spread over the stream
    assert spread == [(0, 10), (330, 10), (660, 10), (990, 10)]


# ---------------------------------------------------------------------------------------
# Nucleus (top-p) sampling
# ---------------------------------------------------------------------------------------

def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    p = np.array([[0.1, 0.5, 0.25, 0.15]])
    assert np.allclose(nucleus(p, 0.5), [[0, 1, 0, 0]])          # 0.5 alone reaches 0.5
    assert np.allclose(nucleus(p, 0.6), [[0, 0.5, 0.25, 0]] / np.float64(0.75))
    assert np.allclose(nucleus(p, 0.9), [[0, 0.5, 0.25, 0.15]] / np.float64(0.9))
    assert np.allclose(nucleus(p, 1.0), p)


@pytest.mark.parametrize("top_p,top_k", [(0.9, None), (0.5, None), (0.3, 5), (1.0, None)])
def test_top_p_generation_fast_equals_reference(top_p, top_k):
    cfg = GPTConfig(vocab_size=40, n_layers=1, d_model=16, n_heads=2, max_len=32)
    params = init_gpt(cfg, rng=np.random.default_rng(0))
    prompt = np.random.default_rng(1).integers(0, 40, (3, 4))
    kw = dict(config=cfg, max_new_tokens=12, temperature=2.0, top_k=top_k, top_p=top_p)
    ref = generate(params, prompt, rng=np.random.default_rng(5), **kw)
    out = fast.generate(params, prompt, rng=np.random.default_rng(5), **kw)
    assert np.array_equal(ref, out)
    if top_p == 1.0:                                             # no filtering at all
        plain = generate(params, prompt, rng=np.random.default_rng(5),
                         **dict(kw, top_p=None))
        assert np.array_equal(ref, plain)


def test_a_small_nucleus_is_greedy_and_top_p_is_checked():
    cfg = GPTConfig(vocab_size=40, n_layers=1, d_model=16, n_heads=2, max_len=32)
    params = init_gpt(cfg, rng=np.random.default_rng(0))
    prompt = np.random.default_rng(1).integers(0, 40, (2, 3))
    greedy = generate(params, prompt, config=cfg, max_new_tokens=6, top_k=1)
    tiny = generate(params, prompt, config=cfg, max_new_tokens=6, top_p=1e-9,
                    rng=np.random.default_rng(0))
    assert np.array_equal(greedy, tiny)
    for f in (generate, fast.generate):
        with pytest.raises(ValueError, match="top_p"):
            f(params, prompt, config=cfg, max_new_tokens=2, top_p=0.0, rng=np.random.default_rng(0))
        with pytest.raises(ValueError, match="top_p"):
            f(params, prompt, config=cfg, max_new_tokens=2, top_p=1.5, rng=np.random.default_rng(0))


# ---------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------

def test_smoke_run_reports_the_summary(text, tmp_path):
    params, s = run(text, out=tmp_path / "run")
    assert SUMMARY_KEYS <= set(s)
    assert s["steps"] == 6 and len(s["loss_history"]) == 6
    assert [e["step"] for e in s["evals"]] == [0, 3, 6]
    assert set(s["ngram_bits_per_byte"]) == {"unigram", "bigram", "trigram"}
    assert s["baseline_bits_per_byte"] == min(s["ngram_bits_per_byte"].values())
    for key in ("val_bits_per_byte", "val_perplexity", "bytes_per_token", "tokens_per_second",
                "seconds"):
        assert math.isfinite(s[key]) and s[key] > 0, key
    assert s["val_perplexity"] == pytest.approx(math.exp(s["val_loss"]))
    assert s["evals"][-1]["val_loss"] < s["evals"][0]["val_loss"]        # it learns something
    assert len(s["samples"]) == 1 and s["samples"][0].startswith("The ")
    ck = pt.load_text_model(tmp_path / "run")
    assert pt.is_text_checkpoint(tmp_path / "run") and ck["state"]["step"] == 6
    for k in params:
        assert np.array_equal(params[k], ck["params"][k])
    out, ids = pt.complete_text(ck["params"], ck["model_config"], ck["tokenizer"], "The ",
                                max_new_tokens=5, temperature=0.0)
    assert len(ids) == 5 and isinstance(out, str)


def test_resume_continues_exactly(text, tmp_path):
    """Stopped (Ctrl-C) after 3 of 6 steps and resumed: the same weights, bit for bit, the
    same losses and evaluations as the run that never stopped."""
    whole, s_whole = run(text, out=tmp_path / "a", n_samples=0)

    def stop_at_3(line):
        if line.startswith("step 3:"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run(text, out=tmp_path / "b", log=stop_at_3, n_samples=0)
    assert load_checkpoint(tmp_path / "b")["state"]["step"] == 3
    resumed, s_resumed = pt.pretrain(out=tmp_path / "b", resume=True, text=text, n_samples=0)
    for k in whole:
        assert whole[k].tobytes() == resumed[k].tobytes(), k
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert a["state"]["loss"] == b["state"]["loss"]
    assert a["state"]["evals"] == b["state"]["evals"]
    for k in a["opt_state"]:
        assert np.array_equal(a["opt_state"][k], b["opt_state"][k]), k
    assert s_whole["val_bits_per_byte"] == s_resumed["val_bits_per_byte"]


def test_a_run_refuses_to_overwrite_or_to_resume_something_else(text, tmp_path):
    run(text, out=tmp_path / "r", n_samples=0, settings=tiny_settings(steps=3))
    with pytest.raises(ValueError, match="--resume.*--force"):
        run(text, out=tmp_path / "r", n_samples=0)
    _, s = run(text, out=tmp_path / "r", n_samples=0, force=True, settings=tiny_settings(steps=4))
    assert s["steps"] == 4
    with pytest.raises(ValueError, match="SHA-256"):
        pt.pretrain(out=tmp_path / "r", resume=True, text=text + "more", n_samples=0)
    with pytest.raises(ValueError, match="d_model is 32 but the run"):
        pt.pretrain(out=tmp_path / "r", resume=True, text=text, changes={"d_model": 32})
    _, s = pt.pretrain(out=tmp_path / "r", resume=True, text=text, changes={"steps": 5},
                       n_samples=0)
    assert s["steps"] == 5


def test_a_budget_used_before_training_is_reported(text):
    with pytest.raises(ValueError, match="budget of .* minutes was used before training"):
        run(text, minutes=1e-6, n_samples=0)


@pytest.mark.parametrize("kind", ["byte", "char"])
def test_byte_and_char_runs_report_comparable_bits_per_byte(kind, text):
    _, s = run(text, tokenizer=kind, vocab_size=None, n_samples=0,
               settings=tiny_settings(steps=2, eval_every=2))
    assert s["tokenizer"] == kind
    assert s["bytes_per_token"] == pytest.approx(1.0, abs=0.02)
    assert 0 < s["val_bits_per_byte"] < 10


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------

def _main(argv):
    """``numpytfmr pretrain ...`` through the command's own parser."""
    from numpytfmr.run import cli
    from numpytfmr.run.commands import pretrain as command
    parser = cli.Parser(prog="numpytfmr")
    command.add_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_command_writes_the_summary_and_refuses_an_existing_run(text, tmp_path, capsys):
    from numpytfmr.run.cli import UsageError
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    summary = tmp_path / "s.json"
    argv = ["pretrain", "--text", str(path), "--vocab-size", "300", "--steps", "4",
            "--eval-every", "2", "--batch-size", "4", "--context", "16", "--d-model", "16",
            "--n-layers", "1", "--n-heads", "2", "--out", str(tmp_path / "run"), "--summary",
            str(summary), "--quiet", "--samples", "1"]
    assert _main(argv) == 0
    s = json.loads(summary.read_text(encoding="utf-8"))
    assert SUMMARY_KEYS <= set(s) and s["steps"] == 4 and s["source"] == str(path)
    printed = capsys.readouterr().out
    assert "bits per byte" in printed and "trigram" in printed and "sample: The " in printed
    with pytest.raises(UsageError, match="--force"):
        _main(argv)
    with pytest.raises(UsageError, match="--minutes and --steps"):
        _main(argv + ["--minutes", "1"])
    with pytest.raises(UsageError, match="--vocab-size"):
        _main(argv[:3] + ["--tokenizer", "byte"] + argv[3:])
    assert _main(["pretrain", "--resume", "--steps", "6", "--out", str(tmp_path / "run"),
                  "--quiet", "--samples", "0"]) == 0         # the text is read from the record
    assert load_checkpoint(tmp_path / "run")["state"]["step"] == 6


def test_no_arguments_trains_on_the_default_corpus_for_the_default_minutes(text, tmp_path,
                                                                            monkeypatch, capsys):
    """``numpytfmr pretrain`` alone: the default corpus, the default budget (both made small
    here), steps planned from the measured speed (in CPU seconds: the budget is small)."""
    budget_in_cpu_seconds(monkeypatch, pt)
    monkeypatch.setattr(pt, "default_corpus", lambda: text)
    monkeypatch.setitem(pt.PRETRAIN_DEFAULTS, "minutes", 0.15)   # room on a loaded machine
    monkeypatch.setitem(pt.PRETRAIN_DEFAULTS, "vocab_size", 300)
    monkeypatch.setitem(pt.PRETRAIN_DEFAULTS, "context", 16)
    monkeypatch.setattr(pt, "PRETRAIN_MODEL", dict(pt.PRETRAIN_MODEL, d_model=16, n_layers=1,
                                                   n_heads=2))
    monkeypatch.chdir(tmp_path)
    assert _main(["pretrain", "--quiet", "--samples", "0"]) == 0
    ck = load_checkpoint(tmp_path / "runs" / "pretrain")
    assert ck["task"]["source"] == pt.DEFAULT_SOURCE and ck["state"]["step"] >= 2
    assert "held-out" in capsys.readouterr().out


def test_generate_continues_text_from_a_pretrain_checkpoint(text, tmp_path, capsys):
    """``numpytfmr generate --checkpoint DIR --prompt "The "`` with a text checkpoint: the
    prompt is plain text; greedy, top-k and top-p sampling work; the fast path's tokens."""
    from numpytfmr.run import cli
    from numpytfmr.run.commands import generate as command
    run(text, out=tmp_path / "run", n_samples=0, settings=tiny_settings(steps=2, eval_every=2))
    parser = cli.Parser(prog="numpytfmr")
    command.add_command(parser.add_subparsers(dest="command"))

    def gen(*extra):
        args = parser.parse_args(["generate", "--checkpoint", str(tmp_path / "run"),
                                  "--prompt", "The ", "--max-new-tokens", "6", *extra])
        assert args.func(args) == 0
        return capsys.readouterr().out

    greedy = gen()
    ck = pt.load_text_model(tmp_path / "run")
    expected, _ = pt.complete_text(ck["params"], ck["model_config"], ck["tokenizer"], "The ",
                                   max_new_tokens=6, temperature=0.0)
    assert greedy == "The " + expected + "\n"
    sampled = gen("--temperature", "0.8", "--top-p", "0.9", "--seed", "3")
    assert sampled == gen("--temperature", "0.8", "--top-p", "0.9", "--seed", "3")
    assert sampled.startswith("The ")
    assert gen("--temperature", "1", "--top-k", "5").startswith("The ")
    with pytest.raises(cli.UsageError, match="--top-p"):
        parser.parse_args(["generate", "--prompt", "x", "--top-p", "1.5"])


# ---------------------------------------------------------------------------------------
# One held-out measure, settings, gradient accumulation, dropout
# ---------------------------------------------------------------------------------------

def test_the_curve_runs_from_step_0_to_the_final_figure(text, tmp_path):
    """Every evaluation scores the whole held-out text: the curve's last point is the final
    figure, its first the model before any update; the checkpoint holds the same curve."""
    params, s = run(text, out=tmp_path / "run", n_samples=0,
                    settings=tiny_settings(steps=5, eval_every=2))
    assert [e["step"] for e in s["evals"]] == [0, 2, 4, 5]
    assert s["evals"][-1]["val_bits_per_byte"] == s["val_bits_per_byte"]
    assert s["evals"][0]["val_bits_per_byte"] == s["initial_val_bits_per_byte"]
    ck = pt.load_text_model(tmp_path / "run")
    ids = pt.encode_text(ck["tokenizer"], split_text(text)[1])
    lengths = token_byte_lengths(ck["tokenizer"])
    whole = pt.evaluate_text(params, ck["model_config"], ids, lengths)
    assert whole["val_bits_per_byte"] == pytest.approx(s["val_bits_per_byte"], rel=1e-12)
    start = init_gpt(ck["model_config"], rng=np.random.default_rng((0, 0, 0)))
    first = pt.evaluate_text(start, ck["model_config"], ids, lengths)
    assert first["val_bits_per_byte"] == pytest.approx(s["evals"][0]["val_bits_per_byte"],
                                                       rel=1e-12)
    assert ck["state"]["evals"] == s["evals"]


def test_the_summary_records_every_setting(text):
    _, s = run(text, n_samples=0, grad_accum=2, model=dict(TINY_MODEL, dropout=0.1),
               settings=tiny_settings(steps=2, eval_every=2))
    assert s["settings"]["grad_accum"] == 2 and s["settings"]["dropout"] == 0.1
    assert s["settings"]["context"] == 16 and s["config"]["dropout"] == 0.1
    for name in ("steps", "batch_size", "lr", "warmup_steps", "weight_decay", "clip_norm",
                 "seed", "eval_every", "min_lr"):
        assert name in s["settings"], name
    assert s["tokens"] == 2 * 2 * 4 * 16                 # steps * grad_accum * B * T tokens


def test_gradient_accumulation_is_the_mean_over_the_micro_batches(text):
    """Two micro-batches of 4 windows give the update of one batch of 8 (the same windows)."""
    settings = dict(steps=2, eval_every=2, warmup_steps=0)
    one, s1 = run(text, n_samples=0, baselines=False,
                  settings=tiny_settings(batch_size=8, **settings))
    two, s2 = run(text, n_samples=0, baselines=False, grad_accum=2,
                  settings=tiny_settings(batch_size=4, **settings))
    assert s1["loss_history"] == pytest.approx(s2["loss_history"], rel=1e-5)
    for k in one:
        np.testing.assert_allclose(one[k], two[k], rtol=1e-4, atol=1e-6, err_msg=k)
    three, _ = run(text, n_samples=0, baselines=False, grad_accum=3,
                   settings=tiny_settings(batch_size=4, **settings))
    assert not np.allclose(three["wte"], two["wte"])    # more windows: another update


def test_dropout_changes_the_training_but_not_the_evaluation(text):
    plain, s0 = run(text, n_samples=0, baselines=False, settings=tiny_settings(steps=2,
                                                                              eval_every=2))
    dropped, s1 = run(text, n_samples=0, baselines=False, model=dict(TINY_MODEL, dropout=0.3),
                      settings=tiny_settings(steps=2, eval_every=2))
    assert s0["evals"][0]["val_loss"] == pytest.approx(s1["evals"][0]["val_loss"], rel=1e-12)
    assert s0["loss_history"][0] != s1["loss_history"][0]


# ---------------------------------------------------------------------------------------
# What the other tools make: tokenizer files, token files, --init
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_run(text, tmp_path_factory):
    """A tiny BPE run and its folder (checkpoint, tokenizer.json)."""
    out = tmp_path_factory.mktemp("base") / "run"
    params, s = run(text, out=out, n_samples=0, settings=tiny_settings(steps=4, eval_every=4))
    return out, params, s


def test_a_run_folder_holds_its_tokenizer(base_run, text):
    out, _, s = base_run
    tok = load_tokenizer(str(out / pt.TOKENIZER_FILE))
    ck = pt.load_text_model(out)
    assert tokenizer_digest(tok) == tokenizer_digest(ck["tokenizer"])
    assert s["tokenizer_file"] == str(out / pt.TOKENIZER_FILE)
    assert tok.encode(text[:500]) == ck["tokenizer"].encode(text[:500])


def test_a_saved_tokenizer_is_used_as_it_is(base_run, text):
    out, _, _ = base_run
    tok = load_tokenizer(str(out / pt.TOKENIZER_FILE))
    _, s = run(text, tokenizer=tok, vocab_size=None, n_samples=0, tokenizer_source="t.json",
               settings=tiny_settings(steps=1, eval_every=1, warmup_steps=0))
    assert s["vocab_size"] == tok.vocab_size and s["tokenizer_source"] == "t.json"
    with pytest.raises(ValueError, match="vocab_size applies to a BPE tokenizer learnt here"):
        run(text, tokenizer=tok, vocab_size=300, n_samples=0)


def test_token_files_train_like_the_text_they_encode(base_run, text, tmp_path):
    """The ids of a token file (its header names the tokenizer) train the model the text
    would: same tokenizer, same streams, same run."""
    out, _, _ = base_run
    tok = load_tokenizer(str(out / pt.TOKENIZER_FILE))
    train, val = split_text(text)
    write_tokens(tmp_path / "train.bin", np.array(tok.encode(train)), vocab_size=tok.vocab_size,
                 tokenizer=tok.to_dict())
    write_tokens(tmp_path / "val.bin", np.array(tok.encode(val)), vocab_size=tok.vocab_size,
                 tokenizer=tok.to_dict())
    tokens = pt.read_token_file(tmp_path / "train.bin")
    val_tokens = pt.read_token_file(tmp_path / "val.bin", what="--val-tokens")
    assert tokenizer_digest(tokens[1]) == tokenizer_digest(tok)
    settings = tiny_settings(steps=3, eval_every=3)
    p_tok, s_tok = pt.pretrain(tokens=tokens, val_tokens=val_tokens, model=TINY_MODEL,
                               settings=settings, n_samples=0, tokens_source="train.bin",
                               out=tmp_path / "run")
    p_text, s_text = run(text, tokenizer=tok, vocab_size=None, settings=settings, n_samples=0)
    for k in p_tok:
        np.testing.assert_array_equal(p_tok[k], p_text[k])
    assert s_tok["val_bits_per_byte"] == s_text["val_bits_per_byte"]
    assert s_tok["ngram_bits_per_byte"] == pytest.approx(s_text["ngram_bits_per_byte"])
    assert s_tok["tokens_source"] == "train.bin" and s_tok["source"] is None
    _, again = pt.pretrain(out=tmp_path / "run", resume=True, changes={"steps": 4},
                           tokens=tokens, val_tokens=val_tokens, n_samples=0)
    assert again["steps"] == 4


def test_a_token_file_without_its_tokenizer(base_run, tmp_path):
    out, _, _ = base_run
    tok = load_tokenizer(str(out / pt.TOKENIZER_FILE))
    write_tokens(tmp_path / "bare.bin", np.array(tok.encode("hello world " * 50)),
                 vocab_size=tok.vocab_size)
    with pytest.raises(ValueError, match="does not name its tokenizer.*--tokenizer FILE"):
        pt.read_token_file(tmp_path / "bare.bin")
    ids, given = pt.read_token_file(tmp_path / "bare.bin", tok)
    assert given is tok and ids.size == len(tok.encode("hello world " * 50))
    write_tokens(tmp_path / "named.bin", np.array(tok.encode("hi there " * 50)),
                 vocab_size=tok.vocab_size, tokenizer=tok.to_dict())
    with pytest.raises(ValueError, match="another tokenizer than --tokenizer"):
        pt.read_token_file(tmp_path / "named.bin", make_tokenizer("byte", ""))


def test_init_starts_from_the_trained_model(base_run, text):
    """Held-out at step 0 of a run from --init is the init run's final figure (same text,
    same held-out split): the curve shows what --init brings."""
    out, params, s = base_run
    p, s2 = pt.pretrain(text=text, init=out, settings=tiny_settings(steps=2, eval_every=2),
                        n_samples=0)
    assert s2["evals"][0]["val_bits_per_byte"] == pytest.approx(s["val_bits_per_byte"],
                                                                rel=1e-12)
    assert s2["init"] == str(out) and s2["vocab_size"] == s["vocab_size"]
    fresh = run(text, n_samples=0, settings=tiny_settings(steps=2, eval_every=2))[1]
    assert s2["evals"][0]["val_bits_per_byte"] < fresh["evals"][0]["val_bits_per_byte"]
    _, s3 = pt.pretrain(text=text, init=out, model={"dropout": 0.2}, n_samples=0,
                        settings=tiny_settings(steps=1, eval_every=1, warmup_steps=0))
    assert s3["config"]["dropout"] == 0.2


def test_init_refuses_another_tokenizer_or_shape(base_run, text):
    out, _, _ = base_run
    with pytest.raises(ValueError, match="another tokenizer"):
        pt.pretrain(text=text, init=out, tokenizer=make_tokenizer("byte", ""), n_samples=0)
    with pytest.raises(ValueError, match="d_model is 32 but the model of init has 16"):
        pt.pretrain(text=text, init=out, model={"d_model": 32}, n_samples=0)
    with pytest.raises(ValueError, match="keeps its context"):
        pt.pretrain(text=text, init=out, model={"context": 8}, n_samples=0)
    with pytest.raises(ValueError, match="learnt from a text"):
        pt.pretrain(text=text, init=out, tokenizer="bpe", n_samples=0)


# ---------------------------------------------------------------------------------------
# The budget, re-planned
# ---------------------------------------------------------------------------------------

def test_the_budget_is_re_planned_from_the_measured_speed(monkeypatch):
    """A plan of 100 steps at first; the steps then take 0.5 s each: with 60 s left at the
    start and an evaluation of 1 s (the finish: FINISH_EVALS of them), the total moves to
    what fits (about 116 steps in all); when steps get slower, it moves down."""
    clock = {"t": 0.0}
    monkeypatch.setattr(pt.time, "perf_counter", lambda: clock["t"])
    replan = pt._replanner(deadline=60.0, eval_seconds=1.0, first_step=0)
    settings = TrainSettings(steps=100, warmup_steps=10, eval_every=10)
    history = {"step": 0}
    new = None
    for step in range(1, 11):
        clock["t"] = 0.5 * step
        history["step"] = step
        new = replan(history, settings) or new
    assert new is not None
    finish = pt.FINISH_EVALS * 1.0
    assert new.steps == 10 + int((60.0 - 5.0 - finish) / 0.5)
    assert new.warmup_steps == 10
    for step in range(11, 21):                      # now 2 s a step
        clock["t"] = 5.0 + 2.0 * (step - 10)
        history["step"] = step
        new = replan(history, new) or new
    per_step = 25.0 / 20
    assert new.steps == 20 + int((60.0 - 25.0 - finish) / per_step)


def test_a_budgeted_run_records_its_plan(text, monkeypatch):
    budget_in_cpu_seconds(monkeypatch, pt)         # 6 s of CPU, whatever else the machine runs
    _, s = run(text, minutes=0.1, n_samples=0, baselines=False)
    assert s["minutes"] == 0.1 and s["settings"]["minutes"] == 0.1
    assert s["steps"] >= 1 and s["evals"][-1]["step"] == s["steps"]


# ---------------------------------------------------------------------------------------
# Generation past the context window
# ---------------------------------------------------------------------------------------

def test_generation_past_the_context_window_reads_the_last_max_len_tokens(base_run):
    """Greedy tokens past the window: each is the argmax of the reference forward over the
    last max_len tokens; with and without the KV cache alike; inside the window, the fast
    generate's tokens."""
    out, _, _ = base_run
    ck = pt.load_text_model(out)
    params, config, tok = ck["params"], ck["model_config"], ck["tokenizer"]
    prompt = np.array(tok.encode("The value of "))
    n = 2 * config.max_len + 5
    cached = list(pt.generate_ids(params, config, prompt, max_new_tokens=n, temperature=0))
    plain = list(pt.generate_ids(params, config, prompt, max_new_tokens=n, temperature=0,
                                 use_cache=False))
    assert cached == plain and len(cached) == n
    from numpytfmr.gpt import gpt_forward
    seq = list(prompt)
    for token in cached:
        logits, _ = gpt_forward(params, np.array([seq[-config.max_len:]]), config=config)
        assert token == int(np.argmax(logits[0, -1]))
        seq.append(token)
    room = config.max_len - prompt.size + 1
    inside = fast.generate(params, prompt[None], config=config, max_new_tokens=room, top_k=1)
    assert cached[:room] == inside[0, prompt.size:].tolist()


def test_streamed_text_is_the_completion(base_run):
    out, _, _ = base_run
    ck = pt.load_text_model(out)
    args = (ck["params"], ck["model_config"], ck["tokenizer"], "If ")
    pieces = list(pt.stream_text(*args, max_new_tokens=40, temperature=0.9,
                                 rng=np.random.default_rng(5)))
    text, ids = pt.complete_text(*args, max_new_tokens=40, temperature=0.9,
                                 rng=np.random.default_rng(5))
    assert "".join(pieces) == text and len(ids) == 40 and len(pieces) > 1


def test_tokenizer_out_is_written_before_training_even_without_a_run_folder(text, tmp_path):
    from numpytfmr.run.tokenizers import tokenizer_digest
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    argv = ["pretrain", "--text", str(path), "--vocab-size", "280", "--steps", "2",
            "--eval-every", "2", "--batch-size", "4", "--context", "16", "--d-model", "16",
            "--n-layers", "1", "--n-heads", "2", "--out", "none", "--quiet", "--samples", "0",
            "--tokenizer-out", str(tmp_path / "tok.json"), "--summary", str(tmp_path / "s.json")]
    assert _main(argv) == 0
    tok = load_tokenizer(str(tmp_path / "tok.json"))
    assert tok.vocab_size == 280
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["tokenizer_out"] == str(tmp_path / "tok.json") and s["checkpoint"] is None
    assert tokenizer_digest(tok) == tokenizer_digest(make_tokenizer("bpe", split_text(text)[0],
                                                                    280))
