"""``numpytfmr lora`` and ``numpytfmr dpo`` end to end, with tiny settings (a few seconds).

The acceptance runs (the defaults: >= 95 % exact match for lora, >= 90 % preferred answers
for dpo, in minutes) are measured by hand, not here."""
import json

import numpy as np
import pytest

from numpytfmr.run.cli import main
from numpytfmr.run.fileio import load_arrays
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
    status = main(["dpo", *TINY_BASE, "--base-steps", "120", "--steps", "4", "--eval-every", "2",
                   "--n-prompts", "32", "--samples", "6", "--pairs", pairs, "--out",
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
