"""``numpytfmr dpo``: Direct Preference Optimization (003 §9.2) of a GPT with LoRA adapters.

    numpytfmr dpo                                    # base on sort_either, then DPO (~1 min)
    numpytfmr dpo --checkpoint runs/either           # start from a checkpoint
    numpytfmr dpo --pairs synthetic --prefer sort_desc

The run, step by step:

1. Base model: ``--checkpoint``, or a small GPT trained here on ``"sort_either"``, where
   ascending and descending answers are equally likely: it sorts correctly, each way for
   about half of the prompts.
2. Preference pairs from its own generations (003 §9.1.1): ``--samples`` completions per
   training prompt, sampled at temperature 1; a verifier labels a completion preferred when
   it is the ``--prefer`` sort of the prompt (default ascending). Each prompt with a
   preferred and an other sample gives a pair (chosen, rejected). ``--pairs synthetic``
   uses ``make_preference_pairs`` (ascending vs. descending) instead.
3. DPO: the policy is base + LoRA adapters, the reference the frozen base; the loss
   ``-log sigma(beta ((pc - rc) - (pr - rr)))`` over completion log-probabilities
   (eq. 9.1), plus ``--nll-weight`` (default 1) times the chosen answers' negative
   log-likelihood per token. Plain DPO (``--nll-weight 0``) only asks the chosen answer to
   gain on the rejected one relative to the reference; on this task it does so partly by
   making both less likely, and the adapters that push descending answers down also
   spoil some ascending ones (mis-sorted answers: 75-95 % preferred over three seeds,
   getting worse with longer training). The NLL term keeps the chosen answers likely
   (97-99 %).
4. Held-out evaluation (prompts of the test split, two to max digits, with distinct
   ascending and descending answers): the rate of greedy generations that follow the
   preferred behaviour before and after; on held-out pairs (preferred vs. the opposite
   sort) the preference accuracy and mean reward margin of the implicit rewards
   ``beta log(pi/pi_ref)``; and the KL divergence of the policy from the reference: the
   mean over the generated tokens of the policy's greedy completions of
   ``KL(pi(.|prefix) || pi_ref(.|prefix))``, the exact KL of the two next-token
   distributions (``kl``; ``kl_per_sequence`` sums it over each completion).

The model runs on the fast path (``numpytfmr.fast.posttrain``: the same numbers as
``numpytfmr.posttrain``).
"""
import time

from numpytfmr.run import tune_text
from numpytfmr.run.adapters import (adapter_command, adapter_settings, budget_note,
                                    save_adapted, snapshot, timed,
                                    train_adapters, unchanged)
from numpytfmr.run.cli import nonnegative_float, positive_float, positive_int
from numpytfmr.run.options import (add_adapter_options, add_adapter_run_options, add_base_options,
                                   add_data_options, command_parser)
from numpytfmr.run.outputs import finish

DPO_DEFAULTS = {"rank": 4, "alpha": 8.0, "targets": "Wq,Wv", "steps": 200, "lr": 1e-3,
                "batch_size": 64, "warmup_steps": 10, "eval_every": 50}
OPPOSITE = {"sort": "sort_desc", "sort_desc": "sort"}


def _prompt_set(n, *, split, seed, min_len, max_len, prefer, tokenizer):
    """``n`` distinct prompts whose preferred and opposite answers differ, as a
    ``make_task`` dict of the preferred task."""
    import numpy as np

    from numpytfmr.run.data import make_task, task_target
    d = make_task(prefer, 2 * n, rng=np.random.default_rng(seed), split=split, min_len=min_len,
                  max_len=max_len, unique=True, tokenizer=tokenizer)
    keep = [i for i, q in enumerate(d["prompts"])
            if task_target(prefer, q) != task_target(OPPOSITE[prefer], q)][:n]
    out = dict(d)
    for k in ("prompts", "targets"):
        out[k] = [d[k][i] for i in keep]
    for k in ("ids", "loss_mask", "prompt_lengths"):
        out[k] = d[k][keep]
    return out


