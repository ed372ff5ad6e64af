"""What ``numpytfmr lora`` and ``numpytfmr dpo`` run on a model of text (a checkpoint of
``numpytfmr pretrain``) with one's own data; the functions are in ``numpytfmr.run.posttext``,
the data flags (``--text``, ``--data``, ...) and their checks in ``run/options.py``.

Each reports its held-out figures before and after, draws its curves, and saves the tuned
model as a checkpoint of text with ``adapters.npz`` (LoRA) and ``tokenizer.json`` beside
it (docs/learner.md, "Fine-tuning on your own data").
"""
import os
import time

from numpytfmr.run.adapters import (adapter_settings, budget_note, snapshot, timed,
                                    train_adapters, unchanged)
from numpytfmr.run.options import read_text
from numpytfmr.run.outputs import finish, out_dir

def _save(args, base, params, adapters, extra):
    """The tuned model as a checkpoint of text, with adapters.npz (LoRA) and tokenizer.json;
    returns the checkpoint.json path (None for --out none)."""
    from numpytfmr.shared import fileio
    from numpytfmr.run.checkpoint import save_checkpoint
    from numpytfmr.run.pretrain import TOKENIZER_FILE
    from numpytfmr.run.tokenizers import save_tokenizer
    out = out_dir(args)
    if out is None:
        return None
    task = dict(base["record"], **extra)
    path = save_checkpoint(out, kind="gpt", config=base["config"].to_dict(), params=params,
                           meta={"tokenizer": base["tokenizer"].to_dict(), "task": task})
    if adapters is not None:
        fileio.save_arrays(os.path.join(out, "adapters.npz"), adapters)
    save_tokenizer(base["tokenizer"], os.path.join(out, TOKENIZER_FILE))
    return path


def _initial_history(metrics):
    return {"step": 0, "seconds": 0.0, "tokens": 0, "loss": [], "evals": [{"step": 0, **metrics}]}


