"""``numpytfmr train``, ``generate`` and ``train-seq2seq`` end to end, with tiny settings."""
import importlib.util
import json
import os

import numpy as np
import pytest

from numpytfmr.run.cli import main
from numpytfmr.run.checkpoint import load_checkpoint, load_model

TINY_GPT = ["--steps", "16", "--batch-size", "16", "--d-model", "16", "--n-layers", "1",
            "--n-heads", "2", "--max-prompt-len", "4", "--n-test", "20", "--eval-every", "8",
            "--lr", "0.01", "--quiet"]
SUMMARY_KEYS = {"exact_match", "loss", "steps", "seconds", "tokens_per_second", "config"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny GPT run shared by the tests below: (run directory, summary)."""
    tmp = tmp_path_factory.mktemp("gpt")
    assert main(["train", *TINY_GPT, "--out", str(tmp / "run"),
                 "--summary", str(tmp / "summary.json")]) == 0
    return tmp / "run", json.loads((tmp / "summary.json").read_text())


def test_train_writes_a_summary_and_a_checkpoint(trained, capsys):
    run, summary = trained
    assert SUMMARY_KEYS <= set(summary)
    assert summary["steps"] == 16 and summary["task"] == "sort"
    assert 0.0 <= summary["exact_match"] <= 1.0 and summary["seconds"] > 0
    assert summary["config"]["d_model"] == 16 and summary["config"]["n_kv_heads"] == 2
    assert summary["config"]["d_ff"] == 64                  # 4 d_model when not given
    assert [e["step"] for e in summary["evals"]] == [8, 16]
    ck = load_checkpoint(run)
    assert ck["state"]["step"] == 16 and ck["state"]["loss"] == summary["loss_history"]
    curves = ["curves.png"] if importlib.util.find_spec("matplotlib") else []
    assert sorted(os.listdir(run)) == ["checkpoint.json", *curves, "optimizer-000016.npz",
                                       "weights-000016.npz"]
    assert summary["plot"] == (str(run / "curves.png") if curves else None)


def test_generate_with_and_without_cache_agree(trained, capsys):
    run, _ = trained
    outputs = []
    for prompt, extra in (("3142", []), ("3142", ["--no-cache"]), ("<bos>3142<sep>", ["--raw"])):
        assert main(["generate", "--checkpoint", str(run), "--prompt", prompt, *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]
    text = outputs[0].strip()
    assert set(text) <= set("0123456789abcdefghijklmnopqrstuvwxyz()[]{} +-=.,")
    # the same answer computed from the checkpoint directly
    from numpytfmr.run.tasks import complete
    ck = load_model(run)
    expected, _ = complete(ck["params"], ck["model_config"], ck["tokenizer"], "3142")
    assert text == expected


def test_generate_samples_reproducibly(trained, capsys):
    run, _ = trained
    args = ["generate", "--checkpoint", str(run), "--prompt", "12", "--temperature", "1.5",
            "--top-k", "5", "--seed", "4", "--max-new-tokens", "5"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert len(first.strip()) <= 5


@pytest.mark.parametrize("prompt, message", [
    ("31X2", "unknown character 'X'"),
    ("1234567890", "reads at most max_len=11"),
    ("<bos>12", "holds the special token <bos>"),
])
def test_generate_refuses_bad_prompts(trained, capsys, prompt, message):
    run, _ = trained
    assert main(["generate", "--checkpoint", str(run), "--prompt", prompt]) == 2
    err = capsys.readouterr().err
    assert err.startswith("numpytfmr generate: error:") and message in err


def test_generate_refuses_missing_and_corrupt_checkpoints(trained, tmp_path, capsys):
    run, _ = trained
    assert main(["generate", "--checkpoint", str(tmp_path / "none"), "--prompt", "1"]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint is" in err and "does not exist" in err
    (tmp_path / "empty").mkdir()
    assert main(["generate", "--checkpoint", str(tmp_path / "empty"), "--prompt", "1"]) == 2
    assert "holds no checkpoint.json" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(run):
        (bad / name).write_bytes((run / name).read_bytes())
    weights = bad / "weights-000016.npz"
    weights.write_bytes(weights.read_bytes()[:1000])                 # truncated
    assert main(["generate", "--checkpoint", str(bad), "--prompt", "1"]) == 2
    assert "truncated, corrupt or was replaced" in capsys.readouterr().err
    (bad / "checkpoint.json").write_text("{not json")
    assert main(["generate", "--checkpoint", str(bad), "--prompt", "1"]) == 2
    assert "not a readable checkpoint record" in capsys.readouterr().err


def test_generate_refuses_a_config_that_does_not_fit_the_weights(trained, tmp_path, capsys):
    run, _ = trained
    bad = tmp_path / "mismatch"
    bad.mkdir()
    for name in os.listdir(run):
        (bad / name).write_bytes((run / name).read_bytes())
    meta = json.loads((bad / "checkpoint.json").read_text())
    meta["config"]["n_layers"] = 2
    (bad / "checkpoint.json").write_text(json.dumps(meta))
    assert main(["generate", "--checkpoint", str(bad), "--prompt", "1"]) == 2
    assert "do not match its config" in capsys.readouterr().err


def test_train_resume_extends_the_run(trained, tmp_path, capsys):
    run, summary = trained
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in os.listdir(run):
        (copy / name).write_bytes((run / name).read_bytes())
    assert main(["train", "--resume", "--out", str(copy), "--steps", "20", "--quiet",
                 "--summary", str(tmp_path / "s.json")]) == 0
    resumed = json.loads((tmp_path / "s.json").read_text())
    assert resumed["steps"] == 20 and resumed["loss_history"][:16] == summary["loss_history"]
    assert resumed["config"] == summary["config"]
    # a setting that would make it another run is refused, and nothing is written
    before = {n: (copy / n).read_bytes() for n in os.listdir(copy)}
    assert main(["train", "--resume", "--out", str(copy), "--lr", "0.5", "--quiet",
                 "--summary", str(tmp_path / "s2.json")]) == 2
    err = capsys.readouterr().err
    assert "lr is 0.5 but the run" in err
    assert {n: (copy / n).read_bytes() for n in os.listdir(copy)} == before
    assert not (tmp_path / "s2.json").exists()


def test_train_bad_input_leaves_no_files(tmp_path, capsys):
    out, summary = tmp_path / "run", tmp_path / "s.json"
    cases = [(["--n-heads", "3"], "divisible by n_heads"),
             (["--steps", "0"], "--steps is 0"),
             (["--resume"], "no checkpoint")]
    for extra, message in cases:
        code = main(["train", *TINY_GPT, "--out", str(out), "--summary", str(summary), *extra])
        assert code == 2
        err = capsys.readouterr().err
        assert err.startswith("numpytfmr train: error:") and message in err, err
        assert not out.exists() and not summary.exists()
        assert os.listdir(tmp_path) == []


def test_a_run_that_fails_midway_keeps_its_last_complete_checkpoint(tmp_path, monkeypatch, capsys):
    """A crash after the first checkpoint: the directory holds exactly that checkpoint."""
    import numpytfmr.run.tasks as tasks
    real = tasks.evaluate_gpt
    calls = []

    def evaluate_then_crash(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("simulated failure during the second evaluation")
        return real(*args, **kwargs)
    monkeypatch.setattr(tasks, "evaluate_gpt", evaluate_then_crash)
    out = tmp_path / "run"
    assert main(["train", *TINY_GPT, "--out", str(out), "--summary",
                 str(tmp_path / "s.json")]) == 2
    assert "simulated failure" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["checkpoint.json", "optimizer-000008.npz",
                                       "weights-000008.npz"]
    assert load_model(out)["state"]["step"] == 8
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("model, extra", [
    ("transformer", ["--d-model", "16", "--n-heads", "2", "--n-layers", "1"]),
    ("rnn", ["--d-hidden", "16", "--d-emb", "8"]),
])
def test_train_seq2seq_end_to_end(model, extra, tmp_path, capsys):
    out, summary = tmp_path / "run", tmp_path / "s.json"
    assert main(["train-seq2seq", "--model", model, *extra, "--steps", "12", "--batch-size", "16",
                 "--n-test", "20", "--eval-every", "6", "--quiet", "--out", str(out),
                 "--summary", str(summary)]) == 0
    printed = capsys.readouterr().out
    s = json.loads(summary.read_text())
    assert SUMMARY_KEYS <= set(s) and s["steps"] == 12
    assert s["model"] == ("encdec" if model == "transformer" else "rnn")
    # the alignment table: a header with the source words, one row per target word
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["i", "am", "a", "student"])
    rows = [line.split() for line in lines[header + 1:]
            if line.strip() and not line.startswith("curves: ")]
    assert len(rows) == len(s["alignment"]["target"]) and all(len(r) == 5 for r in rows)
    w = np.array(s["alignment"]["weights"])
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)
    # the checkpoint translates through `generate`
    assert main(["generate", "--checkpoint", str(out), "--prompt", "she is a doctor"]) == 0
    words = capsys.readouterr().out.split()
    assert all(w in load_model(out)["tgt_tokenizer"].tokens for w in words)


def test_train_seq2seq_refuses_options_of_the_other_model(tmp_path, capsys):
    assert main(["train-seq2seq", "--model", "rnn", "--n-heads", "2", "--out",
                 str(tmp_path / "r")]) == 2
    assert "--n-heads applies to --model transformer" in capsys.readouterr().err
    assert main(["train-seq2seq", "--sentence", "i am a cow", "--out", str(tmp_path / "r")]) == 2
    assert "unknown word 'cow'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_ctrl_c_saves_the_run_and_says_how_to_resume(tmp_path, monkeypatch, capsys):
    import numpytfmr.run.tasks as tasks
    real = tasks.evaluate_gpt
    calls = []

    def evaluate_then_interrupt(*args, **kwargs):
        calls.append(1)
        result = real(*args, **kwargs)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return result
    monkeypatch.setattr(tasks, "evaluate_gpt", evaluate_then_interrupt)
    out = tmp_path / "run"
    assert main(["train", *TINY_GPT, "--out", str(out)]) == 130
    assert f"continue with: numpytfmr train --resume --out {out}" in capsys.readouterr().err
    assert load_checkpoint(out)["state"]["step"] == 8
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0
    assert load_checkpoint(out)["state"]["step"] == 16
