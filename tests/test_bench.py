"""``numpytfmr bench``: the measurements run and report every figure.

No timing assertions here: speed figures come from the benchmark command itself. These
tests check that the pieces run on tiny inputs, that the FLOP count is the one
documented, that the memory measure sees NumPy's arrays, and that the summary holds the
required keys.
"""
import json

import numpy as np
import pytest

from numpytfmr.run import bench
from numpytfmr.run.cli import main
from numpytfmr.cost import matmul_cost, train_step_cost
from numpytfmr.gpt import GPTConfig

TINY = {"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "batch": 2,
        "seq_len": 6}


def test_train_step_flops_by_hand():
    # one layer, B = 2, T = 3, d = 4, 2 heads of 2, d_ff = 8, V = 5
    c = GPTConfig(vocab_size=5, n_layers=1, d_model=4, n_heads=2, d_ff=8, max_len=3)
    f = bench.train_step_flops(c, 2, 3)
    N = 6
    expected = (4 * 2 * N * 4 * 4                 # Q, K, V, output projections
                + 2 * (2 * 2 * 2 * 3 * 2 * 3)      # Q K^T and A V: B h (3 x 2 x 3) each
                + 2 * 2 * N * 4 * 8                # FFN: two (6, 4, 8) products
                + 2 * N * 4 * 5)                   # output layer
    assert f["forward"] == expected
    assert f["step"] == 3 * expected and f["backward"] == 2 * expected
    assert f["lm_head"] == 2 * matmul_cost(N, 4, 5)[0]
    # cost.train_step_cost counts the same products
    cost = train_step_cost(2, 3, 4, 1, 2, 8, 5)
    assert cost["forward_flops"] == expected and cost["step_flops"] == 3 * expected


def test_train_step_cost_memory_by_hand():
    # B = 2, n = 3, d = 4, 2 layers, 2 heads, d_ff = 8, V = 5: N = 6 tokens
    c = train_step_cost(2, 3, 4, 2, 2, 8, 5)
    assert c["score_elements"] == 2 * 2 * 2 * 3 * 3                  # layers B h n^2
    assert c["activation_elements"] == 72 + 2 * (6 * 6 * 4 + 2 * 6 * 8) + 6 * 5
    assert c["parameter_elements"] == 2 * (4 * 16 + 2 * 4 * 8) + 5 * 4
    assert c["memory_elements"] == c["activation_elements"] + c["parameter_elements"]
    with pytest.raises(ValueError, match="train_step_cost: batch is 0"):
        train_step_cost(0, 3, 4, 2, 2, 8, 5)


def test_peak_bytes_sees_numpy_arrays():
    n = 1 << 18                                    # 1 MiB of float32
    peak = bench._peak_bytes(lambda: np.ones(n, dtype=np.float32) + 1.0)
    assert 2 * 4 * n <= peak < 3 * 4 * n          # the array and the sum, nothing else large


def test_clock_choice():
    assert bench.resolve_clock("auto", 1) == "cpu"
    assert bench.resolve_clock("auto", 2) == "wall"
    assert bench.resolve_clock("auto", None) == "wall"
    with pytest.raises(ValueError, match="clock"):
        bench.resolve_clock("gpu", 1)


def test_train_step_matches_torch_at_the_first_step():
    pytest.importorskip("torch")
    r = bench.bench_train_step(TINY, repeat=1)
    # same weights, same batch, same model: the same loss up to float32 rounding
    assert r["first_loss_torch"] == pytest.approx(r["first_loss_numpy"], rel=1e-5)
    assert r["ratio_vs_torch"] > 0 and r["numpy_seconds"]["n"] == 1
    # the reference step, timed alongside, computes the same loss as the fast one
    assert r["first_loss_reference"] == pytest.approx(r["first_loss_numpy"], rel=1e-5)
    assert r["reference_ratio_vs_torch"] > 0 and r["reference_seconds"]["n"] == 1


def test_fast_and_reference_steps_train_the_same_way():
    """Three steps of the benchmark's fast step and reference step from the same start: the
    same losses and weights up to float32 rounding (the fast step updates in place)."""
    from numpytfmr.gpt import init_gpt
    from numpytfmr.optim import adamw_init
    c = bench.bench_config(TINY)
    rng = np.random.default_rng(0)
    p = init_gpt(c, rng=rng, dtype=np.float32)
    ids, targets = (rng.integers(0, c.vocab_size, (2, 6)) for _ in range(2))
    fp, fs = {k: v.copy() for k, v in p.items()}, adamw_init(p)
    rp, rs = p, adamw_init(p)
    grads = None                            # the first step's new arrays, then reused
    for _ in range(3):
        fp, fs, fl, grads = bench._numpy_step(fp, fs, ids, targets, c, 1e-2, grads=grads)
        rp, rs, rl = bench._reference_step(rp, rs, ids, targets, c, 1e-2)
        assert fl == pytest.approx(rl, rel=1e-5)
    for k in p:
        np.testing.assert_allclose(fp[k], rp[k], rtol=1e-4, atol=1e-5)


