"""``numpytfmr lora``: adapt a trained GPT to a related task by training LoRA adapters only
(000 §2.7), then merge them for inference.

    numpytfmr lora                                   # sort -> sort_desc, base included (~1 min)
    numpytfmr lora --checkpoint runs/gpt             # adapt a model of 'numpytfmr train'
    numpytfmr lora --base-task reverse               # reverse -> rotate
    numpytfmr lora --rank 8 --targets Wq,Wv --steps 800

Without ``--checkpoint`` the command first trains its own small base model (2 layers,
d_model 64, prompts of 1-6 digits) on ``--base-task``. The base weights stay frozen (the
summary records that they are bitwise unchanged); only the adapters ``A``, ``B`` of the
chosen projections are trained, on the target task (default: the related task of the
base's: sort <-> sort_desc, reverse <-> rotate). The adapted model is scored by greedy
exact match on held-out prompts of the target task, and merged (``W' = W + s A B``) into a
plain GPT checkpoint that ``numpytfmr generate --checkpoint DIR`` runs.

Defaults: rank 4, alpha 8, all four attention projections (3.9 % of the parameters),
1200 AdamW steps at lr 1e-2: 99-100 % exact match on sort -> sort_desc. Queries and
values alone (``--targets Wq,Wv``, 2 %) reach about 95 % in 800 steps; reverse -> rotate
is harder for a low-rank update (about 75 % with the defaults, 85 % adding the FFN).

Training and evaluation run on the fast path (``numpytfmr.fast.posttrain``: the same
numbers as ``numpytfmr.posttrain``).
"""
import time

from numpytfmr.run import tune_text
from numpytfmr.run.adapters import (adapter_command, adapter_settings, budget_note,
                                    save_adapted, snapshot, timed,
                                    train_adapters, unchanged)
from numpytfmr.run.cli import UsageError
from numpytfmr.run.options import (BASE_DEFAULTS, add_adapter_options, add_adapter_run_options,
                                   add_base_options, add_data_options, command_parser)
from numpytfmr.run.outputs import finish, out_dir

RELATED_TASKS = {"sort": "sort_desc", "sort_desc": "sort", "reverse": "rotate",
                 "rotate": "reverse", "sort_either": "sort"}
LORA_DEFAULTS = {"rank": 4, "alpha": 8.0, "targets": "Wq,Wk,Wv,Wo", "steps": 1200, "lr": 1e-2,
                 "batch_size": 64, "warmup_steps": 20, "clip_norm": 1.0, "eval_every": 300}


# ---------------------------------------------------------------------------------------
# Shared with ``numpytfmr dpo``
# ---------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------
# numpytfmr lora
# ---------------------------------------------------------------------------------------

def add_command(sub):
    from numpytfmr.run.data import TASKS
    p = command_parser(sub, "lora")
    add_base_options(p, task="sort", steps=BASE_DEFAULTS["steps"])
    g = p.add_argument_group("target")
    g.add_argument("--task", choices=[t for t in TASKS if t not in ("sort_either", "dyck")],
                   default=None, help="target task (default: related to the base's task: "
                   "sort <-> sort_desc, reverse <-> rotate)")
    add_data_options(p, "lora")
    add_adapter_options(p, LORA_DEFAULTS)
    add_adapter_run_options(p, "runs/lora")
    p.set_defaults(func=cmd_lora)


