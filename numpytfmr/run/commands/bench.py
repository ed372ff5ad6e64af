"""``numpytfmr bench``: how fast the fast path and the reference code are, and how much memory
attention takes.

    numpytfmr bench                          # a few minutes; one thread for NumPy and torch
    numpytfmr bench --summary bench.json     # the figures as one JSON object
    numpytfmr bench --quick                  # a tiny model: checks that everything runs
    numpytfmr bench --threads 2 --profile    # two threads each; cProfile of the training step
    numpytfmr bench --scaling                # only: the step's time and memory against its size
    numpytfmr bench --grading-class 200      # only: grade a class of 200 in the sandbox

What it measures, and how: docs/performance.md, "Measuring", and ``numpytfmr/run/bench.py``.
"""
import sys

from numpytfmr.run.cli import UsageError, positive_int
from numpytfmr.run.options import add_quiet, add_summary, add_threads, command_parser

# (label, summary key, target, "<=" or ">=", how to print the value, threads it applies
# to: None = any)
TARGETS = (
    ("training step vs PyTorch eager", "train_step_ratio_vs_torch", 0.8, "<=", "{:.3f}x", 1),
    ("training step vs PyTorch + fused SDPA", "train_step_ratio_vs_torch_sdpa", 0.9, "<=",
     "{:.3f}x", 2),
    ("reference step vs PyTorch eager", "reference_step_ratio_vs_torch", 2.0, "<=", "{:.2f}x",
     None),
    ("step FLOP/s / NumPy matmul FLOP/s", "gemm_fraction", 0.6, ">=", "{:.0%}", None),
    ("KV-cache speedup, 512 tokens", "kv_cache_speedup_512", 10.0, ">=", "{:.1f}x", None),
    ("decoding vs transformers, batch 1", "decode_ratio_vs_hf", 0.3, "<=", "{:.2f}x", None),
    ("decoding vs transformers, batch 8", "decode_ratio_vs_hf_batch8", 0.4, "<=", "{:.2f}x",
     None),
    ("flash / standard peak memory, n=4096", "flash_memory_ratio_4096", 1 / 8, "<=", "{:.4f}",
     None),
    ("flash / standard time, n=4096", "flash_time_ratio_4096", 1.5, "<=", "{:.2f}x", None),
    ("causal linear / standard memory, n=8192", "linear_causal_memory_ratio_8192", 0.1, "<=",
     "{:.4f}", None),
    ("sliding window / standard memory, n=8192", "sliding_window_memory_ratio_8192", 0.1, "<=",
     "{:.4f}", None),
)


def scaling_lines(sc):
    """The scaling study (``bench_scaling``) as readable text lines."""
    b = sc["base"]
    lines = [f"scaling of the fast training step (base: vocab {b['vocab_size']}, d_model "
             f"{b['d_model']}, {b['n_layers']} layers, {b['n_heads']} heads, d_ff {b['d_ff']}, "
             f"batch {b['batch']} x {b['seq_len']} tokens; one size varies at a time, d_model "
             "with d_head and d_ff / d_model fixed)",
             "  log-log slopes of the measured time and peak memory (tracemalloc), beside "
             "cost.train_step_cost's FLOPs and memory (saved activations + gradients)",
             f"  {'axis':<10}{'values':<24}{'time':>7}{'FLOPs':>7}{'memory':>8}{'count':>7}"
             "   step times"]
    for axis, r in sc["axes"].items():
        values = ", ".join(str(v) for v in r["values"])
        times = ", ".join(f"{1e3 * t:.1f}" for t in r["seconds"])
        lines.append(f"  {axis:<10}{values:<24}{r['time_slope']:7.2f}{r['flop_slope']:7.2f}"
                     f"{r['memory_slope']:8.2f}{r['predicted_memory_slope']:7.2f}   {times} ms")
    lines.append("  time slope below the FLOP slope: fixed per-call costs (Python, NumPy dispatch, "
                 "small products) still weigh at the small end; above it: work the count leaves "
                 "out (softmax and elementwise passes over the n^2 scores) grows faster")
    return lines


