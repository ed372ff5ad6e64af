"""Usage errors and commands that must not lose work (issue #16, item 8).

Every usage error of every command exits with status 2 and one line on stderr that names
the flag, without a traceback (status 1 stays "checks or tests failed"); training never
replaces a previous run without ``--resume`` or ``--force``; ``generate`` refuses prompt
characters its model never saw and warns about prompts longer than training's.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import COMMAND_TIMEOUT
from numpytfmr.run.cli import main

TINY = ["--steps", "2", "--batch-size", "8", "--d-model", "16", "--n-layers", "1", "--n-heads",
        "2", "--n-test", "5", "--eval-every", "2", "--quiet"]
TINY_SEQ2SEQ = ["--steps", "2", "--batch-size", "8", "--n-test", "5", "--eval-every", "2",
                "--quiet"]


def one_line_error(capsys, command, *needles):
    """stderr is exactly one line ``numpytfmr COMMAND: error: ...`` holding every needle."""
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{command}: error: "), lines[0]
    assert "Traceback" not in captured.err + captured.out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A GPT trained for two steps on sort, prompts of 1 to 4 digits (context 11)."""
    out = tmp_path_factory.mktemp("gpt") / "run"
    assert main(["train", *TINY, "--max-prompt-len", "4", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rnn") / "run"
    assert main(["train-seq2seq", "--model", "rnn", "--d-hidden", "8", "--d-emb", "4",
                 *TINY_SEQ2SEQ, "--out", str(out)]) == 0
    return out


# ---------------------------------------------------------------------------------------
# bad flag values: caught while parsing, named in one line
# ---------------------------------------------------------------------------------------

MISSING = "/nonexistent-h2/dir"

BAD_VALUES = [
    (["check", "--seed", "-1"], "--seed is -1; expected an integer >= 0"),
    (["check", "--seed", "x"], "--seed is 'x'"),
    (["check", "--op", "no_such_op"], "--op: unknown op 'no_such_op'"),
    (["check", "--mode", "half"], "--mode: invalid choice: 'half'"),
    (["train", "--steps", "0"], "--steps is 0; expected an integer >= 1"),
    (["train", "--steps", "-3"], "--steps is -3"),
    (["train", "--steps", "2.5"], "--steps is 2.5"),
    (["train", "--batch-size", "0"], "--batch-size is 0"),
    (["train", "--lr", "0"], "--lr is 0; expected a finite number > 0"),
    (["train", "--lr", "nan"], "--lr is nan"),
    (["train", "--warmup", "-1"], "--warmup is -1; expected an integer >= 0"),
    (["train", "--weight-decay", "-0.1"], "--weight-decay is -0.1"),
    (["train", "--clip", "0"], "--clip is 0"),
    (["train", "--seed", "-1"], "--seed is -1"),
    (["train", "--eval-every", "0"], "--eval-every is 0"),
    (["train", "--threads", "0"], "--threads is 0"),
    (["train", "--task", "sing"], "--task: invalid choice: 'sing'"),
    (["train", "--d-model", "0"], "--d-model is 0"),
    (["train", "--n-test", "0"], "--n-test is 0"),
    (["train", "--n-heads", "3"], "--n-heads 3: GPTConfig: d_model is 64 and n_heads is 3"),
    (["train", "--warmup", "10", "--steps", "5"], "--warmup is 10 but the run has 5 steps"),
    (["train", "--min-prompt-len", "5", "--max-prompt-len", "3"],
     "--min-prompt-len is 5 but --max-prompt-len is 3"),
    (["train", "--summary", f"{MISSING}/s.json"],
     f"--summary is '{MISSING}/s.json', but the directory {MISSING} does not exist"),
    (["train", "--steps"], "--steps: expected one argument"),
    (["train", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["train-seq2seq", "--model", "lstm"], "--model: invalid choice: 'lstm'"),
    (["train-seq2seq", "--model", "rnn", "--n-heads", "2"], "--n-heads applies to --model "
                                                            "transformer only"),
    (["train-seq2seq", "--sentence", "i am a cow or a xyz"],
     "--sentence 'i am a cow or a xyz' has the unknown words 'cow', 'or', 'xyz'"),
    (["train-seq2seq", "--sentence", " "], "--sentence is empty"),
    (["train-seq2seq", "--d-hidden", "0"], "--d-hidden is 0"),
    (["generate", "--prompt", "1", "--checkpoint", MISSING],
     f"--checkpoint is '{MISSING}', which does not exist"),
    (["generate", "--prompt", "1", "--temperature", "-1"],
     "--temperature is -1; expected a finite number >= 0"),
    (["generate", "--prompt", "1", "--top-k", "0"], "--top-k is 0"),
    (["generate", "--prompt", "1", "--max-new-tokens", "0"], "--max-new-tokens is 0"),
    (["generate", "--prompt", "1", "--seed", "-2"], "--seed is -2"),
    (["generate", "--prompt", "1"], "--checkpoint is 'runs/gpt', which does not exist"),
    (["lora", "--rank", "0"], "--rank is 0"),
    (["lora", "--alpha", "-1"], "--alpha is -1"),
    (["lora", "--targets", "Wq,Wx"], "--targets is 'Wq,Wx'"),
    (["lora", "--base-task", "dyck"], "--base-task is 'dyck'"),
    (["lora", "--checkpoint", MISSING], f"--checkpoint is '{MISSING}'"),
    (["dpo", "--beta", "0"], "--beta is 0"),
    (["dpo", "--nll-weight", "-1"], "--nll-weight is -1; expected a finite number >= 0"),
    (["dpo", "--n-prompts", "0"], "--n-prompts is 0"),
    (["bench", "--threads", "0"], "--threads is 0"),
    (["bench", "--attention-n", "64", "0"], "--attention-n is 0"),
    (["bench", "--repeat", "-1"], "--repeat is -1"),
    (["bench", "--summary", f"{MISSING}/b.json"], "--summary is"),
    (["examples", "no_such_example"], "unknown example 'no_such_example'"),
]


@pytest.mark.parametrize("argv, message", BAD_VALUES, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else None)
def test_a_bad_flag_value_is_one_line_naming_the_flag(argv, message, capsys, tmp_path,
                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)                 # default outputs (runs/...) land here
    if argv[0] in ("lora", "dpo", "train", "train-seq2seq") and "--out" not in argv:
        argv = argv + ["--out", "none"]
    assert main(argv) == 2
    one_line_error(capsys, f"numpytfmr {argv[0]}", message)
    assert os.listdir(tmp_path) == []          # nothing written, nothing trained


def test_an_unknown_command_is_a_usage_error(capsys):
    assert main(["trian"]) == 2
    one_line_error(capsys, "numpytfmr", "invalid choice: 'trian'")


def test_help_and_version_return_0_in_process(capsys):
    assert main(["train", "--help"]) == 0
    assert "--force" in capsys.readouterr().out
    assert main(["--version"]) == 0


def test_paths_that_cannot_be_used(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [
        (["train", "--out", str(a_file)], f"--out is '{a_file}', which is a file"),
        (["train", "--out", str(a_file / "sub")], f"but {a_file} is a file, not a directory"),
        (["train", "--out", "none", "--summary", str(tmp_path)], "which is a directory"),
        (["train", "--resume", "--out", str(tmp_path / "nothing")],
         f"--resume: no checkpoint in {tmp_path / 'nothing'} (--out)"),
        (["train", "--resume", "--out", "none"], "--resume needs the run's directory --out DIR"),
        (["train", "--resume", "--force", "--out", str(tmp_path / "r")],
         "--resume continues the run in --out and --force replaces it"),
        (["generate", "--checkpoint", str(tmp_path), "--prompt", "1"],
         "holds no checkpoint.json"),
        (["train-seq2seq", "--resume", "--out", str(tmp_path / "nothing")], "--resume: no "
                                                                           "checkpoint in"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        one_line_error(capsys, f"numpytfmr {argv[0]}", message)
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads and writes whatever the mode bits say")
def test_unreadable_and_unwritable_paths(tmp_path, capsys, gpt_run):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        assert main(["train", "--out", "none", "--summary", str(locked / "s.json")]) == 2
        one_line_error(capsys, "numpytfmr train", "--summary is", "not writable")
        assert main(["train", "--out", str(locked / "run")]) == 2
        one_line_error(capsys, "numpytfmr train", "--out is", "not writable")
    finally:
        os.chmod(locked, 0o700)
    record = tmp_path / "checkpoint.json"
    record.write_text((gpt_run / "checkpoint.json").read_text())
    os.chmod(record, 0)
    assert main(["generate", "--checkpoint", str(record), "--prompt", "1"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--checkpoint is", "not readable")


def test_paths_without_permission(tmp_path, capsys, gpt_run, monkeypatch):
    """The same refusals where the permission bits cannot be relied on (as root): the
    checks ask ``os.access``, here made to deny the paths of the test."""
    locked = tmp_path / "locked"
    locked.mkdir()
    record = tmp_path / "checkpoint.json"
    record.write_text((gpt_run / "checkpoint.json").read_text())
    real_access = os.access

    def access(path, mode, **kwargs):
        if os.path.abspath(path) in (str(locked), str(record)):
            return False
        return real_access(path, mode, **kwargs)
    monkeypatch.setattr(os, "access", access)
    assert main(["train", "--out", "none", "--summary", str(locked / "s.json")]) == 2
    one_line_error(capsys, "numpytfmr train", "--summary is", "not writable")
    assert main(["train", "--out", str(locked / "run" / "deeper")]) == 2
    one_line_error(capsys, "numpytfmr train", "--out is", f"but {locked} is not writable")
    assert main(["generate", "--checkpoint", str(record), "--prompt", "1"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--checkpoint is", "not readable")
    assert os.listdir(locked) == []


def test_a_corrupt_checkpoint_names_the_flag(gpt_run, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(gpt_run):
        (bad / name).write_bytes((gpt_run / name).read_bytes())
    (bad / "checkpoint.json").write_text("{not json")
    assert main(["generate", "--checkpoint", str(bad), "--prompt", "1"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--checkpoint: ", "not a readable checkpoint")
    assert main(["train", "--resume", "--out", str(bad)]) == 2
    one_line_error(capsys, "numpytfmr train", "--resume: ", "not a readable checkpoint")
    assert main(["lora", "--checkpoint", str(bad), "--out", "none", "--quiet"]) == 2
    one_line_error(capsys, "numpytfmr lora", "--checkpoint: ", "not a readable checkpoint")


def test_a_file_error_while_running_is_one_line_with_status_2(monkeypatch, tmp_path, capsys):
    from numpytfmr.shared import fileio

    def refuse(path, metrics):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(fileio, "write_summary", refuse)
    assert main(["train", *TINY, "--out", "none", "--summary", str(tmp_path / "s.json")]) == 2
    one_line_error(capsys, "numpytfmr train", "Permission denied", str(tmp_path / "s.json"))


def test_a_failing_check_is_still_status_1(monkeypatch, capsys):
    """1 means "checks failed", never a usage error."""
    import dataclasses

    from numpytfmr.registry import registry
    spec = registry()["relu"]
    monkeypatch.setitem(registry(), "relu", dataclasses.replace(
        spec, backward=lambda dout, cache: spec.backward(dout, cache) * 3.0))
    assert main(["check", "--op", "relu", "--seed", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["check", "--seed", "-1"], "numpytfmr check: error: --seed is -1"),
    (["generate", "--checkpoint", MISSING, "--prompt", "1"], "--checkpoint is"),
    (["train", "--summary", f"{MISSING}/s.json"], "--summary is"),
])
def test_the_installed_program_exits_2_with_one_line(argv, message):
    proc = subprocess.run([sys.executable, "-m", "numpytfmr", *argv], capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------------------------------
# no command overwrites a previous run without --resume or --force
# ---------------------------------------------------------------------------------------

def snapshot(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_train_refuses_a_directory_holding_a_run(gpt_run, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for name in os.listdir(gpt_run):
        (run / name).write_bytes((gpt_run / name).read_bytes())
    before = snapshot(run)
    assert main(["train", *TINY, "--out", str(run), "--summary", str(tmp_path / "s.json")]) == 2
    one_line_error(capsys, "numpytfmr train", f"--out {run} already holds a checkpoint",
                   "--resume", "--force")
    assert snapshot(run) == before and not (tmp_path / "s.json").exists()
    # any file counts: a directory of someone's notes is not replaced either
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    assert main(["train", *TINY, "--out", str(notes)]) == 2
    one_line_error(capsys, "numpytfmr train", "already holds files")
    assert snapshot(notes) == {"todo.txt": b"keep me"}
    # --resume continues the run, --force replaces it
    assert main(["train", "--resume", "--steps", "3", "--out", str(run), "--quiet"]) == 0
    from numpytfmr.run.checkpoint import load_checkpoint
    assert load_checkpoint(run)["state"]["step"] == 3
    assert main(["train", *TINY, "--seed", "5", "--out", str(run), "--force"]) == 0
    ck = load_checkpoint(run)
    assert ck["state"]["step"] == 2 and ck["settings"]["seed"] == 5
    assert sorted(set(os.listdir(run)) - {"curves.png"}) == [
        "checkpoint.json", "optimizer-000002.npz", "weights-000002.npz"]
    # an empty directory is not work: no --force needed
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", *TINY, "--out", str(empty)]) == 0


def test_train_seq2seq_keeps_one_default_directory_per_model(tmp_path, monkeypatch, capsys):
    from numpytfmr.run.checkpoint import load_checkpoint
    monkeypatch.chdir(tmp_path)
    assert main(["train-seq2seq", "--d-model", "16", "--n-heads", "2", "--n-layers", "1",
                 *TINY_SEQ2SEQ]) == 0
    transformer = snapshot(tmp_path / "runs" / "seq2seq-transformer")
    assert main(["train-seq2seq", "--model", "rnn", "--d-hidden", "8", "--d-emb", "4",
                 *TINY_SEQ2SEQ]) == 0
    assert sorted(os.listdir(tmp_path / "runs")) == ["seq2seq-rnn", "seq2seq-transformer"]
    assert snapshot(tmp_path / "runs" / "seq2seq-transformer") == transformer
    assert load_checkpoint(tmp_path / "runs" / "seq2seq-transformer")["kind"] == "encdec"
    assert load_checkpoint(tmp_path / "runs" / "seq2seq-rnn")["kind"] == "rnn"
    capsys.readouterr()
    # training the rnn again into its directory needs --resume or --force
    rnn = snapshot(tmp_path / "runs" / "seq2seq-rnn")
    assert main(["train-seq2seq", "--model", "rnn", *TINY_SEQ2SEQ]) == 2
    one_line_error(capsys, "numpytfmr train-seq2seq",
                   f"--out {os.path.join('runs', 'seq2seq-rnn')} already holds a checkpoint")
    assert snapshot(tmp_path / "runs" / "seq2seq-rnn") == rnn
    assert main(["train-seq2seq", "--model", "rnn", "--resume", "--steps", "3",
                 "--quiet"]) == 0
    assert load_checkpoint(tmp_path / "runs" / "seq2seq-rnn")["state"]["step"] == 3
    assert snapshot(tmp_path / "runs" / "seq2seq-transformer") == transformer


def test_lora_refuses_an_out_holding_files(tmp_path, capsys):
    out = tmp_path / "lora"
    out.mkdir()
    (out / "adapters.npz").write_bytes(b"earlier work")
    assert main(["lora", "--out", str(out), "--quiet"]) == 2
    one_line_error(capsys, "numpytfmr lora", f"--out {out} already holds files", "--force")
    assert main(["dpo", "--out", str(out), "--quiet"]) == 2
    line = one_line_error(capsys, "numpytfmr dpo", "already holds files")
    assert "--resume" not in line                # dpo has no --resume to offer
    assert snapshot(out) == {"adapters.npz": b"earlier work"}


# ---------------------------------------------------------------------------------------
# generate: prompts the model cannot read
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("prompt, message", [
    ("31a2", "--prompt '31a2' has the unknown character 'a'; the model knows only "
             "'0123456789' (sort prompts)"),
    ("abc", "the unknown characters 'a', 'b', 'c'"),
    ("1 2", "the unknown character ' '"),
    ("3<1", "the unknown character '<'"),
    ("9Z9Z", "the unknown character 'Z'"),
])
def test_generate_refuses_characters_the_model_never_saw(gpt_run, prompt, message, capsys):
    assert main(["generate", "--checkpoint", str(gpt_run), "--prompt", prompt]) == 2
    one_line_error(capsys, "numpytfmr generate", message)


def test_generate_refuses_unknown_characters_in_a_raw_prompt(gpt_run, capsys):
    assert main(["generate", "--checkpoint", str(gpt_run), "--raw",
                 "--prompt", "<bos>3a<sep>"]) == 2
    one_line_error(capsys, "numpytfmr generate", "the unknown character 'a'")
    assert main(["generate", "--checkpoint", str(gpt_run), "--raw",
                 "--prompt", "<bos>31<sep>"]) == 0
    assert capsys.readouterr().err == ""


def test_generate_warns_about_a_prompt_longer_than_training(gpt_run, capsys):
    assert main(["generate", "--checkpoint", str(gpt_run), "--prompt", "3142"]) == 0
    assert capsys.readouterr().err == ""                       # 4 digits: seen in training
    assert main(["generate", "--checkpoint", str(gpt_run), "--prompt", "31425"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "numpytfmr generate: warning: --prompt has 5 characters but the model was trained on "
        "prompts of at most 4; its answer may be wrong"]
    assert len(captured.out.splitlines()) == 1                 # the answer is still printed
    assert main(["generate", "--checkpoint", str(gpt_run), "--raw",
                 "--prompt", "<bos>31425<sep>"]) == 0
    assert "prompts of at most 4" in capsys.readouterr().err


def test_generate_with_an_older_checkpoint(gpt_run, tmp_path, capsys):
    """A checkpoint without the training record: the task name still gives the characters,
    and without any task the tokenizer's; no length, no warning."""
    old = tmp_path / "old"
    old.mkdir()
    for name in os.listdir(gpt_run):
        (old / name).write_bytes((gpt_run / name).read_bytes())
    record = json.loads((old / "checkpoint.json").read_text())
    assert record["task"]["symbols"] == "0123456789"
    assert record["task"]["max_prompt_len"] == 4
    record["task"] = {"task": "sort", "n_test": 5}              # no symbols, no lengths
    (old / "checkpoint.json").write_text(json.dumps(record))
    assert main(["generate", "--checkpoint", str(old), "--prompt", "31a2"]) == 2
    one_line_error(capsys, "numpytfmr generate", "the unknown character 'a'")
    assert main(["generate", "--checkpoint", str(old), "--prompt", "31425"]) == 0
    assert capsys.readouterr().err == ""
    del record["task"]
    (old / "checkpoint.json").write_text(json.dumps(record))
    assert main(["generate", "--checkpoint", str(old), "--prompt", "ab"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["generate", "--checkpoint", str(old), "--prompt", "aB"]) == 2
    one_line_error(capsys, "numpytfmr generate", "the unknown character 'B'")


def test_generate_positions_and_length_limits_name_the_flag(gpt_run, capsys):
    assert main(["generate", "--checkpoint", str(gpt_run), "--prompt", "1234567890"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--prompt is 12 tokens long",
                   "reads at most max_len=11")
    assert main(["generate", "--checkpoint", str(gpt_run), "--prompt", "12",
                 "--max-new-tokens", "9"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--max-new-tokens is 9 but a prompt of 4 "
                   "tokens leaves room for 8")
    assert main(["generate", "--checkpoint", str(gpt_run), "--prompt", "<sep>1"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--prompt '<sep>1' holds the special token "
                   "<sep>")
    assert main(["generate", "--checkpoint", str(gpt_run)]) == 2
    one_line_error(capsys, "numpytfmr generate", "the following arguments are required: "
                   "--prompt")


def test_generate_translation_prompts(rnn_run, capsys):
    assert main(["generate", "--checkpoint", str(rnn_run), "--prompt",
                 "the cat sees a cow and a hen"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--prompt 'the cat sees a cow and a hen' has "
                   "the unknown words 'cow', 'and', 'hen'")
    assert main(["generate", "--checkpoint", str(rnn_run), "--prompt", "the <bos> cat"]) == 2
    one_line_error(capsys, "numpytfmr generate", "the unknown word '<bos>'")
    assert main(["generate", "--checkpoint", str(rnn_run), "--prompt", "i am a student"]) == 0
    assert capsys.readouterr().err == ""
    long = "the black cat sees the white house the"
    assert main(["generate", "--checkpoint", str(rnn_run), "--prompt", long]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "numpytfmr generate: warning: --prompt has 8 words but the model was trained on "
        "sentences of at most 7; its translation may be wrong"]
    assert main(["generate", "--checkpoint", str(rnn_run), "--prompt", "the cat",
                 "--temperature", "1"]) == 2
    one_line_error(capsys, "numpytfmr generate", "--temperature: the checkpoint holds a 'rnn'")


# ---------------------------------------------------------------------------------------
# The learner's pipeline: every bad combination of pretrain, lora, dpo, generate, export
# flags is one line naming the flag and what to pass instead (issue #26, item 8)
# ---------------------------------------------------------------------------------------

TINY_TEXT = ["--steps", "2", "--eval-every", "2", "--batch-size", "4", "--context", "16",
             "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--quiet", "--samples",
             "0"]


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """A text, a tiny BPE run, its tokenizer file, a token file that names it and one that
    does not, a byte-level run, and JSON-lines data with bad rows."""
    from numpytfmr.run.batches import write_tokens
    from numpytfmr.run.corpus import default_corpus
    from numpytfmr.run.tokenizers import load_tokenizer
    tmp = tmp_path_factory.mktemp("learner")
    text = default_corpus(max_bytes=12_000)
    (tmp / "own.txt").write_text(text, encoding="utf-8")
    assert main(["pretrain", "--text", str(tmp / "own.txt"), "--vocab-size", "300",
                 *TINY_TEXT, "--out", str(tmp / "run"), "--tokenizer-out",
                 str(tmp / "tok.json")]) == 0
    assert main(["pretrain", "--text", str(tmp / "own.txt"), "--tokenizer", "byte",
                 *TINY_TEXT, "--out", str(tmp / "byte-run")]) == 0
    assert main(["tokenize", "--text", str(tmp / "own.txt"), "--tokenizer",
                 str(tmp / "tok.json"), "-o", str(tmp / "own.bin"), "--quiet"]) == 0
    tok = load_tokenizer(str(tmp / "tok.json"))
    import numpy as np
    write_tokens(tmp / "bare.bin", np.array(tok.encode(text)), vocab_size=tok.vocab_size)
    rows = [{"prompt": "The value ", "completion": "is returned."}] * 6
    (tmp / "pc.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    bad = ['{"prompt": "a ", "completion": "b"}', '{"prompt": "a "}', "not json",
           '{"prompt": "", "completion": "b"}', '{"prompt": "a", "completion": 3}']
    (tmp / "bad.jsonl").write_text("\n".join(bad) + "\n")
    prefs = [{"prompt": "The value ", "chosen": "is returned.", "rejected": "is lost."}] * 6
    (tmp / "prefs.jsonl").write_text("\n".join(json.dumps(r) for r in prefs) + "\n")
    (tmp / "bad-prefs.jsonl").write_text('{"prompt": "a", "chosen": "b"}\n'
                                         '{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    (tmp / "tiny.txt").write_text("a", encoding="utf-8")
    return tmp


def _paths(argv, tmp):
    return [a.replace("@", str(tmp) + "/") if isinstance(a, str) else a for a in argv]


LEARNER_ERRORS = [
    # pretrain: the data
    (["pretrain", "--tokens", "@own.bin", "--text", "@own.txt"], "--tokens and --text"),
    (["pretrain", "--tokens", "@own.bin", "--val-text", "@own.txt"], "--tokens and --val-text"),
    (["pretrain", "--val-tokens", "@own.bin"], "--val-tokens goes with --tokens"),
    (["pretrain", "--tokens", "@bare.bin"], "--tokens"),
    (["pretrain", "--tokens", "@own.txt"], "--tokens"),
    (["pretrain", "--tokens", "@own.bin", "--tokenizer", "bpe"], "--tokenizer bpe"),
    (["pretrain", "--tokens", "@own.bin", "--tokenizer", "byte"], "another tokenizer"),
    (["pretrain", "--tokens", "@own.bin", "--vocab-size", "300"], "--vocab-size"),
    (["pretrain", "--text", "@own.txt", "--tokenizer", "@tok.json", "--vocab-size", "300"],
     "--vocab-size"),
    (["pretrain", "--text", "@own.txt", "--tokenizer", "char", "--vocab-size", "300"],
     "--vocab-size"),
    (["pretrain", "--tokenizer", "@missing.json"], "--tokenizer"),
    (["pretrain", "--tokenizer", "@own.txt"], "--tokenizer"),
    (["pretrain", "--text", "@own.txt", "--tokenizer-out", "@tok.json"], "--tokenizer-out"),
    # pretrain: --init
    (["pretrain", "--text", "@own.txt", "--init", "@run", "--d-model", "32"], "--d-model"),
    (["pretrain", "--text", "@own.txt", "--init", "@run", "--context", "8"], "--context"),
    (["pretrain", "--text", "@own.txt", "--init", "@run", "--tokenizer", "bpe"],
     "--tokenizer bpe"),
    (["pretrain", "--text", "@own.txt", "--init", "@byte-run", "--tokenizer", "@tok.json"],
     "--init"),
    (["pretrain", "--tokens", "@own.bin", "--init", "@byte-run"], "--init"),
    (["pretrain", "--text", "@own.txt", "--init", "@missing"], "--init"),
    (["pretrain", "--resume", "--init", "@run", "--out", "@run"], "--init"),
    (["pretrain", "--resume", "--tokenizer", "@tok.json", "--out", "@run"], "--tokenizer"),
    (["pretrain", "--resume", "--tokenizer-out", "@t2.json", "--out", "@run"],
     "--tokenizer-out"),
    (["pretrain", "--dropout", "1.5"], "--dropout"),
    (["pretrain", "--grad-accum", "0"], "--grad-accum"),
    (["pretrain", "--text", "@own.txt", "--plot", "@nodir/x.png"], "--plot"),
    # lora and dpo with one's own data
    (["lora", "--checkpoint", "@run"], "--text FILE or --data"),
    (["dpo", "--checkpoint", "@run"], "--data FILE.jsonl"),
    (["lora", "--checkpoint", "@run", "--task", "sort", "--text", "@own.txt"], "--task"),
    (["lora", "--text", "@own.txt"], "--checkpoint"),
    (["dpo", "--data", "@prefs.jsonl"], "--checkpoint"),
    (["lora", "--checkpoint", "@run", "--text", "@own.txt", "--data", "@pc.jsonl"],
     "--text and --data"),
    (["lora", "--checkpoint", "@run", "--val-text", "@own.txt"], "--val-text goes with --text"),
    (["lora", "--checkpoint", "@run", "--data", "@bad.jsonl"], "line 2: missing 'completion'"),
    (["lora", "--checkpoint", "@run", "--data", "@bad.jsonl"], "line 3: not JSON"),
    (["lora", "--checkpoint", "@run", "--data", "@bad.jsonl"], "line 4: 'prompt' is empty"),
    (["lora", "--checkpoint", "@run", "--data", "@bad.jsonl"], "line 5: 'completion' is int"),
    (["dpo", "--checkpoint", "@run", "--data", "@bad-prefs.jsonl"],
     "line 1: missing 'rejected'"),
    (["dpo", "--checkpoint", "@run", "--full"], "--full"),
    (["lora", "--checkpoint", "@gpt", "--text", "@own.txt"], "task model"),
    (["dpo", "--checkpoint", "@gpt", "--data", "@prefs.jsonl"], "task model"),
    # flags that do not apply to the data or mode chosen (issue 31)
    (["dpo", "--checkpoint", "@run", "--data", "@prefs.jsonl", "--pairs", "synthetic"],
     "--pairs applies to the built-in tasks; with --data"),
    (["dpo", "--checkpoint", "@run", "--data", "@prefs.jsonl", "--prefer", "sort"],
     "--prefer applies to the built-in tasks"),
    (["dpo", "--checkpoint", "@run", "--data", "@prefs.jsonl", "--n-prompts", "8"],
     "--n-prompts applies to the built-in tasks"),
    (["dpo", "--checkpoint", "@run", "--data", "@prefs.jsonl", "--samples", "2"],
     "--samples applies to the built-in tasks"),
    (["dpo", "--checkpoint", "@run", "--data", "@prefs.jsonl", "--n-test", "8"], "--n-test"),
    (["lora", "--checkpoint", "@run", "--text", "@own.txt", "--n-test", "8"],
     "--n-test applies to the built-in tasks; with --text"),
    (["lora", "--checkpoint", "@run", "--text", "@own.txt", "--max-prompt-len", "3"],
     "--max-prompt-len applies to the built-in tasks"),
    (["lora", "--checkpoint", "@run", "--data", "@pc.jsonl", "--base-steps", "3"],
     "--base-steps"),
    (["lora", "--checkpoint", "@gpt", "--base-task", "reverse"],
     "--base-task applies to the base model trained here"),
    (["dpo", "--checkpoint", "@gpt", "--max-prompt-len", "3"], "--max-prompt-len"),
    (["dpo", "--checkpoint", "@run", "--data", "@prefs.jsonl", "--full", "--rank", "2"],
     "--rank sets the LoRA adapters; --full"),
    (["dpo", "--pairs", "synthetic", "--samples", "2"], "--samples applies to --pairs generated"),
    (["lora", "--checkpoint", "@run", "--text", "@own.txt", "--minutes", "1", "--steps", "3"],
     "--minutes and --steps"),
    (["dpo", "--checkpoint", "@run", "--data", "@prefs.jsonl", "--minutes", "1e-9"],
     "--minutes 1e-09: the budget was used"),
    # abbreviations are not flags
    (["pretrain", "--minute", "1"], "unrecognized arguments: --minute"),
    (["lora", "--minute", "1"], "unrecognized arguments: --minute"),
    (["dpo", "--check", "@run"], "unrecognized arguments: --check"),
    (["train", "--step", "3"], "unrecognized arguments: --step"),
    # messages name flags and files, and what differs
    (["pretrain", "--text", "@own.txt", "--init", "@gpt"], "--init"),
    (["pretrain", "--tokens", "@own.txt"], "not a token file"),
    (["pretrain", "--text", "@tiny.txt"], "too few to hold out"),
    (["pretrain", "--tokens", "@own.bin", "--init", "@byte-run"], "merges"),
    (["pretrain", "--text", "@own.txt", "--init", "@byte-run", "--tokenizer", "@tok.json"],
     "one has 0 merges"),
    # generate and export
    (["generate", "--checkpoint", "@run", "--prompt", "x", "--top-p", "0.9"],
     "--top-p applies to sampling"),
    (["generate", "--checkpoint", "@gpt", "--prompt", "12", "--seed", "3"],
     "--seed applies to sampling"),
    (["generate", "--checkpoint", "@gpt", "--prompt", "12", "--top-k", "2"], "--top-k"),
    (["generate", "--checkpoint", "@rnn", "--prompt", "i am", "--top-k", "1",
      "--temperature", "1"], "--top-k"),
    (["examples", "kv_cache", "--list"], "--list"),
    (["export", "--checkpoint", "@run", "-o", "none"], "--output"),
    (["export", "--checkpoint", "@rnn", "-o", "@hf-rnn"], "--checkpoint"),
    (["export", "--checkpoint", "@missing", "-o", "@hf"], "--checkpoint"),
    (["generate", "--checkpoint", "@run", "--prompt", ""], "--prompt"),
    (["generate", "--checkpoint", "@run", "--prompt", "x", "--raw"], "--raw"),
]


@pytest.mark.parametrize("argv, message", LEARNER_ERRORS,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_bad_combination_of_the_learners_flags(argv, message, learner, gpt_run, rnn_run,
                                                     capsys, tmp_path, monkeypatch):
    import shutil
    shutil.copytree(learner, tmp_path, dirs_exist_ok=True)
    for name, run in (("gpt", gpt_run), ("rnn", rnn_run)):
        shutil.copytree(run, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    argv = _paths(argv, tmp_path)
    if argv[0] in ("pretrain", "lora", "dpo") and "--out" not in argv:
        argv = argv + ["--out", str(tmp_path / "new-run")]
    assert main(argv) == 2
    line = one_line_error(capsys, f"numpytfmr {argv[0]}", message)
    assert sorted(os.listdir(tmp_path)) == before            # nothing written
    internal = re.findall(r"\b(?:[a-z]+(?:_[a-z]+)+|[A-Z][a-z]\w*\.\w+)(?=[:(])", line)
    assert not internal, (internal, line)                     # no function names
    assert ": error: " + argv[0] + ": " not in line


def test_export_refuses_a_folder_holding_files(learner, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("work")
    assert main(["export", "--checkpoint", str(learner / "run"), "-o", str(tmp_path / "hf")]) == 2
    one_line_error(capsys, "numpytfmr export", "--output", "--force")
    assert main(["export", "--checkpoint", str(learner / "run"), "-o", str(tmp_path / "hf"),
                 "--force"]) == 0
    assert not (tmp_path / "hf" / "keep.txt").exists()