def lora_text(args, targets, start, base):
    """LoRA on a model of text: continued language modelling of --text, or the completions
    of --data rows."""
    import numpy as np

    from numpytfmr.fast.posttrain import gpt_lora_loss
    from numpytfmr.posttrain import add_lora, lora_parameter_counts, merge_lora
    from numpytfmr.run.batches import get_batch
    from numpytfmr.run.checkpoint import load_model
    from numpytfmr.run.loop import STREAM_INIT, step_rng
    from numpytfmr.run.posttext import (PROMPT_COMPLETION, completion_arrays, completion_metrics,
                                        read_rows, split_rows, split_stream)
    from numpytfmr.run.pretrain import encode_text, evaluate_text
    from numpytfmr.run.tasks import IGNORE
    from numpytfmr.run.tokenizers import token_byte_lengths

    params, config, tok = base["params"], base["config"], base["tokenizer"]
    T = config.max_len
    settings = adapter_settings(args)
    if args.text:
        ids = encode_text(tok, read_text(args.text, "--text"))
        val = encode_text(tok, read_text(args.val_text, "--val-text")) if args.val_text else None
        train_ids, val_ids = split_stream(ids, val, T)
        lengths = token_byte_lengths(tok)
        kind, n_train, n_val = "text", int(train_ids.size), int(val_ids.size)

        def evaluate_params(p):
            m = evaluate_text(p, config, val_ids, lengths)
            return {"val_loss": m["val_loss"], "val_bits_per_byte": m["val_bits_per_byte"]}

        def batch(step):
            return get_batch(train_ids, settings.batch_size, T, rng=step_rng(settings.seed, step))
        truncated = 0
    else:
        rows = read_rows(args.data, PROMPT_COMPLETION, tok)
        val_rows = read_rows(args.val_data, PROMPT_COMPLETION, tok, flag="--val-data") \
            if args.val_data else None
        train_rows, val_rows = split_rows(rows, val_rows)
        tr = completion_arrays(tok, train_rows, T)
        va = completion_arrays(tok, val_rows, T)
        (ids, mask), (vids, vmask) = tr["completion"], va["completion"]
        kind, n_train, n_val = "prompt-completion", len(train_rows), len(val_rows)
        truncated = tr["truncated"] + va["truncated"]

        def evaluate_params(p):
            return completion_metrics(p, config, tok, vids, vmask)

        def batch(step):
            idx = step_rng(settings.seed, step).choice(len(ids), min(settings.batch_size,
                                                                     len(ids)), replace=False)
            x, y, m = ids[idx, :-1], ids[idx, 1:], mask[idx, 1:]
            return x, np.where(m, y, IGNORE)

    alpha = args.alpha
    before = snapshot(params)
    first, eval_seconds = timed(evaluate_params, params)
    adapters = add_lora(params, config, r=args.rank, targets=targets,
                        rng=step_rng(args.seed, 0, STREAM_INIT))
    counts = lora_parameter_counts(params, adapters)

    def loss_and_grads(a, step):
        x, y = batch(step)
        loss, grads = gpt_lora_loss(params, a, x, y, config=config, alpha=alpha,
                                    ignore_index=IGNORE)
        return loss, grads, x.size

    adapters, history, lora_seconds, plan = train_adapters(
        adapters, loss_and_grads, settings, lambda a: evaluate_params(merge_lora(params, a,
                                                                                 alpha=alpha)),
        args, f"lora {kind}", history=_initial_history(first),
        # after the last step: the final evaluation and the save
        budget=(start, eval_seconds, 1.5) if args.minutes else None)
    settings = plan.pop("settings")
    merged = merge_lora(params, adapters, alpha=alpha)
    last = history["evals"][-1]
    checkpoint = _save(args, base, merged, adapters, {"lora": {
        "rank": args.rank, "alpha": alpha, "targets": list(targets), "data": kind,
        "base_checkpoint": base["checkpoint"]}})
    if checkpoint is not None:              # what was saved is what was scored, bit for bit
        saved = load_model(checkpoint, kind="gpt")["params"]
        if set(saved) != set(merged) or not all(np.array_equal(saved[k], merged[k])
                                                 for k in merged):
            raise ValueError(f"lora: the model saved in {checkpoint} is not the one trained")
    seconds = time.perf_counter() - start
    summary = {
        "command": "lora", "data": kind, "data_source": args.text or args.data,
        "val_source": args.val_text if args.text else args.val_data,
        "train_size": n_train, "val_size": n_val, "truncated": truncated,
        "val_loss_before": first["val_loss"], "val_loss_after": last["val_loss"],
        "val_bits_per_byte_before": first["val_bits_per_byte"],
        "val_bits_per_byte_after": last["val_bits_per_byte"],
        "trainable_fraction": counts["fraction"], "lora_parameters": counts["lora"],
        "base_parameters": counts["base"], "lora_rank": args.rank, "lora_alpha": alpha,
        "targets": list(targets), "steps": history["step"],
        "loss": float(np.mean(history["loss"][-50:])), "seconds": seconds,
        "lora_seconds": lora_seconds, "base_weights_unchanged": unchanged(params, before),
        "base_checkpoint": base["checkpoint"], "checkpoint": checkpoint,
        "settings": settings.to_dict(), **plan, "evals": history["evals"],
        "loss_history": history["loss"]}
    unit = "token" if kind == "text" else "completion token"
    what = "held-out text" if kind == "text" else f"{n_val} held-out rows"
    lines = [f"{what}: {first['val_bits_per_byte']:.3f} -> {last['val_bits_per_byte']:.3f} "
             f"bits per byte, {first['val_loss']:.3f} -> {last['val_loss']:.3f} nats per {unit} "
             f"(base model -> after {history['step']} LoRA steps)",
             f"trained {counts['lora']:,} of {counts['base']:,} parameters "
             f"({100 * counts['fraction']:.2f}%) on {n_train:,} "
             f"{'tokens' if kind == 'text' else 'rows'}; {seconds:.0f} s in all"
             f"{budget_note(args, plan)}"]
    if truncated:
        lines.append(f"{truncated} sequences were cut to the context window ({T} tokens)")
    if checkpoint is not None:
        lines.append(f"merged model: {checkpoint} (adapters: "
                     f"{os.path.join(os.path.dirname(checkpoint), 'adapters.npz')})")
    from numpytfmr.run.plot import run_panels
    finish(args, summary, lines, run_panels(summary, ["val_loss", "val_bits_per_byte"]),
           f"numpytfmr lora: {os.path.basename(args.text or args.data)}")
    return 0