def _behaviour(params, config, data, prefer, tokenizer):
    """Greedy completions of ``data``'s prompts and the rates of each behaviour."""
    import numpy as np

    from numpytfmr.run.data import decode_completion, task_target
    from numpytfmr.fast.posttrain import complete_prompts
    seqs, mask = complete_prompts(params, data["ids"], data["prompt_lengths"], config=config,
                                  max_new_tokens=int(data["max_target_len"]) + 1)
    texts = [decode_completion(seqs[i, L:], tokenizer)
             for i, L in enumerate(data["prompt_lengths"])]
    good = np.array([t == task_target(prefer, q) for t, q in zip(texts, data["prompts"])])
    bad = np.array([t == task_target(OPPOSITE[prefer], q) for t, q in zip(texts, data["prompts"])])
    return {"preferred": float(good.mean()), "opposite": float(bad.mean()),
            "other": float(1.0 - good.mean() - bad.mean()), "seqs": seqs, "mask": mask,
            "texts": texts}


def _generated_pairs(params, config, tokenizer, prompts, *, prefer, n_samples, rng):
    """Pairs from the base model's own samples, labelled by the verifier."""
    import numpy as np

    from numpytfmr.run.data import decode_completion, task_target
    from numpytfmr.fast.posttrain import complete_prompts
    from numpytfmr.posttrain import preference_pairs_from_samples
    index = np.repeat(np.arange(len(prompts["prompts"])), n_samples)
    lengths = prompts["prompt_lengths"][index]
    seqs, mask = complete_prompts(params, prompts["ids"][index], lengths, config=config,
                                  max_new_tokens=int(prompts["max_target_len"]) + 1,
                                  temperature=1.0, rng=rng)
    preferred = np.array([decode_completion(seqs[i, L:], tokenizer)
                          == task_target(prefer, prompts["prompts"][index[i]])
                          for i, L in enumerate(lengths)])
    pairs = preference_pairs_from_samples(seqs, mask, index, preferred)
    return pairs, {"samples": int(index.size), "preferred_samples": int(preferred.sum()),
                   "sampled_preferred_rate_before": float(preferred.mean())}


def _synthetic_pairs(n, *, prefer, seed, min_len, max_len, tokenizer):
    from numpytfmr.run.data import make_preference_pairs
    d = make_preference_pairs(n, rng=seed, split="train", chosen=prefer, rejected=OPPOSITE[prefer],
                              min_len=min_len, max_len=max_len, tokenizer=tokenizer)
    return {k: d[k] for k in ("chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask")}


def _logprobs(params, adapters, ids, mask, *, config, alpha, batch=512):
    import numpy as np

    from numpytfmr.fast.posttrain import completion_logprobs_forward
    return np.concatenate([completion_logprobs_forward(params, adapters, ids[i:i + batch],
                                                       mask[i:i + batch], config=config,
                                                       alpha=alpha)[0]
                           for i in range(0, ids.shape[0], batch)])