def _ms(seconds):
    return "-" if seconds is None else f"{1e3 * seconds:9.2f} ms"


def _mib(n_bytes):
    return f"{n_bytes / 2 ** 20:10.2f} MiB"


def report_lines(s):
    """The summary of ``run_bench`` as readable text lines."""
    lines = []
    th, m = s["threads"], s["machine"]
    tr, dec, att = s["train_step"], s["decoding"], s["attention"]
    threads = "unchanged" if th["threads"] is None else f"{th['threads']}"
    clock = {"cpu": "CPU time of the process", "wall": "wall-clock time"}[s["clock"]]
    lines.append(f"numpy {m['numpy']}, torch {tr['torch_version'] or 'not used'}, threads {threads} "
                 f"(NumPy BLAS set: {'yes' if th['numpy_blas_set'] else 'no'}; the fast path's "
                 f"passes on {th.get('fast_workers', 1)}), {m['cpu_count']} "
                 f"CPUs, {m['platform']}" + ("   [--quick: figures not meaningful]"
                                              if s["quick"] else ""))
    kb = s.get("blas") or {}
    if kb.get("library"):
        lines.append(f"NumPy's BLAS: {kb['library']} {kb['version']}, kernel set "
                     f"{kb['architecture']} (its own pick), {kb['threads']} threads")
    elif kb:
        lines.append("NumPy's BLAS: threads as the environment set them when NumPy loaded "
                     "(threadpoolctl is not installed)")
    lines.append(f"times: {clock}, minimum over the repeats; memory: "
                 f"{s.get('memory', {}).get('allocator', 'allocator unchanged')}")
    md = tr["model"]
    lines += ["", f"training step: forward + backward + AdamW, float32 (vocab {md['vocab_size']}, "
              f"d_model {md['d_model']}, {md['n_layers']} layers, {md['n_heads']} heads, d_ff "
              f"{md['d_ff']}, batch {md['batch']} x {md['seq_len']} tokens); min of "
              f"{tr['numpy_seconds']['n']} runs"]
    torch_s = tr["torch_seconds"]

    def step_row(label, name, note, ratios=""):
        seconds = tr[name + "_seconds"]["min"]
        return (f"  {label:<23}{_ms(seconds)}  {tr['step_flops'] / seconds / 1e9:7.1f} GFLOP/s   "
                + note + ratios)

    def vs_torch(prefix):
        if torch_s is None:
            return ""
        return (f"   / PyTorch eager {tr[prefix + 'ratio_vs_torch']:.3f}x, + fused SDPA "
                f"{tr[prefix + 'ratio_vs_torch_sdpa']:.3f}x")
    lines.append(step_row("NumPy, fast path", "numpy",
                          f"(first loss {tr['first_loss_numpy']:.6f})", vs_torch("")))
    if tr.get("reference_seconds") is not None:
        lines.append(step_row("NumPy, reference", "reference",
                              f"(first loss {tr['first_loss_reference']:.6f})",
                              vs_torch("reference_")
                              + f"   ({tr['reference_over_fast']:.2f}x the fast path)"))
    if torch_s is not None:
        lines.append(step_row("PyTorch eager", "torch",
                              f"(first loss {tr['first_loss_torch']:.6f})"))
        lines.append(step_row("PyTorch + fused SDPA", "torch_sdpa",
                              "(F.scaled_dot_product_attention, is_causal: nanoGPT's attention)"))
    else:
        lines.append("  PyTorch                not measured (--skip-torch, or torch not installed)")
    lines.append(f"  step FLOPs {tr['step_flops'] / 1e9:.2f} GFLOP (matrix products, 2mkn each, "
                 "backward = 2 x forward)")
    by = ", ".join(f"{n}: {f / 1e9:.1f}" for n, f in s["matmul"]["by_size"].items())
    lines.append(f"  NumPy float32 A @ B    {s['matmul_gflops_per_second']:9.1f} GFLOP/s (best of "
                 f"n x n: {by})  ->  step at {s['gemm_fraction']:.0%} of it")
    lines.append(f"  the step's matrix products alone {_ms(s['gemm_only_seconds'])} = "
                 f"{s['gemm_time_fraction']:.0%} of the fast step")
    kc = s.get("blas_coretype") or {}
    if kc.get("ratio") is not None:
        sec = kc["seconds"]
        lines.append(f"  OpenBLAS kernel sets (fresh processes, fast step only): its own pick "
                     f"{kc['openblas_choice']} {_ms(sec['openblas']).strip()}, "
                     f"OPENBLAS_CORETYPE={kc['coretype']} {_ms(sec['coretype']).strip()}: "
                     f"{kc['ratio']:.3f}x ({'saves' if kc['ratio'] < 1 else 'costs'} "
                     f"{abs(1 - kc['ratio']):.1%} of a step; the training commands keep "
                     "OpenBLAS's pick)")
    elif kc:
        lines.append(f"  OpenBLAS kernel sets: {kc.get('note', 'not measured')}")

    lines += ["", f"decoding {dec['n_new']} tokens, greedy, batch 1, prompt {dec['prompt_len']} "
              "(generate)"]
    lines.append(f"  with the KV cache      {dec['cached_seconds']:9.2f} s  "
                 f"({dec['cached_ms_per_token']:.2f} ms/token)")
    lines.append(f"  without                {dec['uncached_seconds']:9.2f} s  "
                 f"({dec['uncached_ms_per_token']:.2f} ms/token)   speedup {dec['speedup']:.1f}x, "
                 f"same tokens: {'yes' if dec['same_tokens'] else 'NO'}")
    lines.append("  one gpt_forward call at context length L     L     cached   uncached")
    lines.append("  (the public API: inputs checked and the cache copied on every call, which "
                 "generate's loop does not do)")
    for L, row in dec["per_token"].items():
        lines.append(f"{'':46}{L:>5} {_ms(row['cached'])} {_ms(row['uncached'])}")
    if dec["cached_slope"] is not None:
        lines.append(f"  growth with L (log-log slope; 1 = linear): cached {dec['cached_slope']:.2f}, "
                     f"uncached {dec['uncached_slope']:.2f}")

    hf = s.get("decoding_vs_hf") or {}
    if hf.get("available"):
        lines += ["", f"cached greedy decoding, {hf['n_new']} tokens after a prompt of "
                  f"{hf['prompt_len']}: fast.generate vs transformers {hf['transformers_version']} "
                  "GPT2LMHeadModel.generate (same weights, float32)"]
        for B, r in hf["by_batch"].items():
            lines.append(f"  batch {B:<3} numpytfmr {r['ms_per_token']:7.3f} ms/token   "
                         f"transformers {r['hf_ms_per_token']:7.3f} ms/token   ratio "
                         f"{r['ratio']:.2f}x   same tokens: {'yes' if r['same_tokens'] else 'NO'}")
    elif hf:
        lines += ["", f"decoding vs transformers: not measured ({hf.get('note')})"]

    lines += ["", f"attention, forward + backward, one head (1, n, d={att['d']}), float32; peak "
              "memory above the inputs (tracemalloc)",
              f"  flash block {att['block_size']}, sliding window {att['window']} (band by "
              "band, no n x n array); causal linear in chunks",
              f"  {'n':>6}  {'method':<15}{'forward':>12}{'backward':>12}{'total':>12}"
              f"{'peak memory':>15}  {'time':>7} {'memory':>8} vs standard"]
    for n, row in att["by_n"].items():
        std = row.get("standard")
        for method, r in row.items():
            rel = ""
            if std is not None and method != "standard":
                rel = (f"  {r['seconds'] / std['seconds']:6.2f}x "
                       f"{r['peak_bytes'] / max(std['peak_bytes'], 1):8.4f}")
            lines.append(f"  {n:>6}  {method:<15}{_ms(r['forward_seconds'])}"
                         f"{_ms(r['backward_seconds'])}{_ms(r['seconds'])}"
                         f"{_mib(r['peak_bytes'])}{rel}")

    if "profile" in s:
        p = s["profile"]
        lines += ["", f"cProfile of the fast training step ({1e3 * p['seconds']:.0f} ms per step "
                  "under the profiler), most own time first (NumPy operators count in their caller)"]
        for r in p["rows"]:
            lines.append(f"  {100 * r['own_fraction']:5.1f}%  {_ms(r['own_seconds'])}  "
                         f"{r['calls']:>5} calls  {r['function']}")

    lines += ["", "targets" + ("   (--quick: a tiny model; the targets apply to the default "
                               "configuration only)" if s["quick"] else "")]
    for label, key, target, op, fmt, at in TARGETS:
        value = s.get(key)
        if value is None:
            lines.append(f"  {label:<40} {'-':>9}   (not measured)")
            continue
        ok = value <= target if op == "<=" else value >= target
        verdict = "met" if ok else "NOT met"
        if at is not None and th["threads"] != at:
            verdict += f" (the target is for {at} thread{'s' if at > 1 else ''})"
        lines.append(f"  {label:<40} {fmt.format(value):>9}   target {op} {fmt.format(target)}"
                     f"   {verdict}")
    lines.append(f"\n{s['seconds']:.0f} s in all")
    return lines