@adapter_command("lora", tune_text.lora_text)
def cmd_lora(args, targets, start, base):
    import numpy as np

    from numpytfmr.run.data import make_task
    from numpytfmr.fast.posttrain import gpt_lora_loss
    from numpytfmr.posttrain import add_lora, lora_parameter_counts, merge_lora, unmerge_lora
    from numpytfmr.run.checkpoint import load_model
    from numpytfmr.run.loop import STREAM_INIT, STREAM_TEST, step_rng
    from numpytfmr.run.tasks import IGNORE, evaluate_gpt, gpt_task_data, task_record

    params, config, tok = base["params"], base["config"], base["tokenizer"]
    task = args.task or RELATED_TASKS.get(base["task"])
    if task is None:
        raise UsageError(f"--task: the base model's task is {base['task']!r}, which has no "
                         "related task; name the target with --task")
    min_len, max_len = base["min_len"], base["max_len"]
    # the same held-out prompts for both tasks (the split is a function of the prompt)
    test = make_task(task, args.n_test, rng=np.random.default_rng((args.seed, STREAM_TEST)),
                     split="test", min_len=min_len, max_len=max_len, unique=True, tokenizer=tok)
    base_test = None
    if base["task"] in RELATED_TASKS and base["task"] != "sort_either":
        base_test = make_task(base["task"], args.n_test,
                              rng=np.random.default_rng((args.seed, STREAM_TEST)), split="test",
                              min_len=min_len, max_len=max_len, unique=True, tokenizer=tok)
    before = snapshot(params)
    first, eval_seconds = timed(evaluate_gpt, params, config, test)
    target_before = first["exact_match"]
    base_task_before = None
    if base_test is not None:
        base_task_before = evaluate_gpt(params, config, base_test)["exact_match"]

    adapters = add_lora(params, config, r=args.rank, targets=targets,
                        rng=step_rng(args.seed, 0, STREAM_INIT))
    counts = lora_parameter_counts(params, adapters)
    settings = adapter_settings(args)
    alpha = args.alpha

    def loss_and_grads(a, step):
        inputs, labels = gpt_task_data(task, step, seed=settings.seed + 1,
                                       batch_size=settings.batch_size, min_len=min_len,
                                       max_len=max_len, tokenizer=tok)
        loss, grads = gpt_lora_loss(params, a, inputs, labels, config=config, alpha=alpha,
                                    ignore_index=IGNORE)
        return loss, grads, inputs.size

    def evaluate(a):
        return evaluate_gpt(merge_lora(params, a, alpha=alpha), config, test)

    adapters, history, lora_seconds, plan = train_adapters(
        adapters, loss_and_grads, settings, evaluate, args, f"lora {task}",
        # after the last step: the final evaluation, the saved model's, the base task's two
        budget=(start, eval_seconds, 2.0 + 2.0 * (base_test is not None)) if args.minutes
        else None)
    settings = plan.pop("settings")

    merged = merge_lora(params, adapters, alpha=alpha)
    exact = history["evals"][-1]["exact_match"]
    restored = unmerge_lora(merged, adapters, alpha=alpha)
    unmerge_error = max(float(np.max(np.abs(restored[k] - params[k]))) for k in params)
    checkpoint = save_adapted(args, base, merged, adapters, targets,
                              task_record(task, min_len, max_len, args.n_test))
    if checkpoint is not None:
        merged = load_model(out_dir(args), kind="gpt")["params"]     # score what was saved
    merged_exact = evaluate_gpt(merged, config, test)["exact_match"]
    base_task_after = adapted_base_task = None
    if base_test is not None:
        base_task_after = evaluate_gpt(params, config, base_test)["exact_match"]
        adapted_base_task = evaluate_gpt(merged, config, base_test)["exact_match"]
    seconds = time.perf_counter() - start
    summary = {
        "command": "lora", "task": task, "base_task": base["task"],
        "exact_match": exact, "merged_exact_match": merged_exact,
        "target_exact_match_before": target_before,
        "base_task_exact_match_before": base_task_before,
        "base_task_exact_match_after": base_task_after,
        "adapted_base_task_exact_match": adapted_base_task,
        "trainable_fraction": counts["fraction"], "lora_parameters": counts["lora"],
        "base_parameters": counts["base"], "adapted_matrix_parameters": counts["adapted"],
        "lora_rank": args.rank, "lora_alpha": alpha, "targets": list(targets),
        "steps": history["step"], "loss": float(np.mean(history["loss"][-50:])),
        "seconds": seconds, "base_seconds": base["seconds"], "lora_seconds": lora_seconds,
        "base_weights_unchanged": unchanged(params, before),
        "unmerge_max_abs_error": unmerge_error,
        "base_checkpoint": base["checkpoint"], "checkpoint": checkpoint,
        "settings": settings.to_dict(), **plan, "evals": history["evals"],
        "loss_history": history["loss"]}
    lines = [f"{base['task']} -> {task}: exact match {100 * exact:.1f}% on held-out prompts "
             f"(base model {100 * target_before:.1f}%), training {counts['lora']:,} of "
             f"{counts['base']:,} parameters ({100 * counts['fraction']:.2f}%), "
             f"{seconds:.0f} s in all{budget_note(args, plan)}"]
    if base_task_before is not None:
        lines.append(f"{base['task']}: the frozen base {100 * base_task_before:.1f}% before and "
                     f"{100 * base_task_after:.1f}% after; the adapted model "
                     f"{100 * adapted_base_task:.1f}%")
    if checkpoint is not None:
        lines.append(f"merged model: {checkpoint} (exact match {100 * merged_exact:.1f}%)")
    finish(args, summary, lines)
    return 0