@adapter_command("dpo", tune_text.dpo_text)
def cmd_dpo(args, targets, start, base):
    import numpy as np

    from numpytfmr.run.data import make_preference_pairs
    from numpytfmr.fast.posttrain import completion_kl, dpo_loss_and_grads
    from numpytfmr.posttrain import add_lora, lora_parameter_counts, merge_lora
    from numpytfmr.preference import dpo_loss_forward
    from numpytfmr.run.loop import STREAM_DATA, STREAM_INIT, STREAM_TEST, step_rng
    from numpytfmr.run.tasks import task_record

    params, config, tok = base["params"], base["config"], base["tokenizer"]
    prefer, max_len = args.prefer, base["max_len"]
    min_len = max(2, base["min_len"])          # one digit has no order to prefer
    test = _prompt_set(args.n_test, split="test", seed=(args.seed, STREAM_TEST), min_len=min_len,
                       max_len=max_len, prefer=prefer, tokenizer=tok)
    before = snapshot(params)
    rates_before, eval_seconds = timed(_behaviour, params, config, test, prefer, tok)

    # 2. preference pairs
    t0 = time.perf_counter()
    if args.pairs == "generated":
        prompts = _prompt_set(args.n_prompts, split="train", seed=(args.seed, STREAM_DATA),
                              min_len=min_len, max_len=max_len, prefer=prefer, tokenizer=tok)
        pairs, sample_stats = _generated_pairs(params, config, tok, prompts, prefer=prefer,
                                               n_samples=args.samples,
                                               rng=step_rng(args.seed, 0, STREAM_DATA))
    else:
        pairs = _synthetic_pairs(args.n_prompts, prefer=prefer, seed=args.seed, min_len=min_len,
                                 max_len=max_len, tokenizer=tok)
        sample_stats = {}
    n_pairs = pairs["chosen_ids"].shape[0]
    if n_pairs == 0:
        raise ValueError("dpo: no preference pairs: every sampled completion of every prompt "
                         "had the same label; use --samples larger or --pairs synthetic")
    # the reference log-probs never change: computed once
    ref_c = _logprobs(params, None, pairs["chosen_ids"], pairs["chosen_mask"], config=config,
                      alpha=None)
    ref_r = _logprobs(params, None, pairs["rejected_ids"], pairs["rejected_mask"], config=config,
                      alpha=None)
    pair_seconds = time.perf_counter() - t0

    # 3. DPO on the adapters
    adapters = add_lora(params, config, r=args.rank, targets=targets,
                        rng=step_rng(args.seed, 0, STREAM_INIT))
    counts = lora_parameter_counts(params, adapters)
    settings = adapter_settings(args)
    alpha, beta = args.alpha, args.beta
    B = min(settings.batch_size, n_pairs)

    def loss_and_grads(a, step):
        idx = step_rng(settings.seed, step).choice(n_pairs, B, replace=False)
        batch = {k: pairs[k][idx] for k in ("chosen_ids", "chosen_mask", "rejected_ids",
                                            "rejected_mask")}
        loss, grads, _ = dpo_loss_and_grads(params, a, batch, config=config, alpha=alpha,
                                            beta=beta, ref_chosen=ref_c[idx],
                                            ref_rejected=ref_r[idx], nll_weight=args.nll_weight)
        return loss, grads, 2 * batch["chosen_ids"].size

    def evaluate(a):
        r = _behaviour(merge_lora(params, a, alpha=alpha), config, test, prefer, tok)
        return {"preferred_rate": r["preferred"], "opposite_rate": r["opposite"]}

    adapters, history, dpo_seconds, plan = train_adapters(
        adapters, loss_and_grads, settings, evaluate, args, "dpo",
        # after the last step: the final evaluation, the merged model's, the held-out pairs, KL
        budget=(start, eval_seconds, 3.5) if args.minutes else None)
    settings = plan.pop("settings")

    # 4. held-out evaluation
    merged = merge_lora(params, adapters, alpha=alpha)
    rates_after = _behaviour(merged, config, test, prefer, tok)
    held = make_preference_pairs(args.n_test, rng=np.random.default_rng((args.seed, STREAM_TEST)),
                                 split="test", chosen=prefer, rejected=OPPOSITE[prefer],
                                 min_len=min_len, max_len=max_len, unique=True, tokenizer=tok)
    lp = {}
    for side in ("chosen", "rejected"):
        ids, mask = held[f"{side}_ids"], held[f"{side}_mask"]
        lp[side] = (_logprobs(params, adapters, ids, mask, config=config, alpha=alpha),
                    _logprobs(params, None, ids, mask, config=config, alpha=None))
    _, dcache = dpo_loss_forward(lp["chosen"][0], lp["rejected"][0], lp["chosen"][1],
                                 lp["rejected"][1], beta=beta)
    kl = completion_kl(params, adapters, rates_after["seqs"], rates_after["mask"], config=config,
                       alpha=alpha)

    checkpoint = save_adapted(args, base, merged, adapters, targets,
                              task_record(prefer, min_len, max_len, args.n_test),
                              dpo={"beta": beta, "nll_weight": args.nll_weight,
                                   "pairs": args.pairs})
    seconds = time.perf_counter() - start
    summary = {
        "command": "dpo", "prefer": prefer, "base_task": base["task"],
        "preferred_rate_before": rates_before["preferred"],
        "preferred_rate_after": rates_after["preferred"],
        "opposite_rate_before": rates_before["opposite"],
        "opposite_rate_after": rates_after["opposite"],
        "other_rate_before": rates_before["other"], "other_rate_after": rates_after["other"],
        "preference_accuracy": dcache["accuracy"],
        "reward_margin": float(np.mean(dcache["margins"])),
        "chosen_reward": float(np.mean(dcache["chosen_rewards"])),
        "rejected_reward": float(np.mean(dcache["rejected_rewards"])),
        "kl": kl["kl_per_token"], "kl_per_sequence": kl["kl_per_sequence"],
        "trainable_fraction": counts["fraction"], "lora_parameters": counts["lora"],
        "base_parameters": counts["base"], "lora_rank": args.rank, "lora_alpha": alpha,
        "targets": list(targets), "beta": beta, "nll_weight": args.nll_weight,
        "pairs": args.pairs, "n_pairs": int(n_pairs), **sample_stats,
        "n_test": len(test["prompts"]), "steps": history["step"],
        "loss": float(np.mean(history["loss"][-20:])),
        "seconds": seconds, "base_seconds": base["seconds"], "pair_seconds": pair_seconds,
        "dpo_seconds": dpo_seconds, "base_weights_unchanged": unchanged(params, before),
        "base_exact_match": base["exact_match"], "base_checkpoint": base["checkpoint"],
        "checkpoint": checkpoint, "settings": settings.to_dict(), **plan,
        "evals": history["evals"],
        "loss_history": history["loss"]}
    lines = [f"preferred behaviour ({prefer}) on {len(test['prompts'])} held-out prompts: "
             f"{100 * rates_before['preferred']:.1f}% before, "
             f"{100 * rates_after['preferred']:.1f}% after DPO "
             f"(opposite {100 * rates_after['opposite']:.1f}%, other "
             f"{100 * rates_after['other']:.1f}%)",
             f"held-out pairs: preference accuracy {100 * dcache['accuracy']:.1f}%, reward margin "
             f"{summary['reward_margin']:.3f}; KL from the reference {kl['kl_per_token']:.4f} "
             "nats per token",
             f"trained {counts['lora']:,} of {counts['base']:,} parameters "
             f"({100 * counts['fraction']:.2f}%) on {n_pairs} pairs; {seconds:.0f} s in all"
             f"{budget_note(args, plan)}"]
    if checkpoint is not None:
        lines.append(f"merged model: {checkpoint}")
    finish(args, summary, lines)
    return 0