def cmd_bench(args):
    from numpytfmr.run import bench
    from numpytfmr.shared import fileio
    from numpytfmr.run.progress import Progress

    if args.grading_class:
        return _grading_class(args)
    for flag, value in (("--jobs", args.jobs), ("--isolation", args.isolation)):
        if value is not None:
            raise UsageError(f"{flag} applies to --grading-class only")
    quick = args.quick
    repeat = args.repeat or (2 if quick else 8)
    n_attention = len(args.attention_n or (bench.QUICK_ATTENTION_N if quick
                                           else bench.DEFAULT_ATTENTION_N))
    total = (1 + repeat + 1 + 3 + 2 * (not args.skip_torch)
             + n_attention * len(bench.ATTENTION_METHODS) + int(args.profile)
             + (0 if args.blas_coretype == "none" else 1 if quick else 3))
    if args.scaling:
        total = len(bench.QUICK_SCALING_AXES if quick else bench.SCALING_AXES)
    with Progress(total, "bench", enabled=not args.quiet) as bar:
        def on_stage(name):
            bar.update(metrics={"stage": name})
        summary = bench.run_bench(quick=quick, threads=args.threads, clock=args.clock,
                                  use_torch=not args.skip_torch, attention_n=args.attention_n,
                                  block_size=args.block_size, window=args.window,
                                  repeat=repeat, profile=args.profile, scaling=args.scaling,
                                  keep_memory=args.keep_freed_memory,
                                  coretype=None if args.blas_coretype == "none" else args.blas_coretype,
                                  on_stage=on_stage)
    if not args.quiet and sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    print("\n".join(scaling_lines(summary["scaling"]) + [f"\n{summary['seconds']:.0f} s in all"]
                    if args.scaling else report_lines(summary)))
    if args.summary:
        fileio.write_summary(args.summary, summary)
    return 0