def test_decoding_cached_and_uncached_agree():
    r = bench.bench_decoding(TINY, n_new=6, prompt_len=2, repeat=1)
    assert r["same_tokens"]
    assert set(r["per_token"]) == {2, 4}
    assert r["speedup"] == pytest.approx(r["uncached_seconds"] / r["cached_seconds"], rel=1e-12)


def test_attention_methods_run_and_flash_holds_less():
    r = bench.bench_attention((256,), d=8, block_size=16, window=8, repeat=1)[256]
    assert set(r) == set(bench.ATTENTION_METHODS)
    # standard attention holds the 256 x 256 weights (256 KiB in float32); flash, the
    # sliding window (band by band) and causal linear attention (in chunks) never do
    assert r["standard"]["peak_bytes"] >= 256 * 256 * 4
    for method in ("flash", "sliding_window", "linear_causal"):
        assert r[method]["peak_bytes"] < r["standard"]["peak_bytes"] / 4, method


def test_scaling_study_fits_slopes_beside_the_counts():
    base = {"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 32, "batch": 2,
            "seq_len": 4}
    axes = {"n_layers": (1, 2, 4), "batch": (1, 2)}
    sc = bench.bench_scaling(base, axes, repeat=1)
    assert set(sc["axes"]) == {"n_layers", "batch"}
    layers = sc["axes"]["n_layers"]
    assert layers["values"] == [1, 2, 4] and len(layers["seconds"]) == 3
    assert all(t > 0 for t in layers["seconds"]) and all(b > 0 for b in layers["peak_bytes"])
    # FLOPs: n_layers x (per layer) + the output layer: a slope just under 1
    assert 0.7 < layers["flop_slope"] < 1.0
    assert sc["axes"]["batch"]["flop_slope"] == pytest.approx(1.0)
    assert layers["flops"][0] == train_step_cost(2, 4, 8, 1, 2, 32, 16)["step_flops"]
    for key in ("time_slope", "memory_slope", "predicted_memory_slope"):
        assert np.isfinite(layers[key])


def test_hf_gpt2_gives_the_same_logits_and_tokens():
    pytest.importorskip("transformers")
    import torch
    from numpytfmr import fast
    from numpytfmr.gpt import init_gpt
    c = bench.bench_config(TINY, max_len=12)
    p = init_gpt(c, rng=np.random.default_rng(0), dtype=np.float32)
    model = bench.hf_gpt2_from_params(p, c)
    ids = np.random.default_rng(1).integers(0, c.vocab_size, (2, 6))
    with torch.no_grad():
        hf_logits = model(torch.as_tensor(ids)).logits.numpy()
    logits, _ = fast.gpt_forward(p, ids, config=c)
    np.testing.assert_allclose(logits, hf_logits, rtol=1e-4, atol=1e-5)
    r = bench.bench_decoding_vs_hf(TINY, n_new=5, prompt_len=3, batches=(1, 2), repeat=1)
    assert r["available"] and set(r["by_batch"]) == {1, 2}
    for row in r["by_batch"].values():
        assert row["same_tokens"] and row["ms_per_token"] > 0
        assert row["ratio"] == pytest.approx(row["ms_per_token"] / row["hf_ms_per_token"], rel=1e-12)


def test_decoding_vs_hf_is_skipped_cleanly_without_transformers(monkeypatch):
    monkeypatch.setattr(bench, "_transformers_or_none", lambda: None)
    r = bench.bench_decoding_vs_hf(TINY, n_new=2, prompt_len=2, repeat=1)
    assert r["available"] is False and "not installed" in r["note"] and r["by_batch"] == {}


def test_quick_bench_command_writes_the_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "QUICK_MODEL", TINY)
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--quiet", "--skip-torch", "--threads", "1",
                 "--attention-n", "64", "--repeat", "1", "--summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "training step" in out and "targets" in out
    s = json.loads(path.read_text())
    for key in bench.REQUIRED_KEYS:
        assert key in s
    assert s["train_step_ratio_vs_torch"] is None          # --skip-torch
    assert s["reference_step_ratio_vs_torch"] is None
    assert s["decode_ratio_vs_hf"] is None and s["decode_ratio_vs_hf_batch8"] is None
    assert "not compared with Hugging Face" in s["decoding_vs_hf"]["note"]
    assert s["reference_step_seconds"] > 0 and s["numpy_step_seconds"] > 0
    assert s["reference_over_fast"] == pytest.approx(s["reference_step_seconds"] / s["numpy_step_seconds"])
    assert "NumPy, fast path" in out and "NumPy, reference" in out
    assert s["gemm_fraction"] == pytest.approx(s["step_gflops_per_second"] / s["matmul_gflops_per_second"])
    assert 0 < s["gemm_fraction"] < 1.5                    # a step's products cannot beat A @ B by much
    assert s["clock"] == "cpu"
    assert set(s["attention"]["by_n"]["64"]) == set(bench.ATTENTION_METHODS)


