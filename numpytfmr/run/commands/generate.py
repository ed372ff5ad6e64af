"""``numpytfmr generate``: complete a prompt with a trained checkpoint.

    numpytfmr generate --prompt 3142                       # runs/gpt: prints 1234
    numpytfmr generate --prompt 3142 --temperature 1 --top-k 3 --seed 7
    numpytfmr generate --checkpoint runs/seq2seq --prompt "i am a student"

For a GPT trained on a task the prompt is wrapped as ``<bos> prompt <sep>`` (``--raw``
takes it as written, special tokens spelled out) and the completion is printed up to
``<eos>``. For a seq2seq checkpoint the prompt is the source sentence and the greedy
translation is printed.
"""


def cmd_generate(args):
    from numpytfmr.run.blas import blas_threads
    with blas_threads(1):
        return _generate(args)


def _generate(args):
    import numpy as np

    from numpytfmr.run.checkpoint import load_model
    from numpytfmr.run.tasks import complete, translate

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens is {args.max_new_tokens}; expected an integer >= 1")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k is {args.top_k}; expected an integer >= 1")
    if not args.temperature >= 0:
        raise ValueError(f"--temperature is {args.temperature}; expected a number >= 0")
    ck = load_model(args.checkpoint)
    if ck["kind"] == "gpt":
        greedy = args.temperature == 0 or args.top_k == 1
        rng = None if greedy else np.random.default_rng(args.seed)
        text, _ = complete(ck["params"], ck["model_config"], ck["tokenizer"], args.prompt,
                           max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, rng=rng, use_cache=not args.no_cache, raw=args.raw)
        print(text)
        return 0
    if args.temperature != 0 or args.top_k not in (None, 1) or args.raw:
        raise ValueError(f"the checkpoint holds a {ck['kind']!r} translation model, which decodes "
                         "greedily; --temperature, --top-k and --raw apply to GPT checkpoints")
    words, _, _ = translate(ck["params"], ck["kind"], ck["model_config"], ck["src_tokenizer"],
                            ck["tgt_tokenizer"], args.prompt, max_new_tokens=args.max_new_tokens,
                            use_cache=not args.no_cache)
    print(" ".join(w for w in words if w != "<eos>"))
    return 0


def add_command(sub):
    p = sub.add_parser(
        "generate", help="complete a prompt with a trained checkpoint",
        description="Complete a prompt with a checkpoint of 'numpytfmr train' (or translate a "
        "sentence with one of 'numpytfmr train-seq2seq'), decoding until <eos>.")
    p.add_argument("--checkpoint", default="runs/gpt", metavar="PATH",
                   help="checkpoint directory or its checkpoint.json (default runs/gpt)")
    p.add_argument("--prompt", required=True, metavar="TEXT",
                   help="the prompt, e.g. 3142 for the sort task")
    p.add_argument("--raw", action="store_true",
                   help="use the prompt as written (no <bos>/<sep> added; special tokens may be "
                   "spelled out, e.g. '<bos>3142<sep>')")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 (default) = greedy decoding")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample among the K most likely tokens (1 = greedy)")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="stop after N tokens (default: until <eos> or the end of the context)")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute the whole sequence at every step instead of using the KV cache "
                   "(same output, slower)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.set_defaults(func=cmd_generate)
