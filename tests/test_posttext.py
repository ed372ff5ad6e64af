"""run/posttext.py: one's own data for lora and dpo on a model of text -- rows read and
checked by line number, completions masked, sequences fitted to the window, held-out
metrics, and the full-weight DPO gradient against finite differences."""
import json

import numpy as np
import pytest

from numpytfmr.gpt import GPTConfig, init_gpt
from numpytfmr.posttrain import dpo_loss_and_grads
from numpytfmr.run import posttext as pt
from numpytfmr.run.tokenizers import BPETokenizer, CharTokenizer, TextCharTokenizer

BYTES = BPETokenizer.byte_level()


def _write(tmp_path, lines, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_rows_are_read_and_every_bad_row_is_named(tmp_path):
    good = json.dumps({"prompt": "a", "completion": "b", "extra": 1})
    path = _write(tmp_path, [good, "", good])
    rows = pt.read_rows(path, pt.PROMPT_COMPLETION, BYTES)
    assert rows == [(1, {"prompt": "a", "completion": "b"}), (3, {"prompt": "a",
                                                                   "completion": "b"})]
    bad = _write(tmp_path, [good, "[1, 2]", '{"prompt": "a", "completion": ""}', "{", good] +
                 ['{"prompt": "a"}'] * 5, "bad.jsonl")
    with pytest.raises(ValueError) as info:
        pt.read_rows(bad, pt.PROMPT_COMPLETION, BYTES, flag="--val-data")
    message = str(info.value)
    assert message.startswith(f"--val-data {bad}: 8 bad rows, nothing trained: ")
    for needle in ("line 2: expected a JSON object", "line 3: 'completion' is empty",
                   "line 4: not JSON", "line 6: missing 'completion'", "(and 3 more)"):
        assert needle in message, needle
    with pytest.raises(ValueError, match="no rows"):
        pt.read_rows(_write(tmp_path, [""], "empty.jsonl"), pt.PREFERENCE, BYTES)


def test_text_the_tokenizer_cannot_spell_is_a_bad_row(tmp_path):
    path = _write(tmp_path, [json.dumps({"prompt": "12", "completion": "3x"})])
    with pytest.raises(ValueError, match="line 1: 'completion' cannot be encoded"):
        pt.read_rows(path, pt.PROMPT_COMPLETION, CharTokenizer("0123"))
    text_chars = TextCharTokenizer.from_text("abc")          # bytes spell anything else
    assert pt.read_rows(_write(tmp_path, [json.dumps({"prompt": "é", "completion": "z"})]),
                        pt.PROMPT_COMPLETION, text_chars)


def test_held_out_rows_and_streams():
    rows = [(i, {}) for i in range(25)]
    train, val = pt.split_rows(rows)
    assert len(val) == 2 and train + val == rows
    assert pt.split_rows(rows[:2])[1] == rows[1:2]
    with pytest.raises(ValueError, match="at least 2"):
        pt.split_rows(rows[:1])
    ids, val_ids = pt.split_stream(np.arange(100), None, 8)
    assert ids.size == 90 and val_ids.tolist() == list(range(90, 100))
    with pytest.raises(ValueError, match="--text: 9 training tokens"):
        pt.split_stream(np.arange(10), None, 16)


def test_the_loss_mask_covers_the_completion_only():
    rows = [(1, {"prompt": "ab", "completion": "cde"}), (2, {"prompt": "x", "completion": "y"})]
    a = pt.completion_arrays(BYTES, rows, context=16)
    ids, mask = a["completion"]
    assert ids.shape == (2, 5) and a["truncated"] == 0
    assert bytes(ids[0].tolist()) == b"abcde" and mask[0].tolist() == [0, 0, 1, 1, 1]
    assert bytes(ids[1, :2].tolist()) == b"xy" and mask[1].tolist() == [0, 1, 0, 0, 0]


def test_a_long_row_loses_its_prompt_start_then_its_completion_end():
    rows = [(1, {"prompt": "abcdef", "completion": "XYZ"})]
    ids, mask = pt.completion_arrays(BYTES, rows, context=5)["completion"]   # 6 tokens
    assert bytes(ids[0].tolist()) == b"defXYZ" and mask[0].sum() == 3
    ids, mask = pt.completion_arrays(BYTES, [(1, {"prompt": "ab", "completion": "UVWXYZ"})],
                                     context=3)["completion"]
    assert bytes(ids[0].tolist()) == b"bUVW" and mask[0].tolist() == [0, 1, 1, 1]


def test_pairs_share_one_width():
    rows = [(1, {"prompt": "p", "chosen": "long answer", "rejected": "no"})]
    pairs = pt.pair_arrays(BYTES, rows, context=32)
    assert pairs["chosen_ids"].shape == pairs["rejected_ids"].shape == (1, 12)
    assert pairs["rejected_mask"].sum() == 2 and pairs["chosen_mask"].sum() == 11


def _model(dtype=np.float64):
    config = GPTConfig(vocab_size=256, n_layers=1, d_model=8, n_heads=2, max_len=12)
    params = init_gpt(config, rng=np.random.default_rng(0))
    return {k: v.astype(dtype) for k, v in params.items()}, config


def test_completion_metrics_are_the_masked_log_likelihood():
    from numpytfmr.gpt import gpt_forward
    params, config = _model()
    rows = [(1, {"prompt": "ab", "completion": "cd"})]
    ids, mask = pt.completion_arrays(BYTES, rows, context=8)["completion"]
    m = pt.completion_metrics(params, config, BYTES, ids, mask)
    logits, _ = gpt_forward(params, ids[:, :-1], config=config)
    z = logits[0] - logits[0].max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    nats = -(logp[1, ord("c")] + logp[2, ord("d")])              # predicting c and d
    assert m["val_loss"] == pytest.approx(nats / 2, rel=1e-10)
    assert m["val_bits_per_byte"] == pytest.approx(nats / np.log(2) / 2, rel=1e-10)


def test_preference_metrics_start_at_zero_and_follow_trl():
    params, config = _model()
    rows = [(1, {"prompt": "ab", "chosen": "c", "rejected": "dd"})] * 3
    pairs = pt.pair_arrays(BYTES, rows, context=8)
    rc = pt.sequence_logprobs(params, config, pairs["chosen_ids"], pairs["chosen_mask"])
    rr = pt.sequence_logprobs(params, config, pairs["rejected_ids"], pairs["rejected_mask"])
    m = pt.preference_metrics(params, config, pairs, rc, rr, beta=0.5)
    assert m["rewards/chosen"] == m["rewards/margins"] == m["rewards/accuracies"] == 0.0
    other = {k: v * 1.01 for k, v in params.items()}
    m = pt.preference_metrics(other, config, pairs, rc, rr, beta=0.5)
    pc = pt.sequence_logprobs(other, config, pairs["chosen_ids"], pairs["chosen_mask"])
    assert m["rewards/chosen"] == pytest.approx(0.5 * float(np.mean(pc - rc)))
    assert m["rewards/margins"] == pytest.approx(m["rewards/chosen"] - m["rewards/rejected"])
    assert m["rewards/accuracies"] in (0.0, 1.0)


def test_the_full_weight_dpo_gradient_matches_finite_differences():
    """``full_logprobs`` trains every weight: its gradient of the DPO loss, checked in
    float64 against central differences along random directions."""
    params, config = _model()
    rows = [(1, {"prompt": "ab", "chosen": "cd", "rejected": "e"}),
            (2, {"prompt": "x", "chosen": "y", "rejected": "zz"})]
    pairs = pt.pair_arrays(BYTES, rows, context=8)
    batch = {k: pairs[k] for k in ("chosen_ids", "chosen_mask", "rejected_ids",
                                   "rejected_mask")}
    ref_c = pt.sequence_logprobs(params, config, batch["chosen_ids"], batch["chosen_mask"])
    ref_r = pt.sequence_logprobs(params, config, batch["rejected_ids"], batch["rejected_mask"])
    rng = np.random.default_rng(3)
    policy = {k: v + 0.05 * rng.standard_normal(v.shape) for k, v in params.items()}

    def loss(w):
        value, grads, _ = dpo_loss_and_grads(params, w, batch, config=config, alpha=None,
                                             beta=0.7, ref_chosen=ref_c, ref_rejected=ref_r,
                                             nll_weight=0.3, logprobs=pt.full_logprobs())
        return value, grads

    _, grads = loss(policy)
    assert set(grads) == set(params)
    for _ in range(3):
        direction = {k: rng.standard_normal(v.shape) for k, v in policy.items()}
        h = 1e-6
        plus = loss({k: v + h * direction[k] for k, v in policy.items()})[0]
        minus = loss({k: v - h * direction[k] for k, v in policy.items()})[0]
        numeric = (plus - minus) / (2 * h)
        analytic = sum(float(np.sum(grads[k] * direction[k])) for k in grads)
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-9)