def test_scaling_command_writes_the_scaling_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "QUICK_SCALING_AXES", {"n_layers": (1, 2), "seq_len": (4, 8)})
    monkeypatch.setattr(bench, "QUICK_SCALING_BASE", TINY)
    path = tmp_path / "scaling.json"
    assert main(["bench", "--quick", "--scaling", "--quiet", "--summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "scaling of the fast training step" in out and "n_layers" in out and "seq_len" in out
    s = json.loads(path.read_text())
    assert set(s["scaling"]["axes"]) == {"n_layers", "seq_len"}
    assert "train_step" not in s                          # --scaling runs nothing else


def test_keep_freed_memory_reports_what_it_did():
    r = bench.keep_freed_memory()
    assert set(r) == {"allocator", "kept"} and isinstance(r["kept"], bool)
    if r["kept"]:
        assert "glibc" in r["allocator"]


def test_bad_option_is_a_usage_error(capsys):
    assert main(["bench", "--quick", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err


def _own_kernel_set():
    """The kernel set OpenBLAS picks for this processor by itself: what a fresh process
    without OPENBLAS_CORETYPE runs (this process may run another, set by its environment)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1])]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-c", "from numpytfmr.run.blas import blas_info; "
                           "print(blas_info()['architecture'])"],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip("OpenBLAS does not start on this processor without OPENBLAS_CORETYPE "
                    f"(exit {proc.returncode}); nothing to compare")
    return proc.stdout.strip().splitlines()[-1]


def test_kernel_set_experiment_runs_each_set_in_a_fresh_process():
    """``bench_blas_coretype``: OpenBLAS's own pick against OPENBLAS_CORETYPE, each in its own
    process (the variable only counts when NumPy loads); this process is left as it was.

    What holds whatever the processor, the BLAS build and the environment: "auto" compares
    against the AVX2 set exactly where this process runs an AVX-512 set; a set asked for is
    the set that runs; the other side is OpenBLAS's own pick (a process without the
    variable), which is this process's set only where OPENBLAS_CORETYPE is unset. No timing
    is compared: the two processes may run on a machine busy with other work."""
    from numpytfmr.run.bench import AVX2_SET, AVX512_SETS, bench_blas_coretype
    from numpytfmr.run.blas import blas_info
    before = blas_info()
    out = bench_blas_coretype(bench.QUICK_MODEL, coretype="auto", threads=1, repeat=1, rounds=1)
    if before["architecture"] in AVX512_SETS:
        assert out["coretype"] == out["coretype_ran"] == AVX2_SET
        assert out["openblas_choice"] == _own_kernel_set()
        assert out["ratio"] == pytest.approx(out["seconds"]["coretype"] / out["seconds"]["openblas"])
        assert out["ratio"] > 0 and all(t > 0 for t in out["seconds"].values())
    else:
        assert out["coretype"] is None and "no other kernel set" in out["note"]
        assert out["openblas_choice"] == before["architecture"]
    assert blas_info() == before
    if before["library"] != "openblas":
        pytest.skip(f"NumPy's BLAS is {before['library'] or 'unknown (no threadpoolctl)'}, "
                    "not OpenBLAS: no kernel set to ask for")
    # an explicit set runs where asked; the other process runs OpenBLAS's own pick
    forced = bench_blas_coretype(bench.QUICK_MODEL, coretype=before["architecture"],
                                 threads=1, repeat=1, rounds=1)
    assert forced["coretype_ran"] == before["architecture"]
    assert forced["openblas_choice"] == _own_kernel_set()
    assert blas_info() == before


def test_every_step_ratio_is_reported_against_eager_and_fused_sdpa(monkeypatch):
    """With PyTorch, the report gives the fast and the reference step against PyTorch eager
    and PyTorch with F.scaled_dot_product_attention, and every target line (the SDPA one,
    decoding at batch 8) with the thread count it is meant for."""
    pytest.importorskip("torch")
    from numpytfmr.run.commands.bench import TARGETS, report_lines
    from numpytfmr.fast import parallel
    monkeypatch.setattr(bench, "QUICK_MODEL", TINY)
    workers = parallel.workers()
    try:
        s = bench.run_bench(quick=True, threads=2, attention_n=(64,), n_new=3, repeat=1,
                            coretype=None)
    finally:
        bench.set_threads(1)
        parallel.set_workers(workers)
    tr = s["train_step"]
    assert s["threads"]["fast_workers"] == 2
    assert s["train_step_ratio_vs_torch_sdpa"] == pytest.approx(
        tr["numpy_seconds"]["min"] / tr["torch_sdpa_seconds"]["min"])
    assert s["reference_step_ratio_vs_torch_sdpa"] == pytest.approx(
        tr["reference_seconds"]["min"] / tr["torch_sdpa_seconds"]["min"])
    text = "\n".join(report_lines(s))
    assert text.count("+ fused SDPA") >= 2 and "PyTorch + fused SDPA" in text
    for label, key, *_ in TARGETS:
        assert label in text and key in s
    assert "training step vs PyTorch eager" in text and "(the target is for 1 thread)" in text
    assert "decoding vs transformers, batch 8" in text
