"""Cost accounting (001 §1.1, §2.1, §2.2; 000 §2.5.1, §2.7.2): the notes' numbers and closed forms."""
import numpy as np
import pytest

from numpytfmr import (
    attention_score_memory, decoding_cost, kv_cache_bytes, lora_parameter_count, matmul_cost,
    mha_matmul_cost,
)


def _count_matmul_ops(m, k, n):
    """Run the textbook triple loop on random matrices, counting every * and +."""
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    C = np.empty((m, n))
    mults = adds = 0
    for i in range(m):
        for j in range(n):
            acc = A[i, 0] * B[0, j]
            mults += 1
            for l in range(1, k):
                acc = acc + A[i, l] * B[l, j]
                mults += 1
                adds += 1
            C[i, j] = acc
    np.testing.assert_allclose(C, A @ B)
    return mults, adds


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (2, 3, 4), (4, 8, 4), (3, 1, 5), (5, 7, 2)])
def test_matmul_cost_counts_the_triple_loop(m, k, n):
    assert matmul_cost(m, k, n) == _count_matmul_ops(m, k, n)


def test_notes_matmul_cost_formula():
    # 001 §1.1: m n k multiplications and m n (k - 1) additions; hand computed 2x3 @ 3x4
    assert matmul_cost(2, 3, 4) == (24, 16)
    m, k, n = 37, 11, 5
    assert matmul_cost(m, k, n) == (m * n * k, m * n * (k - 1))


def test_notes_mha_toy_example_scores():
    # 001 §2.1, n = 4, d_model = 8: one head computes Q K^T with Q, K of shape (4, 8): a 4x4 matrix;
    # two heads of d_head = 4 compute two 4x4 matrices. Hand computed: 4*4*8 = 128 multiplications
    # either way; additions 4*4*7 = 112 vs 2*4*4*3 = 96.
    one, two = mha_matmul_cost(4, 8, 1), mha_matmul_cost(4, 8, 2)
    assert one["scores"] == matmul_cost(4, 8, 4) == (128, 112)
    assert two["scores"] == (2 * 64, 2 * 48) == (128, 96)
    # projections do not depend on the number of heads (two 8x4 blocks = one 8x8)
    for stage in ("q", "k", "v", "output"):
        assert one[stage] == two[stage] == matmul_cost(4, 8, 8) == (256, 224)
    # A V: (4, 4) x (4, 8) or two (4, 4) x (4, 4): 4*8*4 = 128 multiplications, 4*8*3 = 96 additions
    assert one["values"] == two["values"] == (128, 96)
    assert one["total"][0] == 4 * 256 + 128 + 128


def test_mha_matmul_cost_totals_and_gqa():
    c = mha_matmul_cost(9, 12, 4, batch=3)
    assert c["total"] == tuple(sum(c[s][i] for s in ("q", "k", "v", "scores", "values", "output"))
                               for i in range(2))
    assert c["scores"] == (3 * 4 * 9 * 9 * 3, 3 * 4 * 9 * 9 * 2)  # B h n^2 d_head, B h n^2 (d_head - 1)
    g = mha_matmul_cost(9, 12, 4, batch=3, n_kv_heads=1)  # MQA: K, V projections 4x smaller
    assert g["k"][0] * 4 == c["k"][0] and g["scores"] == c["scores"]
    with pytest.raises(ValueError, match="^mha_matmul_cost: d_model is 10 and n_heads is 4"):
        mha_matmul_cost(4, 10, 4)
    with pytest.raises(ValueError, match="^mha_matmul_cost: n_kv_heads is 3"):
        mha_matmul_cost(4, 12, 4, n_kv_heads=3)


def test_notes_attention_score_memory_1000_tokens_12_heads():
    # 001 §2.1: n = 1000 gives 1000 x 1000 = 1 million entries per head; with h = 12 heads
    # 12 million attention scores in one layer
    assert attention_score_memory(1, 1, 1000)[0] == 1_000_000
    elements, nbytes = attention_score_memory(1, 12, 1000)
    assert elements == 12_000_000
    assert nbytes == 48_000_000  # float32
    assert attention_score_memory(1, 12, 1000, bytes_per_element=2)[1] == 24_000_000
    # "dozens of layers": B h n^2 per layer
    assert attention_score_memory(8, 12, 1000, n_layers=24)[0] == 24 * 8 * 12_000_000


def test_notes_attention_score_memory_toy():
    # 001 §2.1: "one 4x4 attention matrix" vs "two separate 4x4 score matrices"
    assert attention_score_memory(1, 1, 4)[0] == 16
    assert attention_score_memory(1, 2, 4)[0] == 32


