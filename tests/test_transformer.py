"""numpytfmr/transformer.py: what the GPT and the encoder-decoder share: configs as dicts,
parameter tables, token sampling (greedy, temperature, top-k, nucleus)."""
import numpy as np
import pytest

from numpytfmr.gpt import GPTConfig, gpt_param_shapes
from numpytfmr.transformer import (append_tokens, check_sampling, config_from_dict,
                                   config_to_dict, init_params, next_token, nucleus)


def test_config_round_trips_through_a_dict():
    c = GPTConfig(vocab_size=11, n_layers=2, d_model=8, n_heads=2, d_ff=12, max_len=9,
                  positional="rope", n_kv_heads=1)
    d = config_to_dict(c)
    assert d["n_kv_heads"] == 1 and d["positional"] == "rope"
    assert config_from_dict(GPTConfig, d) == c


def test_init_params_has_every_shape_and_the_dtype():
    c = GPTConfig(vocab_size=11, n_layers=2, d_model=8, n_heads=2, d_ff=12, max_len=9)
    shapes = gpt_param_shapes(c)
    p = init_params(shapes, c.n_layers, rng=np.random.default_rng(0), dtype=np.float32)
    assert {k: v.shape for k, v in p.items()} == shapes
    assert all(v.dtype == np.float32 for v in p.values())


def test_greedy_is_the_argmax_whatever_the_rng():
    logits = np.array([[0.1, 2.0, -1.0], [3.0, 3.5, 0.0]])
    np.testing.assert_array_equal(next_token(logits), [1, 1])
    np.testing.assert_array_equal(next_token(logits, temperature=0.7, top_k=1), [1, 1])


def test_top_k_samples_only_the_k_largest_with_softmax_frequencies():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.1, 0.5, 0.15, 0.25]]))
    draws = np.array([next_token(logits, temperature=1.0, top_k=2, rng=rng)[0] for _ in range(4000)])
    assert set(draws) == {1, 3}
    frac = (draws == 1).mean()                          # 0.5 / 0.75 = 2/3 of the draws
    assert abs(frac - 2 / 3) < 4 * np.sqrt(2 / 9 / 4000)


def test_nucleus_keeps_the_smallest_set_reaching_top_p_and_renormalises():
    p = np.array([[0.5, 0.3, 0.15, 0.05]])
    np.testing.assert_allclose(nucleus(p, 0.7), [[0.625, 0.375, 0.0, 0.0]])
    np.testing.assert_allclose(nucleus(p, 0.8), [[0.625, 0.375, 0.0, 0.0]])    # 0.5 + 0.3 reaches 0.8
    np.testing.assert_allclose(nucleus(p, 0.81), [[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]])


def test_sampling_without_an_rng_is_refused():
    with pytest.raises(ValueError, match="g: rng is None but sampling needs randomness"):
        check_sampling(1.0, None, None, "g")
    assert check_sampling(0.0, None, None, "g") == (0.0, None, None)
    with pytest.raises(ValueError, match="top_p"):
        check_sampling(1.0, None, np.random.default_rng(0), "g", top_p=0.0)


def test_append_tokens_asks_for_each_position_and_stops_when_every_row_ended():
    """The generation loop: next_logits(n) for n = start, start + 1, ...; each row's
    greedy token at column n; a row that produced eos_id keeps it; all ended: eos_id to
    the end and no further call."""
    V, eos = 5, 4
    wanted = {2: [1, 4], 3: [4, 2], 4: [3, 3]}        # per step: each row's favourite token
    asked = []

    def next_logits(n):
        asked.append(n)
        logits = np.zeros((2, V))
        logits[[0, 1], wanted[n]] = 1.0
        return logits
    out = np.zeros((2, 7), dtype=np.int64)
    chosen = append_tokens(next_logits, out, 2, eos_id=eos)
    assert asked == [2, 3] and len(chosen) == 2
    np.testing.assert_array_equal(out[:, 2:], [[1, 4, 4, 4, 4], [4, 4, 4, 4, 4]])
    out = np.zeros((2, 5), dtype=np.int64)
    append_tokens(next_logits, out, 2)                # no eos_id: every column
    assert asked[2:] == [2, 3, 4]
    np.testing.assert_array_equal(out[:, 2:], [[1, 4, 3], [4, 2, 3]])
