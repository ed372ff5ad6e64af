"""``numpytfmr pretrain`` and its harness (run/pretrain.py, run/corpus.py): the default corpus,
the text tokenizers, held-out bits per byte, nucleus sampling, a smoke run, exact resuming,
the summary and the command line. Tiny models and texts: seconds, not minutes."""
import json
import math

import numpy as np
import pytest

from numpytfmr import fast
from numpytfmr.gpt import GPTConfig, generate, init_gpt
from numpytfmr.run import pretrain as pt
from numpytfmr.run.checkpoint import load_checkpoint
from numpytfmr.run.corpus import default_corpus, split_text, stdlib_docstrings
from numpytfmr.run.data import tokenizer_from_dict
from numpytfmr.run.loop import TrainSettings
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
    tok = pt.make_tokenizer(kind, text[:5000], vocab)
    s = text[5000:6000] + " naïve café — ∑ 😀"      # characters not in the training text
    ids = pt.encode_text(tok, s)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == s
    assert pt.token_byte_lengths(tok)[ids].sum() == len(s.encode("utf-8"))
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
    here), steps planned from the measured speed."""
    monkeypatch.setattr(pt, "default_corpus", lambda: text)
    monkeypatch.setitem(pt.PRETRAIN_DEFAULTS, "minutes", 0.05)
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