# the flags of the step, decoding and attention benchmarks, with their defaults
_NOT_FOR_GRADING = (("--quick", "quick", False), ("--threads", "threads", 1),
                    ("--clock", "clock", "auto"), ("--skip-torch", "skip_torch", False),
                    ("--attention-n", "attention_n", None), ("--block-size", "block_size", 128),
                    ("--window", "window", 256), ("--repeat", "repeat", None),
                    ("--profile", "profile", False), ("--keep-freed-memory", "keep_freed_memory", False),
                    ("--blas-coretype", "blas_coretype", "auto"), ("--scaling", "scaling", False))


def _grading_class(args):
    from numpytfmr.run import bench_grading
    from numpytfmr.shared import fileio

    for flag, name, default in _NOT_FOR_GRADING:
        if getattr(args, name) != default:
            raise UsageError(f"{flag} does not apply to --grading-class (it measures the grader "
                             "alone)")

    def show(line):
        if not args.quiet:
            print("  grade: " + line, flush=True)
    figures = bench_grading.run_grading_class(args.grading_class, jobs=args.jobs or 2,
                                              isolation=args.isolation or "bubblewrap",
                                              on_line=show)
    print("\n".join(bench_grading.report_lines(figures)))
    if args.summary:
        fileio.write_summary(args.summary, figures)
    return 0