def add_command(sub):
    p = command_parser(sub, "dpo")
    add_base_options(p, task="sort_either", steps=1000)
    g = p.add_argument_group("preferences of the built-in task (without --data)")
    g.add_argument("--prefer", choices=tuple(OPPOSITE),
                   help="the preferred behaviour: ascending (sort, default) or descending "
                   "(sort_desc) answers")
    g.add_argument("--pairs", choices=("generated", "synthetic"),
                   help="pairs from the base model's samples labelled by the verifier "
                   "(generated, default), or written out (synthetic)")
    g.add_argument("--n-prompts", type=positive_int, metavar="N",
                   help="training prompts (default 1024)")
    g.add_argument("--samples", type=positive_int, metavar="K",
                   help="completions sampled per prompt, with --pairs generated (default 4)")
    p.set_defaults(task_defaults={"prefer": "sort", "pairs": "generated", "n_prompts": 1024,
                                  "samples": 4})
    g = p.add_argument_group("DPO")
    g.add_argument("--beta", type=positive_float, default=1.0,
                   help="DPO's beta, the strength of the pull towards the reference (default 1.0)")
    g.add_argument("--nll-weight", type=nonnegative_float, default=1.0, metavar="W",
                   help="add W times the chosen answers' NLL per token (DPO + NLL, as TRL's "
                   "rpo_alpha; default 1; 0 = plain DPO, which on the sort task also learns to "
                   "prefer ascending answers but lets some of them go wrong)")
    add_data_options(p, "dpo")
    add_adapter_options(p, DPO_DEFAULTS)
    add_adapter_run_options(p, "runs/dpo")
    p.set_defaults(func=cmd_dpo)
