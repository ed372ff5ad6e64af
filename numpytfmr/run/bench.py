"""Measurements behind ``numpytfmr bench``: speed and memory of the fast path and the reference.

Every figure is measured in the same process, on the same machine and with the same
number of threads, so the ratios between them mean something even where the absolute
times depend on the machine. What is measured (the training step on the fast path, with the
reference and in PyTorch; its matrix-product FLOP/s; decoding with and without the KV cache
and against transformers' GPT-2; attention against n; ``--scaling``) and today's figures:
docs/performance.md.

How things are measured
-----------------------
Time: the MINIMUM over the repeats after a warm-up (the median alongside); calls that are
compared are timed in alternating rounds by one harness, ``time_interleaved``, so a change
of machine load hits all of them alike. Clocks: "wall" (``time.perf_counter``) and "cpu"
(``time.process_time``: all threads of this process). With one thread the CPU time is the
work's time on a core of its own however busy the machine is; with several it adds up the
threads, so "auto" takes "cpu" for one thread and "wall" otherwise.

FLOPs of the training step: every matrix product ``(m, k) @ (k, n)`` counts ``2 m k n``
(``matmul_cost``'s multiplications, each with its addition); its backward pass computes two
products of the same size, so a step counts 3 x the forward FLOPs. Embeddings, norms,
activations, softmax and the optimizer (memory-bound and small) are not counted: the standard
lower bound of "model FLOP utilisation". Attention counts the full n x n scores (the fast
path skips the key blocks a block of queries may not see, about a quarter at n = 128).

Peak memory: ``tracemalloc``, started after the inputs exist: what the call allocates on top
of them (outputs, caches, temporaries, gradients). NumPy reports every array buffer to it, so
it counts the arrays exactly, without the interpreter's own memory (``ru_maxrss`` growth
agrees within a few percent: 205 against 197 MiB traced for standard attention at
n = 4096). Timing runs are separate (tracemalloc slows Python down).

Threads: NumPy's BLAS (through threadpoolctl, ``limit_blas_threads``), the fast path's
elementwise passes (``fast.parallel``) and ``torch.set_num_threads`` get the same count.
With ``threads=None`` nothing is changed.

Kernels: OpenBLAS's own pick of kernel set is left alone; ``bench_blas_coretype`` measures
what ``OPENBLAS_CORETYPE`` would change (docs/performance.md, "OpenBLAS keeps its own
kernels"). PyTorch brings its own BLAS and is not affected.
"""
import dataclasses
import gc
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import tracemalloc

import numpy as np

from ..attention import attention_backward, attention_forward, causal_mask
from ..cost import decoding_cost, matmul_cost, mha_matmul_cost, train_step_cost
from ..efficient import (flash_attention_backward, flash_attention_forward,
                         linear_attention_backward, linear_attention_forward,
                         sliding_window_attention_backward, sliding_window_attention_forward)
from .. import fast
from ..gpt import GPTConfig, gpt_loss, init_gpt
from ..mha import mha_forward
from ..optim import adamw_init, adamw_step
from ..contract import count
from .bench_grading import package_env
from .blas import THREAD_VARIABLES, blas_info, limit_blas_threads

__all__ = ["DEFAULT_MODEL", "QUICK_MODEL", "REQUIRED_KEYS", "set_threads", "resolve_clock",
           "time_interleaved", "time_calls", "torch_gpt_step", "bench_config", "gemm_only_seconds",
           "train_step_flops", "matmul_flops_per_second", "bench_train_step", "bench_decoding",
           "fit_exponent", "time_decoding_steps", "measure_decoding_growth",
           "hf_gpt2_from_params", "bench_decoding_vs_hf", "bench_attention", "bench_scaling",
           "profile_train_step", "keep_freed_memory", "child_step_seconds", "bench_blas_coretype",
           "run_bench"]

# The model of the training-step benchmark (the default configuration).
DEFAULT_MODEL = {"vocab_size": 512, "d_model": 256, "n_layers": 4, "n_heads": 8, "d_ff": 1024,
                 "batch": 8, "seq_len": 128}
# A tiny one for --quick (a smoke test of the whole command, seconds).
QUICK_MODEL = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64,
               "batch": 2, "seq_len": 16}
DEFAULT_ATTENTION_N = (1024, 4096, 8192)
QUICK_ATTENTION_N = (64, 128)

# Keys every summary has (values are None when a part was skipped, e.g. without torch).
REQUIRED_KEYS = ("train_step_ratio_vs_torch", "train_step_ratio_vs_torch_sdpa", "gemm_fraction",
                 "kv_cache_speedup_512", "flash_memory_ratio_4096", "flash_time_ratio_4096",
                 "reference_step_ratio_vs_torch", "decode_ratio_vs_hf", "decode_ratio_vs_hf_batch8",
                 "linear_causal_memory_ratio_8192", "sliding_window_memory_ratio_8192")

ATTENTION_METHODS = ("standard", "flash", "sliding_window", "linear", "linear_causal")


# --- Threads and timing ---

def set_threads(n, *, use_torch=True):
    """Use ``n`` threads in NumPy's BLAS (and so the fast path's workers) and in PyTorch.

    Returns ``{"threads": n, "numpy_blas_set": bool, "torch_threads": int or None,
    "fast_workers": int}``; ``n=None`` changes nothing and reports what is known.
    """
    torch = _optional("torch") if use_torch else None
    blas_set = False
    if n is not None:
        blas_set = limit_blas_threads(n)
        if torch is not None:
            torch.set_num_threads(int(n))
    return {"threads": n, "numpy_blas_set": bool(blas_set),
            "torch_threads": None if torch is None else torch.get_num_threads(),
            "fast_workers": fast.parallel.workers()}


def _optional(*names):
    """The last of the modules ``names``, or None when one of them is not installed."""
    try:
        return [importlib.import_module(name) for name in names][-1]
    except ImportError:
        return None


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def resolve_clock(clock, threads):
    """"auto" -> "cpu" with one thread, "wall" otherwise; "wall" and "cpu" as given."""
    if clock == "auto":
        return "cpu" if threads == 1 else "wall"
    if clock not in CLOCKS:
        raise ValueError(f"resolve_clock: clock is {clock!r}; expected 'auto', 'wall' or 'cpu'")
    return clock