def add_command(sub):
    p = command_parser(sub, "bench")
    add_summary(p, help="write every figure as one JSON object to FILE")
    p.add_argument("--quick", action="store_true",
                   help="a tiny model and small n: checks that everything runs (seconds)")
    add_threads(p, help="threads of NumPy's BLAS and of PyTorch, the same for both (default 1: "
                "on a busy machine multithreaded timings are mostly scheduling noise)")
    p.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                   help="what a time is: 'cpu' = CPU time of the process (with one thread: the "
                   "time on a core of its own, whatever else runs), 'wall' = elapsed time; "
                   "'auto' (default): cpu with one thread, wall otherwise")
    p.add_argument("--skip-torch", action="store_true", help="do not time the PyTorch model")
    p.add_argument("--attention-n", type=positive_int, nargs="+", metavar="N",
                   help="sequence lengths of the attention benchmark (default 1024 4096 8192)")
    p.add_argument("--block-size", type=positive_int, default=128, metavar="B",
                   help="flash attention's tile size (default 128)")
    p.add_argument("--window", type=positive_int, default=256, metavar="W",
                   help="sliding-window attention's window (default 256)")
    p.add_argument("--repeat", type=positive_int, metavar="R",
                   help="timed training steps per library (default 8; the minimum is reported)")
    p.add_argument("--profile", action="store_true",
                   help="also cProfile the NumPy training step and list its hot spots")
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="ask glibc to keep freed memory in the process (for NumPy and PyTorch "
                   "alike), so a step does not page-fault in again what the previous step "
                   "returned to the system; by default the allocator is left as users have it")
    p.add_argument("--blas-coretype", default="auto", metavar="NAME",
                   help="an experiment: time the fast training step in fresh processes with "
                   "OpenBLAS's own kernel set and with OPENBLAS_CORETYPE=NAME, and report the "
                   "ratio (the training commands always keep OpenBLAS's pick). 'auto' (default): "
                   "Haswell (AVX2) where OpenBLAS picks an AVX-512 set, else nothing; 'none': skip")
    p.add_argument("--scaling", action="store_true",
                   help="instead of the rest: time the fast training step as d_model, n_layers, "
                   "seq_len and batch grow, with the log-log slopes beside the FLOP and memory "
                   "counts of cost.train_step_cost (under a minute)")
    p.add_argument("--grading-class", type=positive_int, metavar="N",
                   help="instead of the rest: build a class of N ten-pair submissions from the "
                   "reference's code, a quarter with a planted bug, and grade it with numpytfmr "
                   "grade (--jobs, --isolation) as a subprocess; reports its wall time, CPU time "
                   "and sandbox start-up per submission from grade's own --summary")
    p.add_argument("--jobs", type=positive_int, metavar="J",
                   help="with --grading-class: the grade command's --jobs (default 2)")
    p.add_argument("--isolation", choices=("bubblewrap", "user", "none"),
                   help="with --grading-class: the grade command's --isolation (default "
                   "bubblewrap)")
    add_quiet(p)
    p.set_defaults(func=cmd_bench)
