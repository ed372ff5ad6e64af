"""``numpytfmr lora`` and ``numpytfmr dpo`` end to end, with tiny settings (a few seconds).

The acceptance runs (the defaults: >= 95 % exact match for lora, >= 90 % preferred answers
for dpo, in minutes) are measured by hand, not here."""
import json

import numpy as np
import pytest

from numpytfmr.run.cli import main
from numpytfmr.shared.fileio import load_arrays
from numpytfmr.posttrain import merge_lora
from numpytfmr.run.checkpoint import load_model

TINY_BASE = ["--base-steps", "40", "--max-prompt-len", "3", "--n-test", "12", "--quiet"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    out, summary = tmp / "run", tmp / "summary.json"
    status = main(["lora", *TINY_BASE, "--steps", "6", "--eval-every", "3", "--rank", "2",
                   "--out", str(out), "--summary", str(summary)])
    return status, out, json.loads(summary.read_text())


def test_lora_command_writes_its_summary_and_checkpoints(lora_run):
    status, out, s = lora_run
    assert status == 0
    for key in ("exact_match", "merged_exact_match", "trainable_fraction", "seconds",
                "target_exact_match_before", "base_task_exact_match_before",
                "base_task_exact_match_after", "lora_rank", "lora_parameters", "base_parameters"):
        assert key in s, key
    assert s["task"] == "sort_desc" and s["base_task"] == "sort" and s["lora_rank"] == 2
    assert s["steps"] == 6 and [e["step"] for e in s["evals"]] == [3, 6]
    assert 0.0 <= s["exact_match"] <= 1.0 and s["exact_match"] == s["merged_exact_match"]
    assert s["base_weights_unchanged"] is True
    assert s["base_task_exact_match_before"] == s["base_task_exact_match_after"]
    # 2 layers x 4 projections x (d r + r k) with d = k = 64, r = 2
    assert s["lora_parameters"] == 2 * 4 * (64 * 2 + 2 * 64)
    assert s["trainable_fraction"] == pytest.approx(s["lora_parameters"] / s["base_parameters"])
    assert s["seconds"] >= s["base_seconds"] > 0
    assert (out / "checkpoint.json").exists() and (out / "base" / "checkpoint.json").exists()


def test_saved_merged_model_is_the_base_plus_the_saved_adapters(lora_run):
    _, out, s = lora_run
    merged = load_model(out, kind="gpt")
    base = load_model(out / "base", kind="gpt")
    adapters = load_arrays(out / "adapters.npz")
    assert set(adapters) == {f"h{l}.attn.{w}.{f}" for l in range(2)
                             for w in ("Wq", "Wk", "Wv", "Wo") for f in "AB"}
    again = merge_lora(base["params"], adapters, alpha=s["lora_alpha"])
    assert all(np.array_equal(again[k], merged["params"][k]) for k in again)
    assert merged["lora"]["rank"] == 2 and merged["task"]["task"] == "sort_desc"


def test_lora_from_a_checkpoint_with_an_explicit_task(lora_run, tmp_path, capsys):
    _, out, _ = lora_run
    summary = tmp_path / "s.json"
    status = main(["lora", "--checkpoint", str(out / "base"), "--task", "rotate", "--steps", "3",
                   "--targets", "Wq,W2", "--n-test", "8", "--out", "none", "--quiet",
                   "--summary", str(summary)])
    assert status == 0
    s = json.loads(summary.read_text())
    assert s["task"] == "rotate" and s["base_seconds"] == 0.0 and s["checkpoint"] is None
    assert s["targets"] == ["Wq", "W2"] and s["base_checkpoint"].endswith("checkpoint.json")
    assert "sort -> rotate" in capsys.readouterr().out


@pytest.mark.parametrize("pairs", ["generated", "synthetic"])
def test_dpo_command_writes_its_summary(pairs, tmp_path):
    summary = tmp_path / "s.json"
    samples = ["--samples", "6"] if pairs == "generated" else []   # refused with synthetic
    status = main(["dpo", *TINY_BASE, "--base-steps", "120", "--steps", "4", "--eval-every", "2",
                   "--n-prompts", "32", *samples, "--pairs", pairs, "--out",
                   str(tmp_path / "run"), "--summary", str(summary)])
    assert status == 0
    s = json.loads(summary.read_text())
    for key in ("preferred_rate_before", "preferred_rate_after", "preference_accuracy",
                "reward_margin", "kl", "trainable_fraction", "seconds"):
        assert key in s and s[key] is not None, key
    assert s["base_task"] == "sort_either" and s["pairs"] == pairs and s["n_pairs"] > 0
    for when in ("before", "after"):
        rates = [s[f"{k}_rate_{when}"] for k in ("preferred", "opposite", "other")]
        assert all(0 <= r <= 1 for r in rates) and sum(rates) == pytest.approx(1.0)
    assert s["kl"] >= 0.0 and 0.0 <= s["preference_accuracy"] <= 1.0
    lora = 2 * 2 * (64 * 4 + 4 * 64)                 # 2 layers x (Wq, Wv) x (d r + r k)
    assert s["trainable_fraction"] == pytest.approx(lora / s["base_parameters"])
    assert s["base_weights_unchanged"] is True and s["steps"] == 4
    assert load_model(tmp_path / "run", kind="gpt")["dpo"]["pairs"] == pairs


@pytest.mark.parametrize("args, message", [
    (["lora", "--targets", "Wx"], "--targets is 'Wx'"),
    (["lora", "--alpha", "0"], "--alpha is 0; expected a finite number > 0"),
    (["lora", "--rank", "0"], "--rank is 0"),
    (["dpo", "--beta", "-1"], "--beta is -1; expected a finite number > 0"),
    (["dpo", "--samples", "0"], "--samples is 0"),
    (["lora", "--checkpoint", "/nonexistent/run"], "--checkpoint is '/nonexistent/run', which "
                                                    "does not exist"),
])
def test_bad_arguments_exit_with_status_2(args, message, capsys):
    assert main(args + ["--quiet", "--out", "none"]) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# lora and dpo on a model of text with one's own data
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A tiny model of text, its text, prompt-completion rows and preference rows."""
    from numpytfmr.run.corpus import default_corpus
    tmp = tmp_path_factory.mktemp("text")
    text = default_corpus(max_bytes=15_000)
    (tmp / "own.txt").write_text(text, encoding="utf-8")
    assert main(["pretrain", "--text", str(tmp / "own.txt"), "--vocab-size", "300", "--steps",
                 "6", "--eval-every", "3", "--batch-size", "8", "--context", "24", "--d-model",
                 "16", "--n-layers", "1", "--n-heads", "2", "--quiet", "--samples", "0",
                 "--out", str(tmp / "run")]) == 0
    words = text.split()
    pc = [{"prompt": " ".join(words[i:i + 3]) + " ", "completion": " ".join(words[i + 3:i + 5])}
          for i in range(0, 400, 10)]
    prefs = [{"prompt": " ".join(words[i:i + 3]) + " ", "chosen": "the same.",
              "rejected": "not so"} for i in range(0, 400, 10)]     # a preference to learn
    (tmp / "pc.jsonl").write_text("\n".join(json.dumps(r) for r in pc) + "\n")
    (tmp / "prefs.jsonl").write_text("\n".join(json.dumps(r) for r in prefs) + "\n")
    return tmp


def _summary(tmp_path, argv):
    summary = tmp_path / "s.json"
    assert main([*argv, "--summary", str(summary), "--quiet"]) == 0
    return json.loads(summary.read_text())


def test_lora_on_ones_own_text(text_run, tmp_path, capsys):
    from numpytfmr.run.checkpoint import load_run
    from numpytfmr.run.pretrain import is_text_checkpoint
    out = tmp_path / "lora"
    s = _summary(tmp_path, ["lora", "--checkpoint", str(text_run / "run"), "--text",
                            str(text_run / "own.txt"), "--steps", "8", "--eval-every", "4",
                            "--batch-size", "8", "--lr", "3e-2", "--out", str(out)])
    assert s["data"] == "text" and s["steps"] == 8 and s["base_weights_unchanged"]
    assert [e["step"] for e in s["evals"]] == [0, 4, 8]
    assert s["evals"][0]["val_bits_per_byte"] == s["val_bits_per_byte_before"]
    assert s["evals"][-1]["val_bits_per_byte"] == s["val_bits_per_byte_after"]
    assert s["val_loss_after"] < s["val_loss_before"]           # it learns the text
    assert is_text_checkpoint(out) and (out / "adapters.npz").exists()
    assert (out / "tokenizer.json").exists()
    base, merged = load_run(text_run / "run"), load_run(out)
    adapters = load_arrays(out / "adapters.npz")
    expected = merge_lora(base.params, adapters, alpha=8.0)
    for k in expected:
        np.testing.assert_array_equal(merged.params[k], expected[k])
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--prompt", "The ", "--max-new-tokens",
                 "60"]) == 0
    assert capsys.readouterr().out.startswith("The ")


def test_lora_on_prompt_completion_rows_scores_the_completions(text_run, tmp_path):
    s = _summary(tmp_path, ["lora", "--checkpoint", str(text_run / "run"), "--data",
                            str(text_run / "pc.jsonl"), "--steps", "6", "--eval-every", "3",
                            "--batch-size", "8", "--lr", "3e-2", "--out", "none"])
    assert s["data"] == "prompt-completion" and s["train_size"] == 36 and s["val_size"] == 4
    assert s["val_loss_after"] < s["val_loss_before"]
    assert s["checkpoint"] is None


def test_dpo_on_ones_own_preferences(text_run, tmp_path):
    out = tmp_path / "dpo"
    s = _summary(tmp_path, ["dpo", "--checkpoint", str(text_run / "run"), "--data",
                            str(text_run / "prefs.jsonl"), "--steps", "6", "--eval-every", "3",
                            "--batch-size", "8", "--lr", "3e-2", "--nll-weight", "0",
                            "--out", str(out)])
    trl = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")
    assert all(s["before"][k] == 0.0 for k in trl)          # the policy starts as the reference
    assert s["after"]["rewards/margins"] > 0 and s["rewards/margins"] == s["after"]["rewards/margins"]
    assert s["after"]["rewards/margins"] == pytest.approx(
        s["after"]["rewards/chosen"] - s["after"]["rewards/rejected"])
    assert s["val_pairs"] == 4 and s["train_pairs"] == 36 and not s["full"]
    assert (out / "adapters.npz").exists() and s["base_weights_unchanged"]


def test_dpo_on_every_weight(text_run, tmp_path):
    from numpytfmr.run.checkpoint import load_run
    out = tmp_path / "full"
    s = _summary(tmp_path, ["dpo", "--checkpoint", str(text_run / "run"), "--data",
                            str(text_run / "prefs.jsonl"), "--full", "--steps", "4",
                            "--eval-every", "4", "--batch-size", "8", "--lr", "1e-3",
                            "--nll-weight", "0", "--out", str(out)])
    assert s["full"] and s["trainable_fraction"] == 1.0 and s["after"]["rewards/margins"] > 0
    assert not (out / "adapters.npz").exists()
    base, tuned = load_run(text_run / "run"), load_run(out)
    assert all(not np.array_equal(base.params[k], tuned.params[k]) for k in ("wte", "h0.attn.Wq"))


# ---------------------------------------------------------------------------------------
# --minutes: the steps planned from the measured speed (the planning itself is tested with
# a clock of its own in test_training.py; here the runs' records, and their end loosely)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("command, data", [("lora", "own.txt"), ("dpo", "prefs.jsonl")])
def test_a_budgeted_run_records_its_plan(command, data, text_run, tmp_path):
    flag = "--text" if data.endswith(".txt") else "--data"
    minutes = 0.15
    s = _summary(tmp_path, [command, "--checkpoint", str(text_run / "run"), flag,
                            str(text_run / data), "--minutes", str(minutes), "--batch-size",
                            "8", "--out", str(tmp_path / "run")])
    assert s["minutes"] == minutes and s["planned_steps"] >= 2
    assert s["steps"] >= 1 and s["evals"][-1]["step"] == s["steps"]
    assert s["steps"] == s["settings"]["steps"] or s["stopped_by_budget"]
    every = s["settings"]["eval_every"]                # planned for up to 10 points
    assert 1 <= len(s["evals"]) - 1 <= s["steps"] // every + 1
    assert s["seconds"] < 60 * minutes + 60           # loosely: it ends near the budget