def time_interleaved(calls, *, repeat, warmup=1, clock="wall", min_seconds=0.0, max_runs=1,
                     progress=None):
    """Seconds of every call of the functions in ``calls`` (name -> function of no argument)
    on ``clock``: ``{name: [s, ...]}``. ``warmup`` untimed calls each, then ``repeat`` rounds
    calling every function in turn; a function whose warm-up took less than ``min_seconds`` runs
    up to ``max_runs`` times a round. ``progress()`` after each round."""
    now = CLOCKS[clock]
    runs = {}
    for name, fn in calls.items():
        seconds = None
        for _ in range(warmup):
            t0 = now()
            fn()
            seconds = now() - t0
        cheap = seconds is not None and max_runs > 1
        runs[name] = int(min(max_runs, max(1, min_seconds // max(seconds, 1e-9)))) if cheap else 1
    times = {name: [] for name in calls}
    for _ in range(repeat):
        for name, fn in calls.items():
            for _ in range(runs[name]):
                t0 = now()
                fn()
                times[name].append(now() - t0)
        _tick(progress)
    return times


def _tick(progress):
    """One step of a progress bar: ``progress()``, when there is one."""
    if progress is not None:
        progress()


def time_calls(fn, *, repeat, warmup=1, clock="wall"):
    """Seconds of ``repeat`` calls of ``fn()`` after ``warmup`` untimed ones (a list)."""
    return time_interleaved({"fn": fn}, repeat=repeat, warmup=warmup, clock=clock)["fn"]


def _stats(times):
    return {"min": float(min(times)), "median": float(np.median(times)), "n": len(times)}


def _peak_bytes(fn):
    """Peak bytes allocated while ``fn()`` runs, on top of what existed before (tracemalloc)."""
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return int(peak - base)


# --- FLOPs ---

def _flops(cost):
    """FLOPs of a product from matmul_cost's (multiplications, additions): 2 per multiply-add."""
    return 2 * cost[0]


def train_step_flops(config, batch, seq_len):
    """Matrix-product FLOPs of one training step of a GPT, as the module docstring counts
    them: the forward FLOPs per stage (summed over layers), "forward", "backward", "step"."""
    c = config
    N = batch * seq_len
    attn = mha_matmul_cost(seq_len, c.d_model, c.n_heads, batch=batch, n_kv_heads=c.n_kv_heads)
    stages = {name: c.n_layers * _flops(attn[name])
              for name in ("q", "k", "v", "scores", "values", "output")}
    stages["ffn"] = c.n_layers * (_flops(matmul_cost(N, c.d_model, c.d_ff))
                                  + _flops(matmul_cost(N, c.d_ff, c.d_model)))
    stages["lm_head"] = _flops(matmul_cost(N, c.d_model, c.vocab_size))
    forward = sum(stages.values())
    return {**stages, "forward": forward, "backward": 2 * forward, "step": 3 * forward}


def _step_matmul_shapes(config, batch, seq_len):
    """Every matrix product of a training step, forward and backward, as (count,
    batch_count, m, k, n): what ``gemm_only_seconds`` times."""
    c = config
    N, d, H, dh = batch * seq_len, c.d_model, c.n_heads, c.d_head
    T = seq_len
    fwd = [(3, 1, N, d, H * dh), (1, 1, N, H * dh, d),          # Q K V, output projection
           (1, batch * H, T, dh, T), (1, batch * H, T, T, dh),  # Q K^T, A V
           (1, 1, N, d, c.d_ff), (1, 1, N, c.d_ff, d)]          # FFN
    shapes = []
    for times, b, m, k, n in fwd:
        times *= c.n_layers
        shapes += [(times, b, m, k, n), (times, b, m, n, k), (times, b, k, m, n)]  # y, dx, dW
    shapes += [(1, 1, N, d, c.vocab_size), (1, 1, N, c.vocab_size, d), (1, 1, d, N, c.vocab_size)]
    return shapes


def _matmul_seconds(rng, a_shape, b_shape, repeat, clock):
    """Min time of ``A @ B`` on float32 arrays of these shapes, drawn from ``rng``."""
    A = rng.standard_normal(a_shape, dtype=np.float32)
    B = rng.standard_normal(b_shape, dtype=np.float32)
    return min(time_calls(lambda: A @ B, repeat=repeat, clock=clock))


def gemm_only_seconds(config, batch, seq_len, *, repeat=3, clock="wall"):
    """Time of the training step's matrix products alone, each run on fresh float32 arrays."""
    rng = np.random.default_rng(0)
    total = 0.0
    for times, b, m, k, n in _step_matmul_shapes(config, batch, seq_len):
        lead = () if b == 1 else (b,)
        total += times * _matmul_seconds(rng, lead + (m, k), lead + (k, n), repeat, clock)
    return total


def matmul_flops_per_second(sizes=(512, 1024, 2048), *, repeat=5, clock="wall"):
    """FLOP/s of float32 ``A @ B`` for square n x n matrices (2 n^3 FLOPs each).

    Returns ``{"by_size": {n: FLOP/s}, "peak": the largest}``: the reference speed of
    this machine's NumPy matrix product, measured in the same run as the model.
    """
    rng = np.random.default_rng(0)
    by_size = {int(n): 2.0 * n ** 3 / _matmul_seconds(rng, (n, n), (n, n), repeat, clock)
               for n in sizes}
    return {"by_size": by_size, "peak": max(by_size.values())}


# --- The training step, in NumPy and in PyTorch ---

def bench_config(model, max_len=None):
    """The GPTConfig of a benchmark model dict (pre-norm, LayerNorm, GELU, learned positions,
    tied embeddings, biases: GPTConfig's defaults)."""
    return GPTConfig(vocab_size=model["vocab_size"], n_layers=model["n_layers"],
                     d_model=model["d_model"], n_heads=model["n_heads"], d_ff=model["d_ff"],
                     max_len=max_len or model["seq_len"])


def _setup(model, seed, max_len=None):
    """``(model, config, rng, params)``: the model dict (default DEFAULT_MODEL), its
    GPTConfig, a generator seeded with ``seed`` and float32 weights drawn from it."""
    model = dict(DEFAULT_MODEL if model is None else model)
    config = bench_config(model, max_len=max_len)
    rng = np.random.default_rng(seed)
    return model, config, rng, init_gpt(config, rng=rng, dtype=np.float32)


def _batch(model, rng):
    """Token ids and targets of one training batch of ``model``, drawn from ``rng``."""
    shape = (model["batch"], model["seq_len"])
    return tuple(rng.integers(0, model["vocab_size"], size=shape) for _ in range(2))


def _numpy_step(params, state, ids, targets, config, lr, workspace=None, grads=None):
    """One training step on the fast path: ``fast.gpt_loss`` (activations in ``workspace``,
    gradients into ``grads`` when given) and ``fast.adamw_step_`` in place on the caller's copies.
    Returns (params, state, loss, grads)."""
    loss, grads = fast.gpt_loss(params, ids, targets, config=config, workspace=workspace, out=grads)
    fast.adamw_step_(params, grads, state, lr=lr, weight_decay=0.01)
    return params, state, loss, grads


def _reference_step(params, state, ids, targets, config, lr):
    """The same step with the reference code: ``numpytfmr.gpt_loss`` and
    ``numpytfmr.optim.adamw_step`` (new arrays every step)."""
    loss, grads = gpt_loss(params, ids, targets, config=config)
    params, state = adamw_step(params, grads, state, lr=lr, weight_decay=0.01)
    return params, state, loss


_LINEAR_WEIGHTS = (".Wq", ".Wk", ".Wv", ".Wo", ".W1", ".W2")


def torch_gpt_step(params, config, *, attention="math", lr=1e-3):
    """The same GPT in PyTorch eager mode (a copy of ``params``, linear weights stored
    (d_out, d_in) as ``torch.nn.Linear`` keeps them), and ``step(ids, targets) -> loss``: forward,
    backward and ``torch.optim.AdamW`` (weight decay 0.01 on every parameter, as in the NumPy
    step). attention: "math" (softmax(Q K^T scale + M) V written out) or "sdpa"
    (``F.scaled_dot_product_attention``)."""
    import torch
    import torch.nn.functional as F

    c = config
    if (c.norm, c.norm_type, c.positional, c.activation, c.tie_embeddings, c.bias, c.dropout) != \
            ("pre", "layernorm", "learned", "gelu", True, True, 0.0) or c.n_kv_heads != c.n_heads:
        raise ValueError("torch_gpt_step: config must be pre-norm LayerNorm, GELU, learned "
                         "positions, tied embeddings, biases, no dropout, n_kv_heads = n_heads")
    if attention not in ("math", "sdpa"):
        raise ValueError(f"torch_gpt_step: attention is {attention!r}; expected 'math' or 'sdpa'")
    t = {k: torch.tensor(np.ascontiguousarray(p.T if k.endswith(_LINEAR_WEIGHTS) else p))
         .requires_grad_(True) for k, p in params.items()}
    opt = torch.optim.AdamW(list(t.values()), lr=lr, weight_decay=0.01)
    H, dh, d, eps = c.n_heads, c.d_head, c.d_model, c.norm_eps
    scale = 1.0 / math.sqrt(dh)

    def ln(x, key):
        return F.layer_norm(x, (d,), t[key + ".gamma"], t[key + ".beta"], eps)

    def heads(x, B, T):            # (B, T, H*dh) -> (B, H, T, dh)
        return x.view(B, T, H, dh).transpose(1, 2)

    def loss_fn(ids, targets):
        B, T = ids.shape
        x = F.embedding(ids, t["wte"]) + t["wpe"][:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(c.n_layers):
            p = f"h{l}."
            h = ln(x, p + "attn_norm")
            q, k, v = (heads(F.linear(h, t[p + f"attn.W{n}"], t[p + f"attn.b{n}"]), B, T)
                       for n in "qkv")
            if attention == "sdpa":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) * scale
                s = s.masked_fill(~mask, float("-inf"))
                o = torch.softmax(s, dim=-1) @ v
            o = o.transpose(1, 2).reshape(B, T, H * dh)
            x = x + F.linear(o, t[p + "attn.Wo"], t[p + "attn.bo"])
            h = ln(x, p + "mlp_norm")
            h = F.gelu(F.linear(h, t[p + "mlp.W1"], t[p + "mlp.b1"]))
            x = x + F.linear(h, t[p + "mlp.W2"], t[p + "mlp.b2"])
        x = ln(x, "norm_f")
        logits = F.linear(x, t["wte"])                       # tied: x E^T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def step(ids, targets):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ids, targets)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def bench_train_step(model=None, *, repeat=8, use_torch=True, use_reference=True, lr=1e-3,
                     seed=0, clock="wall", progress=None):
    """Time the training step on the fast path, with the reference code and in PyTorch
    (eager and with fused SDPA), in alternating rounds, from the same weights and batch.

    Returns the times "numpy_seconds" (fast), "reference_seconds", "torch_seconds",
    "torch_sdpa_seconds" ({"min", "median", "n"} or None), their ratios (``ratio_vs_*``,
    ``reference_*``), the first losses ``first_loss_*``, "step_flops" and "flops_per_second".
    """
    model, config, rng, params = _setup(model, seed)
    ids, targets = _batch(model, rng)
    torch = _optional("torch") if use_torch else None

    state = {"params": {k: p.copy() for k, p in params.items()}, "opt": adamw_init(params),
             "grads": None}
    ref_state = {"params": params, "opt": adamw_init(params)}

    def numpy_run():
        state["params"], state["opt"], loss, state["grads"] = _numpy_step(
            state["params"], state["opt"], ids, targets, config, lr, grads=state["grads"])
        return float(loss)

    def reference_run():
        ref_state["params"], ref_state["opt"], loss = _reference_step(
            ref_state["params"], ref_state["opt"], ids, targets, config, lr)
        return float(loss)

    runners = {"numpy": numpy_run, **({"reference": reference_run} if use_reference else {})}
    if torch is not None:
        ids_t, targets_t = torch.as_tensor(ids), torch.as_tensor(targets)
        for name, attention in (("torch", "math"), ("torch_sdpa", "sdpa")):
            step = torch_gpt_step(params, config, attention=attention, lr=lr)
            runners[name] = (lambda s=step: s(ids_t, targets_t))
    first = {name: fn() for name, fn in runners.items()}      # warm-up, and the initial losses
    times = time_interleaved(runners, repeat=repeat, warmup=0, clock=clock, progress=progress)
    flops = train_step_flops(config, model["batch"], model["seq_len"])
    stats = {name: _stats(ts) for name, ts in times.items()}

    def ratio(a, b):               # min time of runner a / min time of runner b, when both ran
        return stats[a]["min"] / stats[b]["min"] if a in stats and b in stats else None
    out = {"model": model, "step_flops": flops["step"], "flops_by_stage": flops,
           "numpy_seconds": stats["numpy"], "first_loss_numpy": first["numpy"],
           "torch_seconds": stats.get("torch"), "torch_sdpa_seconds": stats.get("torch_sdpa"),
           "first_loss_torch": first.get("torch"), "ratio_vs_torch": ratio("numpy", "torch"),
           "ratio_vs_torch_sdpa": ratio("numpy", "torch_sdpa"),
           "reference_seconds": stats.get("reference"),
           "first_loss_reference": first.get("reference"),
           "reference_ratio_vs_torch": ratio("reference", "torch"),
           "reference_ratio_vs_torch_sdpa": ratio("reference", "torch_sdpa"),
           "reference_over_fast": ratio("reference", "numpy"),
           "torch_version": None if torch is None else torch.__version__,
           "flops_per_second": flops["step"] / stats["numpy"]["min"]}
    if torch is not None:
        out["torch_flops_per_second"] = flops["step"] / stats["torch"]["min"]
    return out


# --- Decoding with and without the KV cache ---

def bench_decoding(model=None, *, n_new=512, prompt_len=16, contexts=None, repeat=5, seed=0,
                   clock="wall", progress=None):
    """Greedy decoding of ``n_new`` tokens (batch 1) with and without the KV cache.

    Totals from ``fast.generate``; per token, one step at context length L (cached: one token
    against L - 1 cached positions; uncached: all L tokens). Returns "cached_seconds",
    "uncached_seconds", "speedup", "same_tokens", "per_token" ({L: {"cached", "uncached"}}) and
    the log-log slopes against L "cached_slope", "uncached_slope" (1 = linear).
    """
    model, config, rng, params = _setup(model, seed, max_len=prompt_len + n_new)
    prompt = rng.integers(0, config.vocab_size, size=(1, prompt_len))

    now = CLOCKS[clock]
    fast.generate(params, prompt, config=config, max_new_tokens=2, top_k=1)   # warm-up
    tokens, seconds = {}, {}
    for use_cache in (True, False):
        t0 = now()
        tokens[use_cache] = fast.generate(params, prompt, config=config, max_new_tokens=n_new,
                                          top_k=1, use_cache=use_cache)
        seconds[use_cache] = now() - t0
        _tick(progress)
    (tokens_cached, tokens_uncached), (t_cached, t_uncached) = tokens.values(), seconds.values()

    if contexts is None:
        contexts = [L for L in (2, 4, 8, 16, 32, 64, 128, 256, 512)
                    if max(prompt_len, (prompt_len + n_new) // 32) <= L <= prompt_len + n_new - 1]
    seq = tokens_cached[:, :max(contexts)]
    per_token = {}
    for L in contexts:
        _, c = fast.gpt_forward(params, seq[:, :L - 1], config=config) if L > 1 else (None, None)
        kv = None if c is None else c["kv_cache"]
        cached = min(time_calls(lambda: fast.gpt_forward(params, seq[:, L - 1:L], config=config,
                                                         kv_cache=kv), repeat=repeat, clock=clock))
        uncached = min(time_calls(lambda: fast.gpt_forward(params, seq[:, :L], config=config),
                                  repeat=max(2, repeat // 2), clock=clock))
        per_token[int(L)] = {"cached": cached, "uncached": uncached}
    _tick(progress)
    Ls = sorted(per_token)
    # least-squares slope of log time against log L: 1 = linear growth, 0 = constant
    slopes = {mode: float(np.polyfit(np.log(np.asarray(Ls, float)),
                                     np.log([per_token[L][mode] for L in Ls]), 1)[0])
              if len(Ls) > 1 else None for mode in ("cached", "uncached")}
    return {"model": model, "n_new": n_new, "prompt_len": prompt_len,
            "cached_seconds": t_cached, "uncached_seconds": t_uncached,
            "speedup": t_uncached / t_cached,
            "cached_ms_per_token": 1e3 * t_cached / n_new,
            "uncached_ms_per_token": 1e3 * t_uncached / n_new,
            "same_tokens": bool(np.array_equal(tokens_cached, tokens_uncached)),
            "per_token": per_token,
            "cached_slope": slopes["cached"], "uncached_slope": slopes["uncached"]}


# --- Cached decoding against Hugging Face transformers' GPT-2 ---

def _transformers_or_none():
    return _optional("torch", "transformers")


def hf_gpt2_from_params(params, config):
    """A ``transformers.GPT2LMHeadModel`` (eval mode, float32) holding numpytfmr's weights:
    the bench model's configuration, exact (erf) GELU, written by :func:`hf.gpt_to_hf`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from .hf import gpt_to_hf

    c = config
    if (c.norm, c.norm_type, c.positional, c.activation, c.tie_embeddings, c.bias) != \
            ("pre", "layernorm", "learned", "gelu", True, True) or c.n_kv_heads != c.n_heads:
        raise ValueError("hf_gpt2_from_params: config must be GPT-2's architecture (pre-norm "
                         "LayerNorm, GELU, learned positions, tied embeddings, biases, MHA)")
    sd, hf_config = gpt_to_hf(params, dataclasses.replace(c, dropout=0.0), dtype=np.float32)
    model = GPT2LMHeadModel(GPT2Config(**hf_config))
    missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in sd.items()},
                                                strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:          # lm_head is tied to wte
        raise RuntimeError(f"hf_gpt2_from_params: weights did not map (missing {missing}, "
                           f"unexpected {unexpected})")
    return model.float().eval()


def bench_decoding_vs_hf(model=None, *, n_new=512, prompt_len=16, batches=(1, 8), repeat=3,
                         seed=0, clock="wall", progress=None):
    """Cached greedy decoding of ``n_new`` tokens: ``fast.generate`` against transformers'
    ``GPT2LMHeadModel.generate`` on the same weights, float32, per batch, in alternating rounds.

    Returns ``{"available", "note", "transformers_version", "by_batch": {B: {"seconds",
    "hf_seconds", "ms_per_token", "hf_ms_per_token", "ratio", "same_tokens"}}}``.
    """
    transformers = _transformers_or_none()
    if transformers is None:
        return {"available": False, "note": "transformers (and torch) are not installed: "
                "cached decoding is not compared with Hugging Face", "by_batch": {}}
    import torch

    model, config, rng, params = _setup(model, seed, max_len=prompt_len + n_new)
    hf = hf_gpt2_from_params(params, config)
    out = {"available": True, "note": None, "transformers_version": transformers.__version__,
           "n_new": n_new, "prompt_len": prompt_len, "by_batch": {}}
    for B in batches:
        prompt = rng.integers(0, config.vocab_size, size=(B, prompt_len))
        prompt_t = torch.as_tensor(prompt)
        mask_t = torch.ones_like(prompt_t)

        def ours():
            return fast.generate(params, prompt, config=config, max_new_tokens=n_new, top_k=1)

        def theirs():
            with torch.no_grad():
                return hf.generate(prompt_t, attention_mask=mask_t, max_new_tokens=n_new,
                                   do_sample=False, use_cache=True)

        same = bool(np.array_equal(ours(), theirs().numpy()))     # also the warm-up
        times = time_interleaved({"ours": ours, "hf": theirs}, repeat=repeat, warmup=0, clock=clock)
        mine, hfs = _stats(times["ours"]), _stats(times["hf"])
        out["by_batch"][int(B)] = {
            "seconds": mine, "hf_seconds": hfs,
            "ms_per_token": 1e3 * mine["min"] / n_new, "hf_ms_per_token": 1e3 * hfs["min"] / n_new,
            "ratio": mine["min"] / hfs["min"], "same_tokens": same}
        _tick(progress)
    return out


# --- Decoding-step time against the context length (the decoding_growth example) ---

def fit_exponent(x, y):
    """The p of ``y ~ x^p``: the median slope of log y against log x over all pairs of points
    (the Theil-Sen line), which one slow timing cannot drag far."""
    lx = np.log(np.asarray(x, dtype=np.float64))
    ly = np.log(np.asarray(y, dtype=np.float64))
    i, j = np.triu_indices(lx.size, k=1)
    return float(np.median((ly[j] - ly[i]) / (lx[j] - lx[i])))


def time_decoding_steps(*, contexts, cached_contexts, d_model, n_heads, batch, repeats, seed):
    """Fastest wall time of one decoding step of :func:`mha_forward` per context length.

    Returns ``{"seconds": [...], "cached_seconds": [...]}`` (see :func:`measure_decoding_growth`).
    """
    rng = np.random.default_rng(seed)
    d_head = d_model // n_heads
    W = [rng.standard_normal((d_model, d_model)) / math.sqrt(d_model) for _ in range(4)]
    calls = {}
    for L in contexts:       # no cache: all L rows again, causal
        x = rng.standard_normal((batch, L, d_model))
        calls[("full", L)] = (lambda x=x, m=causal_mask(L): mha_forward(x, x, *W, n_heads=n_heads, mask=m))
    for L in cached_contexts:  # cache: one new row against L - 1 cached keys and values
        x = rng.standard_normal((batch, 1, d_model))
        kv = {"k": rng.standard_normal((batch, n_heads, L - 1, d_head)),
              "v": rng.standard_normal((batch, n_heads, L - 1, d_head))}
        calls[("cached", L)] = (lambda x=x, kv=kv: mha_forward(x, x, *W, n_heads=n_heads, kv_cache=kv))
    # interleaved rounds, so a busy moment does not hit one length only; cheap calls run more
    times = time_interleaved(calls, repeat=repeats, min_seconds=0.02, max_runs=20)
    best = {key: min(ts) for key, ts in times.items()}
    return {"seconds": [best[("full", L)] for L in contexts],
            "cached_seconds": [best[("cached", L)] for L in cached_contexts]}


def _in_child(name, options, env, *, timeout, where):
    """``name(**options)``, a function of this module, run in a fresh Python process with the
    environment ``env``: its result, through JSON."""
    code = ("import json, sys\n"
            f"from numpytfmr.run.bench import {name}\n"
            f"print(json.dumps({name}(**json.loads(sys.argv[1]))))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(options)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{where}: the timing process failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_decoding_growth(*, contexts=(724, 1024, 1448, 2048),
                            cached_contexts=(1024, 1448, 2048, 2896, 4096, 5793, 8192), d_model=64,
                            n_heads=1, batch=1, repeats=3, seed=0, single_thread=True):
    """Time one decoding step of :func:`mha_forward` at growing context lengths L and fit the
    growth exponent p of ``time ~ L^p`` (000 §2.5.1, 003 §6.2.1, 001 §2.2).

    - without a cache, the step recomputes all L rows: ``mha_forward(x, x, ..., mask=causal_mask(L))``
      on ``x (batch, L, d_model)``, L^2 scores per head;
    - with a cache, one new row against L - 1 cached keys and values:
      ``mha_forward(x_new, x_new, ..., kv_cache={"k", "v": (batch, heads, L-1, d_head)})``, L scores.

    Times: the fastest of ``repeats`` interleaved rounds (:func:`time_decoding_steps`), by default
    in a fresh process with one BLAS thread (a BLAS switching threads on bends the curve more than
    the arithmetic does); exponent: the median slope over all pairs (:func:`fit_exponent`). The
    default lengths keep every point in one memory regime (the uncached scores above a typical L2
    cache, the cached keys below it): crossing a cache size adds a jump no count has.
    Predictions, fitted the same way: the query-key scores of ``decoding_cost`` (exponents 2 and
    1) and all multiplications of the step (``mha_matmul_cost`` / ``matmul_cost``: the
    projections, linear in L, pull it below the asymptote at small L). Summed over L = 1..n, a
    step of cost L^p gives n^(p+1): the notes' O(n^3) and O(n^2).

    Returns a dict: "contexts", "seconds", "cached_contexts", "cached_seconds",
    "exponent", "cached_exponent" (measured), "predicted_exponent",
    "predicted_cached_exponent" (scores), "flop_exponent", "cached_flop_exponent".
    """
    where = "measure_decoding_growth"
    d_model = count(d_model, "d_model", where)
    n_heads = count(n_heads, "n_heads", where)
    if d_model % n_heads:
        raise ValueError(f"{where}: d_model is {d_model} and n_heads is {n_heads}; expected d_model "
                         "divisible by n_heads")
    options = {}
    for name, Ls in (("contexts", contexts), ("cached_contexts", cached_contexts)):
        options[name] = Ls = [count(L, name, where) for L in Ls]
        if len(set(Ls)) < 2:
            raise ValueError(f"{where}: {name} is {Ls}; expected at least two different lengths "
                             "to fit")
    options.update(d_model=d_model, n_heads=n_heads, batch=count(batch, "batch", where),
                   repeats=count(repeats, "repeats", where), seed=int(seed))
    if single_thread:
        env = dict(package_env(), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1", VECLIB_MAXIMUM_THREADS="1", NUMEXPR_NUM_THREADS="1")
        times = _in_child("time_decoding_steps", options, env, timeout=600, where=where)
    else:
        times = time_decoding_steps(**options)
    Ls, Lc = options["contexts"], options["cached_contexts"]
    B, H, d = options["batch"], n_heads, d_model

    def cached_flops(L):
        proj = 4 * matmul_cost(B, d, d)[0]                          # q, k, v, output of one row
        att = B * H * (matmul_cost(1, d // H, L)[0] + matmul_cost(1, L, d // H)[0])
        return proj + att

    return {
        "contexts": Ls, "seconds": times["seconds"],
        "cached_contexts": Lc, "cached_seconds": times["cached_seconds"],
        "exponent": fit_exponent(Ls, times["seconds"]),
        "cached_exponent": fit_exponent(Lc, times["cached_seconds"]),
        "predicted_exponent": fit_exponent(Ls, [decoding_cost(1, prompt_len=L, use_cache=False)["scores"]
                                                 for L in Ls]),
        "predicted_cached_exponent": fit_exponent(Lc, [
            decoding_cost(2, prompt_len=L - 1)["scores"] - decoding_cost(1, prompt_len=L - 1)["scores"]
            for L in Lc]),
        "flop_exponent": fit_exponent(Ls, [mha_matmul_cost(L, d, H, batch=B)["total"][0] for L in Ls]),
        "cached_flop_exponent": fit_exponent(Lc, [cached_flops(L) for L in Lc]),
    }


# --- OpenBLAS's kernel sets: the training step in fresh processes ---

# The kernel sets of OpenBLAS that use AVX-512, and the AVX2 set every such CPU also runs.
AVX512_SETS = ("SkylakeX", "Cooperlake", "SapphireRapids")
AVX2_SET = "Haswell"


def child_step_seconds(model, repeat, clock):
    """The fast training step of :func:`bench_train_step` (no reference, no PyTorch), timed
    in this process: ``{"seconds": min over repeat, "architecture": OpenBLAS's kernel set}``."""
    step = bench_train_step(model, repeat=repeat, use_torch=False, use_reference=False, clock=clock)
    return {"seconds": step["numpy_seconds"]["min"], "architecture": blas_info()["architecture"]}


def bench_blas_coretype(model=None, *, coretype="auto", threads=1, repeat=4, rounds=3,
                        clock="cpu", progress=None):
    """What OpenBLAS's kernel set ``coretype`` instead of its own pick costs or saves on the
    fast training step, in fresh processes (``rounds`` alternating pairs, min of ``repeat`` steps).

    ``coretype="auto"``: "Haswell" where OpenBLAS picks an AVX-512 set. Returns ``{"coretype",
    "openblas_choice", "seconds": {"openblas", "coretype"}, "ratio"}`` (coretype / OpenBLAS's
    pick), or ``{"coretype": None, "note"}`` when there is nothing to compare.
    """
    model = dict(DEFAULT_MODEL if model is None else model)
    chosen = blas_info()["architecture"]
    if coretype == "auto":
        coretype = AVX2_SET if chosen in AVX512_SETS else None
    if coretype is None:
        return {"coretype": None, "openblas_choice": chosen,
                "note": f"OpenBLAS runs {chosen}; no other kernel set to compare"}
    base = {k: v for k, v in package_env().items() if k != "OPENBLAS_CORETYPE"}
    if threads is not None:
        base.update({v: str(threads) for v in THREAD_VARIABLES})
    envs = {"openblas": base, "coretype": dict(base, OPENBLAS_CORETYPE=str(coretype))}
    options = {"model": model, "repeat": int(repeat), "clock": clock}
    seconds, architecture = {"openblas": [], "coretype": []}, {}
    for _ in range(int(rounds)):
        for name, env in envs.items():
            out = _in_child("child_step_seconds", options, env, timeout=1200,
                            where="bench_blas_coretype")
            seconds[name].append(out["seconds"])
            architecture[name] = out["architecture"]
        _tick(progress)
    best = {name: min(s) for name, s in seconds.items()}
    return {"coretype": coretype, "openblas_choice": architecture["openblas"],
            "coretype_ran": architecture["coretype"], "seconds": best, "runs": seconds,
            "ratio": best["coretype"] / best["openblas"], "threads": threads, "model": model}


# --- Attention: time and peak memory against n ---

def bench_attention(ns=DEFAULT_ATTENTION_N, *, d=64, block_size=128, window=256, repeat=3, seed=0,
                    clock="wall", progress=None):
    """Time and peak memory of forward + backward of attention over one (1, n, d) head,
    float32, for each of :data:`ATTENTION_METHODS` (Q, K, V, dout ~ N(0, 1)).

    Returns ``{n: {method: {"forward_seconds", "backward_seconds", "seconds" (min over
    repeat of forward + backward), "peak_bytes" (tracemalloc, above the inputs)}}}``.
    """
    # (forward, its keyword arguments, backward); the sliding window goes band by band: the
    # keys each block of queries can see, no (n, n) mask or weights
    methods = {
        "standard": (attention_forward, {}, attention_backward),
        "flash": (flash_attention_forward, {"block_size": block_size}, flash_attention_backward),
        "sliding_window": (sliding_window_attention_forward,
                           {"window": window, "block_size": block_size},
                           sliding_window_attention_backward),
        "linear": (linear_attention_forward, {}, linear_attention_backward),
        "linear_causal": (linear_attention_forward, {"causal": True}, linear_attention_backward),
    }
    now = CLOCKS[clock]
    rng = np.random.default_rng(seed)
    results = {}
    for n in ns:
        Q, K, V, dout = (rng.standard_normal((1, n, d), dtype=np.float32) for _ in range(4))
        results[int(n)] = row = {}
        for method, (forward, kwargs, backward) in methods.items():
            def call():                       # (forward seconds, backward seconds)
                t0 = now()
                _, cache = forward(Q, K, V, **kwargs)
                t1 = now()
                backward(dout, cache)
                return t1 - t0, now() - t1
            reps = repeat if n < 8192 else max(1, repeat - 1)
            runs = [call() for _ in range(reps + 1)][1:]           # the first is a warm-up
            best = min(runs, key=sum)
            row[method] = {"forward_seconds": best[0], "backward_seconds": best[1],
                           "seconds": sum(best), "peak_bytes": _peak_bytes(call)}
            _tick(progress)
    return results


# --- Scaling: the training step's time and memory against its size (bench --scaling) ---

# The base model of the scaling study, and the values each axis takes (one axis varies at a
# time; d_model keeps d_head = 32 and d_ff = 4 d_model).
SCALING_BASE = {"vocab_size": 512, "d_model": 256, "n_layers": 2, "n_heads": 8, "d_ff": 1024,
                "batch": 4, "seq_len": 64}
SCALING_AXES = {"d_model": (128, 256, 512, 1024), "n_layers": (1, 2, 4, 8),
                "seq_len": (32, 64, 128, 256, 512), "batch": (1, 2, 4, 8, 16)}
QUICK_SCALING_BASE = {"vocab_size": 64, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 128,
                      "batch": 2, "seq_len": 16}
QUICK_SCALING_AXES = {"d_model": (32, 64), "n_layers": (1, 2), "seq_len": (16, 32), "batch": (2, 4)}


def _scaled_model(base, axis, value):
    model = dict(base, **{axis: value})
    if axis == "d_model":
        model["n_heads"] = max(1, value // (base["d_model"] // base["n_heads"]))
        model["d_ff"] = 4 * value
    return model


def _step_runner(model, seed):
    """Functions running one fast training step of ``model`` (its own weights and batch):
    ``step()`` with a workspace of its own (the points of an axis alternate, so they must
    not share one) and ``fresh()``, whose activations are all new (for tracemalloc)."""
    model, config, rng, params = _setup(model, seed)
    state = adamw_init(params)
    ids, targets = _batch(model, rng)
    ws, grads = fast.Workspace(), {k: np.empty_like(p) for k, p in params.items()}
    return (lambda: _numpy_step(params, state, ids, targets, config, 1e-3, ws, grads),
            lambda: _numpy_step(params, state, ids, targets, config, 1e-3, fast.Workspace()))


def bench_scaling(base=None, axes=None, *, repeat=5, seed=0, clock="wall", progress=None):
    """Time and peak memory of the fast training step as one size at a time grows, beside
    ``cost.train_step_cost`` (001 §1.1, §2.1): per axis, alternating rounds (min of ``repeat``),
    one traced peak per point and four log-log slopes (``fit_exponent``).

    Returns ``{"base": model, "axes": {axis: {"values", "seconds", "peak_bytes", "flops",
    "memory_elements", "time_slope", "memory_slope", "flop_slope", "predicted_memory_slope"}}}``.
    """
    base = dict(SCALING_BASE if base is None else base)
    axes = dict(SCALING_AXES if axes is None else axes)
    out = {"base": base, "axes": {}}
    for axis, values in axes.items():
        models = {v: _scaled_model(base, axis, v) for v in values}
        runners = {v: _step_runner(m, seed) for v, m in models.items()}
        times = time_interleaved({v: r[0] for v, r in runners.items()}, repeat=repeat, warmup=1,
                                 clock=clock)
        peaks = {v: _peak_bytes(r[1]) for v, r in runners.items()}
        del runners
        costs = {v: train_step_cost(m["batch"], m["seq_len"], m["d_model"], m["n_layers"],
                                    m["n_heads"], m["d_ff"], m["vocab_size"])
                 for v, m in models.items()}
        vs = list(values)
        row = {"values": vs, "seconds": [min(times[v]) for v in vs],
               "peak_bytes": [peaks[v] for v in vs],
               "flops": [costs[v]["step_flops"] for v in vs],
               "memory_elements": [costs[v]["memory_elements"] for v in vs]}
        for slope, of in (("time", "seconds"), ("memory", "peak_bytes"), ("flop", "flops"),
                          ("predicted_memory", "memory_elements")):
            row[slope + "_slope"] = fit_exponent(vs, row[of])
        out["axes"][axis] = row
        _tick(progress)
    return out


# --- Profile of the training step ---

def profile_train_step(model=None, *, steps=3, top=15, seed=0, clock="wall"):
    """cProfile of ``steps`` fast-path training steps: the functions with the most own time.

    NumPy's operators count in the function that uses them, so the profile reads per kernel.
    Returns ``{"seconds": total, "rows": [{"function", "calls", "own_seconds",
    "own_fraction", "cumulative_seconds"}, ...]}``, most own time first.
    """
    import cProfile
    import pstats

    model, config, rng, params = _setup(model, seed)
    ids, targets = _batch(model, rng)
    opt = adamw_init(params)
    params, opt, _, grads = _numpy_step(params, opt, ids, targets, config, 1e-3)   # warm-up
    prof = cProfile.Profile(CLOCKS[clock])
    prof.enable()
    for _ in range(steps):
        params, opt, _, grads = _numpy_step(params, opt, ids, targets, config, 1e-3, grads=grads)
    prof.disable()
    st = pstats.Stats(prof)
    total = st.total_tt
    rows = []
    for (file, line, name), (_, nc, tt, ct, _) in st.stats.items():
        label = f"{os.path.basename(file)}:{name}" if line else name
        rows.append({"function": label, "calls": nc // steps, "own_seconds": tt / steps,
                     "own_fraction": tt / total if total else 0.0,
                     "cumulative_seconds": ct / steps})
    rows.sort(key=lambda r: -r["own_seconds"])
    return {"seconds": total / steps, "rows": rows[:top]}


# --- Everything ---

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory():
    """Ask the C allocator to keep freed memory in the process (glibc only).

    Blocks up to 32 MiB come from the heap (``M_MMAP_THRESHOLD``) and the heap is never trimmed
    (``M_TRIM_THRESHOLD``), so a step that allocates anew does not page-fault in again what the
    last one returned. Process-wide. Returns ``{"allocator": ..., "kept": bool}``.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None or platform.libc_ver()[0] != "glibc":
        return {"allocator": "system default (not glibc: unchanged)", "kept": False}
    ok = bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    return {"allocator": "glibc: blocks up to 32 MiB from the heap, heap never trimmed "
            "(freed memory stays with the process)" if ok else "glibc (mallopt refused)",
            "kept": ok}


def _machine():
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__}


def run_bench(*, quick=False, threads=1, clock="auto", use_torch=True, attention_n=None,
              block_size=128, window=256, n_new=None, repeat=None, profile=False, scaling=False,
              keep_memory=False, coretype="auto", on_stage=None):
    """Run every measurement; returns the summary dict (REQUIRED_KEYS plus details).

    The keywords are the command's flags (docs/commands.md, "numpytfmr bench"): ``threads=None``
    leaves the thread counts alone, ``scaling`` runs only ``bench_scaling``, ``coretype=None``
    skips ``bench_blas_coretype``; ``on_stage(name)`` is called after each measurement.
    """
    tick = on_stage if on_stage is not None else (lambda name: None)
    attention_n = tuple(attention_n or (QUICK_ATTENTION_N if quick else DEFAULT_ATTENTION_N))
    n_new = n_new or (16 if quick else 512)
    repeat = repeat or (2 if quick else 8)
    start = time.perf_counter()
    clock = resolve_clock(clock, threads)
    torch = _optional("torch") if use_torch else None
    torch_threads = None if torch is None else torch.get_num_threads()
    summary = {"quick": bool(quick), "machine": _machine(),
               "threads": set_threads(threads, use_torch=use_torch), "clock": clock,
               "blas": blas_info(),
               "memory": (keep_freed_memory() if keep_memory else
                          {"allocator": "system default (freed memory may go back to the "
                           "system)", "kept": False})}
    try:
        if scaling:
            summary["scaling"] = bench_scaling(
                QUICK_SCALING_BASE if quick else SCALING_BASE,
                QUICK_SCALING_AXES if quick else SCALING_AXES,
                repeat=2 if quick else 5, clock=clock, progress=lambda: tick("scaling"))
        else:
            _run_all(summary, quick=quick, clock=clock, use_torch=use_torch,
                     attention_n=attention_n, block_size=block_size, window=window,
                     n_new=n_new, repeat=repeat, profile=profile, tick=tick)
            kernels = (bench_blas_coretype(QUICK_MODEL if quick else DEFAULT_MODEL,
                                           coretype=coretype, threads=threads,
                                           repeat=2 if quick else 4, rounds=1 if quick else 3,
                                           clock=clock, progress=lambda: tick("kernel sets"))
                       if coretype is not None else {"coretype": None, "note": "not measured"})
            summary["blas_coretype"] = kernels
            summary["blas_coretype_step_ratio"] = kernels.get("ratio")
    finally:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)      # as it was (e.g. inside a test run)
    summary["seconds"] = time.perf_counter() - start
    return summary


def _run_all(summary, *, quick, clock, use_torch, attention_n, block_size, window, n_new, repeat,
             profile, tick):
    model = QUICK_MODEL if quick else DEFAULT_MODEL

    mm = matmul_flops_per_second((128, 256) if quick else (512, 1024, 2048),
                                 repeat=2 if quick else 10, clock=clock)
    tick("matmul")
    train = bench_train_step(model, repeat=repeat, use_torch=use_torch, clock=clock,
                             progress=lambda: tick("train step"))
    gemm_s = gemm_only_seconds(bench_config(model), model["batch"], model["seq_len"],
                               repeat=2 if quick else 3, clock=clock)
    tick("gemm only")
    decode = bench_decoding(model, n_new=n_new, prompt_len=4 if quick else 16,
                            repeat=2 if quick else 5, clock=clock,
                            progress=lambda: tick("decoding"))
    if use_torch:
        vs_hf = bench_decoding_vs_hf(model, n_new=n_new, prompt_len=4 if quick else 16,
                                     repeat=2 if quick else 3, clock=clock,
                                     progress=lambda: tick("decoding vs transformers"))
    else:
        vs_hf = {"available": False, "note": "--skip-torch: cached decoding is not compared "
                 "with Hugging Face transformers", "by_batch": {}}
    attn = bench_attention(attention_n, block_size=block_size, window=window,
                           repeat=1 if quick else 3, clock=clock,
                           progress=lambda: tick("attention"))
    prof = profile_train_step(model, steps=1 if quick else 3, clock=clock) if profile else None
    if profile:
        tick("profile")

    def ratio(n, key, method="flash"):
        row = attn.get(n)
        if row is None or method not in row or "standard" not in row:
            return None
        return row[method][key] / row["standard"][key]
    hf1, hf8 = (vs_hf["by_batch"].get(B, {}) for B in (1, 8))
    summary.update({
        # the acceptance figures
        "train_step_ratio_vs_torch": train["ratio_vs_torch"],
        "gemm_fraction": train["flops_per_second"] / mm["peak"],
        "kv_cache_speedup_512": decode["speedup"] if n_new == 512 else None,
        "flash_memory_ratio_4096": ratio(4096, "peak_bytes"),
        "flash_time_ratio_4096": ratio(4096, "seconds"),
        "decode_ratio_vs_hf": hf1.get("ratio"),
        "decode_ratio_vs_hf_batch8": hf8.get("ratio"),
        "linear_causal_memory_ratio_8192": ratio(8192, "peak_bytes", "linear_causal"),
        "sliding_window_memory_ratio_8192": ratio(8192, "peak_bytes", "sliding_window"),
        # the figures behind them
        "decode_ms_per_token": hf1.get("ms_per_token"),
        "decode_hf_ms_per_token": hf1.get("hf_ms_per_token"),
        "train_step_ratio_vs_torch_sdpa": train["ratio_vs_torch_sdpa"],
        "numpy_step_seconds": train["numpy_seconds"]["min"],
        "reference_step_ratio_vs_torch": train["reference_ratio_vs_torch"],
        "reference_step_ratio_vs_torch_sdpa": train["reference_ratio_vs_torch_sdpa"],
        "decode_ms_per_token_batch8": hf8.get("ms_per_token"),
        "decode_hf_ms_per_token_batch8": hf8.get("hf_ms_per_token"),
        "reference_step_seconds": (train["reference_seconds"] or {}).get("min"),
        "reference_over_fast": train["reference_over_fast"],
        "torch_step_seconds": (train["torch_seconds"] or {}).get("min"),
        "step_gflop": train["step_flops"] / 1e9,
        "step_gflops_per_second": train["flops_per_second"] / 1e9,
        "matmul_gflops_per_second": mm["peak"] / 1e9,
        "gemm_only_seconds": gemm_s,
        "gemm_time_fraction": gemm_s / train["numpy_seconds"]["min"],
        "kv_cache_speedup": decode["speedup"],
        "kv_cached_slope": decode["cached_slope"],
        "train_step": train, "matmul": mm, "decoding": decode, "decoding_vs_hf": vs_hf,
        "attention": {"d": 64, "block_size": block_size, "window": window, "by_n": attn},
    })
    if prof is not None:
        summary["profile"] = prof