def dpo_text(args, targets, start, base):
    """DPO on a model of text with --data preference rows, LoRA or every weight (--full),
    the reference being the frozen start model."""
    import numpy as np

    from numpytfmr.fast.posttrain import dpo_loss_and_grads as lora_dpo
    from numpytfmr.posttrain import add_lora, dpo_loss_and_grads, lora_parameter_counts, \
        merge_lora
    from numpytfmr.run.loop import STREAM_INIT, step_rng
    from numpytfmr.run.posttext import (PREFERENCE, full_logprobs, pair_arrays,
                                        preference_metrics, read_rows, sequence_logprobs,
                                        split_rows)

    params, config, tok = base["params"], base["config"], base["tokenizer"]
    T = config.max_len
    rows = read_rows(args.data, PREFERENCE, tok)
    val_rows = read_rows(args.val_data, PREFERENCE, tok, flag="--val-data") \
        if args.val_data else None
    train_rows, val_rows = split_rows(rows, val_rows)
    pairs, held = pair_arrays(tok, train_rows, T), pair_arrays(tok, val_rows, T)
    keys = ("chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask")
    ref = {name: (sequence_logprobs(params, config, d["chosen_ids"], d["chosen_mask"]),
                  sequence_logprobs(params, config, d["rejected_ids"], d["rejected_mask"]))
           for name, d in (("train", pairs), ("held", held))}
    settings = adapter_settings(args)
    alpha, beta, full = args.alpha, args.beta, args.full
    before = snapshot(params)
    if full:
        trainable = {k: v.copy() for k, v in params.items()}
        counts = {"lora": sum(v.size for v in params.values()),
                  "base": sum(v.size for v in params.values()), "fraction": 1.0}

        def policy(w):
            return w
    else:
        trainable = add_lora(params, config, r=args.rank, targets=targets,
                             rng=step_rng(args.seed, 0, STREAM_INIT))
        counts = lora_parameter_counts(params, trainable)

        def policy(a):
            return merge_lora(params, a, alpha=alpha)
    n = pairs["chosen_ids"].shape[0]
    B = min(settings.batch_size, n)

    def loss_and_grads(w, step):
        idx = step_rng(settings.seed, step).choice(n, B, replace=False)
        batch = {k: pairs[k][idx] for k in keys}
        common = dict(config=config, beta=beta, ref_chosen=ref["train"][0][idx],
                      ref_rejected=ref["train"][1][idx], nll_weight=args.nll_weight)
        if full:
            loss, grads, _ = dpo_loss_and_grads(params, w, batch, alpha=None,
                                                logprobs=full_logprobs(), **common)
        else:
            loss, grads, _ = lora_dpo(params, w, batch, alpha=alpha, **common)
        return loss, grads, 2 * batch["chosen_ids"].size

    def evaluate(w):
        return preference_metrics(policy(w), config, held, *ref["held"], beta=beta)

    first, eval_seconds = timed(evaluate, trainable)
    trainable, history, dpo_seconds, plan = train_adapters(
        trainable, loss_and_grads, settings, evaluate, args, "dpo" + (" (full)" if full else ""),
        history=_initial_history(first),
        # after the last step: the final evaluation and the save
        budget=(start, eval_seconds, 1.5) if args.minutes else None)
    settings = plan.pop("settings")
    last = history["evals"][-1]
    tuned = policy(trainable)
    checkpoint = _save(args, base, tuned, None if full else trainable, {"dpo": {
        "beta": beta, "nll_weight": args.nll_weight, "full": full,
        "rank": None if full else args.rank, "alpha": None if full else alpha,
        "targets": None if full else list(targets), "data": args.data,
        "base_checkpoint": base["checkpoint"]}})
    seconds = time.perf_counter() - start
    trl = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")
    summary = {
        "command": "dpo", "data": "preference", "data_source": args.data,
        "val_source": args.val_data, "train_pairs": int(n), "val_pairs": len(val_rows),
        "truncated": pairs["truncated"] + held["truncated"], "full": full,
        "before": first, "after": last, **{k: last[k] for k in trl},
        "beta": beta, "nll_weight": args.nll_weight,
        "trainable_fraction": counts["fraction"], "trained_parameters": counts["lora"],
        "base_parameters": counts["base"], "lora_rank": None if full else args.rank,
        "lora_alpha": None if full else alpha, "targets": None if full else list(targets),
        "steps": history["step"], "loss": float(np.mean(history["loss"][-20:])),
        "seconds": seconds, "dpo_seconds": dpo_seconds,
        "base_weights_unchanged": unchanged(params, before),
        "base_checkpoint": base["checkpoint"], "checkpoint": checkpoint,
        "settings": settings.to_dict(), **plan, "evals": history["evals"],
        "loss_history": history["loss"]}
    shown = lambda m: ", ".join(f"{k} {m[k]:.3f}" for k in trl)  # noqa: E731
    lines = [f"held-out pairs ({len(val_rows)}), before: {shown(first)}",
             f"held-out pairs ({len(val_rows)}), after {history['step']} steps: {shown(last)}",
             f"trained {counts['lora']:,} of {counts['base']:,} parameters "
             f"({100 * counts['fraction']:.2f}%) on {n} pairs against the frozen start model; "
             f"{seconds:.0f} s in all{budget_note(args, plan)}"]
    if checkpoint is not None:
        lines.append(f"tuned model: {checkpoint}")
    from numpytfmr.run.plot import run_panels
    finish(args, summary, lines, run_panels(summary, list(trl)),
           f"numpytfmr dpo: {os.path.basename(args.data)}")
    return 0