def test_kv_cache_bytes():
    # 001 §2.2: K and V of shape (B, h, T, d_k) in every layer; hand computed for a LLaMA-2-7B-sized
    # config (32 layers, 32 heads of 128, fp16): 2 * 32 * 32 * 128 * 2 = 524,288 bytes (0.5 MiB) per token
    assert kv_cache_bytes(1, 32, 32, 1, 128) == 524_288
    assert kv_cache_bytes(1, 32, 32, 4096, 128) == 2 * 1024 ** 3  # 2 GiB at 4096 tokens
    assert kv_cache_bytes(4, 32, 8, 4096, 128) == 4 * 2 * 1024 ** 3 // 4  # GQA, 8 KV heads, batch 4
    assert kv_cache_bytes(1, 2, 3, 0, 4) == 0
    # 000 §2.5.1: linear in the input length and the batch size
    assert kv_cache_bytes(3, 2, 2, 10, 4) == 3 * kv_cache_bytes(1, 2, 2, 10, 4)
    assert kv_cache_bytes(1, 2, 2, 20, 4) == 2 * kv_cache_bytes(1, 2, 2, 10, 4)
    assert kv_cache_bytes(1, 1, 1, 1, 1, bytes_per_element=0.5) == 1.0  # 4-bit
    with pytest.raises(ValueError, match="^kv_cache_bytes: seq_len is -1"):
        kv_cache_bytes(1, 1, 1, -1, 1)


def test_notes_decoding_cost_three_tokens():
    # 000 §2.5.1 / 003 §6.2.1: without caching 1^2 + 2^2 + 3^2, with caching 1 + 2 + 3
    assert decoding_cost(3, use_cache=False)["scores"] == 1 + 4 + 9 == 14
    assert decoding_cost(3, use_cache=True)["scores"] == 1 + 2 + 3 == 6


@pytest.mark.parametrize("n", [1, 2, 5, 17, 100])
def test_decoding_cost_closed_forms(n):
    no, yes = decoding_cost(n, use_cache=False), decoding_cost(n, use_cache=True)
    assert no["scores"] == n * (n + 1) * (2 * n + 1) // 6  # O(n^3)
    assert yes["scores"] == n * (n + 1) // 2  # O(n^2)
    assert no["kv_rows"] == n * (n + 1) // 2 and yes["kv_rows"] == n  # 001 §2.2: O(t) vs O(1) per token
    assert no["passes"] == yes["passes"] == n
    assert decoding_cost(n, use_cache=False, d_k=64)["score_multiplications"] == 64 * no["scores"]


def test_decoding_cost_prompt_and_causal():
    # prompt of 4, 3 new tokens: passes over 4, 5, 6 tokens
    assert decoding_cost(3, prompt_len=4, use_cache=False)["scores"] == 16 + 25 + 36
    assert decoding_cost(3, prompt_len=4, use_cache=True)["scores"] == 16 + 5 + 6
    assert decoding_cost(3, prompt_len=4, use_cache=False, causal=True)["scores"] == 10 + 15 + 21
    assert decoding_cost(3, prompt_len=4, use_cache=True, causal=True)["scores"] == 10 + 5 + 6
    assert decoding_cost(3, prompt_len=4, use_cache=True)["kv_rows"] == 4 + 2
    # the cache never costs more
    for n in range(1, 30):
        assert decoding_cost(n, prompt_len=3)["scores"] <= decoding_cost(n, prompt_len=3, use_cache=False)["scores"]


def test_lora_parameter_counts():
    # 000 §2.7.2: d k for the full update, d r + r k for A (d, r) and B (r, k); hand computed
    c = lora_parameter_count(4096, 4096, 8)
    assert (c["full"], c["lora"]) == (16_777_216, 65_536)
    c = lora_parameter_count(768, 3072, 4)
    assert (c["full"], c["lora"]) == (768 * 3072, 768 * 4 + 4 * 3072)
    c = lora_parameter_count(1000, 500, 500)  # full rank: more parameters than W itself
    assert c["lora"] == 750_000 > c["full"] == 500_000


def test_cost_bad_input():
    with pytest.raises(ValueError, match="^matmul_cost: k is 0"):
        matmul_cost(2, 0, 3)
    with pytest.raises(TypeError, match="^matmul_cost: m is 2.0"):
        matmul_cost(2.0, 3, 4)
    with pytest.raises(TypeError, match="^attention_score_memory: n is True"):
        attention_score_memory(1, 1, True)
    with pytest.raises(ValueError, match="^attention_score_memory: bytes_per_element is 0.0"):
        attention_score_memory(1, 1, 4, bytes_per_element=0)
    with pytest.raises(ValueError, match="^decoding_cost: n_new is 0"):
        decoding_cost(0)
