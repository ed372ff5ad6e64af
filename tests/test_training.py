"""The training loop, checkpoints and resuming (numpytfmr/run/: loop.py, checkpoint.py,
models.py, tasks.py), on tiny models."""
import json
import os

import numpy as np
import pytest

from numpytfmr.gpt import GPTConfig, generate, gpt_forward, init_gpt
from numpytfmr.shared import fileio
from numpytfmr.run.checkpoint import load_checkpoint, load_model, save_checkpoint
from numpytfmr.run.data import CharTokenizer, make_task, translation_tokenizers
from numpytfmr.run.loop import TrainSettings, step_rng, train_loop
from numpytfmr.run.models import replace_config, seq2seq_model
from numpytfmr.run.tasks import (alignment_table, complete, evaluate_gpt, gpt_task_data, train_gpt,
                                 train_seq2seq, translate)

TASK = dict(task="sort", min_len=1, max_len=4, n_test=20)


def tiny_config(**kw):
    cfg = dict(vocab_size=CharTokenizer().vocab_size, n_layers=1, d_model=16, n_heads=2,
               max_len=2 * TASK["max_len"] + 3, activation="relu")
    cfg.update(kw)
    return GPTConfig(**cfg)


def tiny_settings(**kw):
    s = dict(steps=12, batch_size=16, lr=1e-2, warmup_steps=2, eval_every=4, seed=3)
    s.update(kw)
    return TrainSettings(**s)


def files_in(path):
    return sorted(os.listdir(path))


# ---------------------------------------------------------------------------------------
# settings and data
# ---------------------------------------------------------------------------------------

def test_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainSettings(steps=10, warmup_steps=10)
    with pytest.raises(ValueError, match="lr"):
        TrainSettings(lr=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        TrainSettings(batch_size=0)
    s = tiny_settings()
    assert TrainSettings.from_dict(s.to_dict()) == s


def test_batches_are_a_function_of_seed_and_step():
    a = gpt_task_data("sort", 5, seed=1, batch_size=8, min_len=1, max_len=4)
    b = gpt_task_data("sort", 5, seed=1, batch_size=8, min_len=1, max_len=4)
    c = gpt_task_data("sort", 6, seed=1, batch_size=8, min_len=1, max_len=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])
    inputs, labels = a
    # the loss is taken on the answer and <eos> only: every labelled row holds its <eos>
    assert ((labels == 2).sum(axis=1) == 1).all()
    assert (labels[:, 0] == -1).all()                   # never on the first prompt token


# ---------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------

def test_train_loop_fits_a_least_squares_problem():
    """The generic loop on a problem with a known minimum: AdamW drives w to w*."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 3))
    w_star = np.array([1.0, -2.0, 0.5])
    y = X @ w_star

    def loss_and_grads(p, step):
        r = X @ p["w"] - y
        return float(np.mean(r ** 2)), {"w": 2 * X.T @ r / len(y)}, len(y)

    params = {"w": np.zeros(3)}
    s = TrainSettings(steps=300, lr=0.1, warmup_steps=10, weight_decay=0.0, eval_every=100)
    evals = []
    new, state, hist = train_loop(params, loss_and_grads, s,
                                  evaluate=lambda p: {"err": float(np.abs(p["w"] - w_star).max())},
                                  log=evals.append)
    assert np.abs(new["w"] - w_star).max() < 1e-2
    assert params["w"].tolist() == [0.0, 0.0, 0.0]                # input not modified
    assert hist["step"] == 300 and len(hist["loss"]) == 300 and int(state["step"]) == 300
    assert [e["step"] for e in hist["evals"]] == [100, 200, 300] and len(evals) == 3
    # continuing from the returned state updates the loop's own copies, not the caller's
    before = {k: np.array(v, copy=True) for k, v in state.items()}
    more = TrainSettings(steps=310, lr=0.1, warmup_steps=10, weight_decay=0.0, eval_every=100)
    newer, state2, _ = train_loop(new, loss_and_grads, more, opt_state=state, history=hist)
    assert all(np.array_equal(state[k], before[k]) for k in state)
    assert int(state2["step"]) == 310 and not np.array_equal(newer["w"], new["w"])


def test_train_loop_stops_on_a_diverged_loss():
    def loss_and_grads(p, step):
        return float("nan"), {"w": np.ones(2)}, 1
    with pytest.raises(ValueError, match="diverged"):
        train_loop({"w": np.zeros(2)}, loss_and_grads, TrainSettings(steps=5, warmup_steps=0))


def test_the_reference_loop_and_the_fast_loop_give_the_same_weights():
    """fast=False steps with optim.clip_grad_norm / optim.adamw_step and the reference
    gpt_loss; fast=True with their in-place fast twins and fast.gpt_loss: a few steps of a
    tiny GPT in float64 end at the same weights and moments."""
    from numpytfmr import fast
    from numpytfmr.gpt import gpt_loss
    config = tiny_config(max_len=8)
    params = init_gpt(config, rng=np.random.default_rng(0), dtype=np.float64)
    s = TrainSettings(steps=6, batch_size=4, lr=3e-2, warmup_steps=1, clip_norm=0.5, seed=1,
                      eval_every=3)

    def batches(loss):
        def loss_and_grads(p, step):
            ids = step_rng(s.seed, step).integers(0, config.vocab_size, size=(4, 9))
            value, grads = loss(p, ids[:, :-1], ids[:, 1:], config=config)
            return value, grads, ids.size
        return loss_and_grads

    evals = {}
    runs = {}
    for name, loss, use_fast in (("reference", gpt_loss, False), ("fast", fast.gpt_loss, True)):
        evals[name] = []
        runs[name] = train_loop(params, batches(loss), s, fast=use_fast,
                                evaluate=lambda p: {"w": float(p["wte"].sum())},
                                log=evals[name].append)
    (ref_p, ref_state, ref_h), (fast_p, fast_state, fast_h) = runs["reference"], runs["fast"]
    assert set(ref_p) == set(fast_p) == set(params)
    for k in params:
        assert ref_p[k].dtype == fast_p[k].dtype == np.float64
        assert not np.array_equal(ref_p[k], params[k]), k         # every weight trained
        np.testing.assert_allclose(fast_p[k], ref_p[k], rtol=0, atol=1e-12, err_msg=k)
    for k in ref_state:
        np.testing.assert_allclose(fast_state[k], ref_state[k], rtol=0, atol=1e-12, err_msg=k)
    np.testing.assert_allclose(fast_h["loss"], ref_h["loss"], rtol=0, atol=1e-12)
    assert [e["step"] for e in ref_h["evals"]] == [e["step"] for e in fast_h["evals"]] == [3, 6]
    assert len(evals["reference"]) == len(evals["fast"]) == 2


def test_the_training_loop_fits_on_a_screen():
    """train_loop is the one flat loop a student reads: its code (docstring aside) fits on
    a screen, and the update it runs is named, fast or reference."""
    import ast
    import inspect
    from numpytfmr.run import loop
    tree = ast.parse(inspect.getsource(loop.train_loop)).body[0]
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body
    lines = body[-1].end_lineno - body[0].lineno + 1
    assert lines <= 45, lines
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert {"adamw_step", "clip_grad_norm", "adamw_step_", "clip_grad_norm_"} <= names
    assert len([n for n in ast.walk(tree) if isinstance(n, (ast.While, ast.For))]) == 1


def test_run_loop_goes_on_with_the_settings_a_replan_gives():
    """A re-plan ends the flat loop after a step and run_loop starts it again from there
    with the new total: the schedule decays towards it, the evaluation of the step
    reached is made once, and the run is the same as one planned that way from the start
    for the steps before the re-plan."""
    from numpytfmr.run.loop import run_loop, with_steps
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((32, 3)), rng.standard_normal(32)

    def loss_and_grads(p, step):
        r = X @ p["w"] - y
        return float(np.mean(r ** 2)), {"w": 2 * X.T @ r / len(y)}, len(y)

    s = TrainSettings(steps=6, lr=0.05, warmup_steps=1, eval_every=4)
    calls = []

    def replan(h, settings):
        calls.append((h["step"], settings.steps))
        return with_steps(settings, 10) if h["step"] == 4 and settings.steps == 6 else None

    def evaluate(p):
        return {"w0": float(p["w"][0])}
    params = {"w": np.zeros(3)}
    new, state, hist, final = run_loop(params, loss_and_grads, s, evaluate=evaluate,
                                       replan=replan)
    assert final.steps == 10 and hist["step"] == 10 and int(state["step"]) == 10
    assert [e["step"] for e in hist["evals"]] == [4, 8, 10]       # step 4 evaluated once
    assert [c[0] for c in calls] == list(range(1, 11))
    assert [c[1] for c in calls] == [6] * 4 + [10] * 6
    # the first four steps are those of a run of 6 steps, the rest those of a run of 10
    first, state4, h4 = train_loop(params, loss_and_grads, s, evaluate=evaluate,
                                   should_stop=lambda h: h["step"] == 4)
    assert h4["step"] == 4 and h4["loss"] == hist["loss"][:4]
    rest, _, _ = train_loop(first, loss_and_grads, final, opt_state=state4, history=h4)
    assert np.array_equal(rest["w"], new["w"])


def test_gpt_training_lowers_the_loss():
    _, summary = train_gpt(config=tiny_config(), settings=tiny_settings(steps=40, eval_every=40),
                           **TASK)
    first = float(np.mean(summary["loss_history"][:5]))
    last = float(np.mean(summary["loss_history"][-5:]))
    assert last < 0.7 * first, (first, last)
    assert summary["evals"][-1]["step"] == 40 and 0.0 <= summary["exact_match"] <= 1.0
    for key in ("exact_match", "loss", "steps", "seconds", "tokens_per_second", "config"):
        assert summary[key] is not None


# ---------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------

def saved_gpt(tmp_path, seed=0, step=7):
    cfg = tiny_config()
    params = init_gpt(cfg, rng=np.random.default_rng(seed))
    meta = {"tokenizer": CharTokenizer().to_dict(), "state": {"step": step}}
    save_checkpoint(tmp_path / "ck", kind="gpt", config=cfg.to_dict(), params=params, meta=meta)
    return cfg, params


def test_checkpoint_round_trip_is_bitwise(tmp_path):
    cfg, params = saved_gpt(tmp_path)
    ck = load_model(tmp_path / "ck")
    assert ck["model_config"] == cfg and ck["kind"] == "gpt"
    assert set(ck["params"]) == set(params)
    for k in params:
        assert ck["params"][k].dtype == params[k].dtype
        assert np.array_equal(ck["params"][k], params[k]), k
    ids = np.array([[1, 7, 5, 3], [1, 4, 4, 3]])
    a, _ = gpt_forward(params, ids, config=cfg)
    b, _ = gpt_forward(ck["params"], ids, config=ck["model_config"])
    assert a.tobytes() == b.tobytes()                    # identical logits, bit for bit
    # the JSON file itself is also accepted as the path
    assert load_model(tmp_path / "ck" / "checkpoint.json")["model_config"] == cfg


def test_a_new_save_replaces_the_old_files(tmp_path):
    saved_gpt(tmp_path, seed=0, step=7)
    cfg, params = saved_gpt(tmp_path, seed=1, step=9)
    assert files_in(tmp_path / "ck") == ["checkpoint.json", "weights-000009.npz"]
    assert np.array_equal(load_checkpoint(tmp_path / "ck")["params"]["wte"], params["wte"])
    # the same step again may not overwrite the committed file: a fresh name is used
    cfg, params = saved_gpt(tmp_path, seed=2, step=9)
    assert files_in(tmp_path / "ck") == ["checkpoint.json", "weights-000009-2.npz"]
    assert np.array_equal(load_checkpoint(tmp_path / "ck")["params"]["wte"], params["wte"])


@pytest.mark.parametrize("fail_in", ["save_arrays", "write_json"])
def test_a_failed_save_leaves_the_old_checkpoint_intact(tmp_path, monkeypatch, fail_in):
    cfg, params = saved_gpt(tmp_path, seed=0, step=7)
    before = {name: (tmp_path / "ck" / name).read_bytes() for name in files_in(tmp_path / "ck")}

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("killed while saving")
    monkeypatch.setattr(fileio, fail_in, boom)
    with pytest.raises(KeyboardInterrupt):
        saved_gpt(tmp_path, seed=1, step=8)
    after = {name: (tmp_path / "ck" / name).read_bytes() for name in files_in(tmp_path / "ck")}
    assert after == before                               # nothing new, nothing changed
    assert np.array_equal(load_model(tmp_path / "ck")["params"]["wte"], params["wte"])


def test_an_interrupted_array_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    saved_gpt(tmp_path, seed=0, step=7)
    before = files_in(tmp_path / "ck")
    real_fsync = os.fsync

    def fsync_then_die(fd):
        real_fsync(fd)
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", fsync_then_die)
    with pytest.raises(OSError):
        saved_gpt(tmp_path, seed=1, step=8)
    assert files_in(tmp_path / "ck") == before


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    """Checkpoints, summaries and array files are created as any new file is: 0o666 less
    the umask (not mkstemp's 0o600), also when they replace an older file."""
    old = os.umask(umask)
    try:
        saved_gpt(tmp_path, seed=0, step=7)
        fileio.write_summary(tmp_path / "summary.json", {"loss": 1.0})
        fileio.save_arrays(tmp_path / "a.npz", {"x": np.zeros(2)})
        stale = tmp_path / "stale.json"
        stale.write_text("{}")
        os.chmod(stale, 0o600)
        fileio.write_json(stale, {"new": True})
        written = [tmp_path / "ck" / n for n in files_in(tmp_path / "ck")]
        written += [tmp_path / "summary.json", tmp_path / "a.npz", stale]
    finally:
        os.umask(old)
    assert len(written) == 5
    for path in written:
        assert os.stat(path).st_mode & 0o777 == mode, (path, oct(os.stat(path).st_mode))
    assert json.loads(stale.read_text()) == {"new": True}
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")] == []


def test_a_training_checkpoint_records_what_the_model_saw(tmp_path):
    """``generate`` reads the task's characters and longest prompt from the checkpoint."""
    train_gpt(config=tiny_config(), settings=tiny_settings(steps=3, eval_every=3),
              out=tmp_path / "g", **TASK)
    assert load_checkpoint(tmp_path / "g")["task"] == {
        "task": "sort", "min_prompt_len": 1, "max_prompt_len": 4, "n_test": 20,
        "symbols": "0123456789"}
    from numpytfmr.run.tasks import task_symbols
    assert task_symbols("dyck") == "()[]{}" and task_symbols("rotate") == "0123456789"
    assert task_symbols("translation") is None


def test_truncated_weights_are_refused(tmp_path):
    saved_gpt(tmp_path)
    weights = tmp_path / "ck" / "weights-000007.npz"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="SHA-256"):
        load_checkpoint(tmp_path / "ck")
    # even with a digest that matches, a truncated .npz is a clear error
    meta = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
    import hashlib
    meta["files"]["weights"]["sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (tmp_path / "ck" / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_checkpoint(tmp_path / "ck")


def test_bad_json_and_missing_checkpoint_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nowhere")
    saved_gpt(tmp_path)
    path = tmp_path / "ck" / "checkpoint.json"
    text = path.read_text()
    path.write_text(text[:40])
    with pytest.raises(ValueError, match="not a readable checkpoint record"):
        load_checkpoint(tmp_path / "ck")
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a numpytfmr checkpoint"):
        load_checkpoint(tmp_path / "ck")


def edit_record(tmp_path, fn):
    path = tmp_path / "ck" / "checkpoint.json"
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


def test_config_that_does_not_match_the_weights_is_refused(tmp_path):
    saved_gpt(tmp_path)
    edit_record(tmp_path, lambda m: m["config"].update(d_model=32, n_heads=2))
    with pytest.raises(ValueError, match="do not match its config: wte has shape"):
        load_model(tmp_path / "ck")
    saved_gpt(tmp_path)
    edit_record(tmp_path, lambda m: m["config"].update(n_layers=2))
    with pytest.raises(ValueError, match=r"do not match its config \(missing"):
        load_model(tmp_path / "ck")
    saved_gpt(tmp_path)
    edit_record(tmp_path, lambda m: m["config"].update(d_modl=16))
    with pytest.raises(ValueError, match="config of .* is invalid"):
        load_model(tmp_path / "ck")
    saved_gpt(tmp_path)
    edit_record(tmp_path, lambda m: m["tokenizer"].update(symbols="0123456789"))
    with pytest.raises(ValueError, match="tokenizer .* has 14 tokens"):
        load_model(tmp_path / "ck")
    saved_gpt(tmp_path)
    with pytest.raises(ValueError, match="holds a 'gpt' model"):
        load_checkpoint(tmp_path / "ck", kind="rnn")


# ---------------------------------------------------------------------------------------
# resuming
# ---------------------------------------------------------------------------------------

def test_resume_continues_exactly(tmp_path):
    """Stopped (Ctrl-C) after 8 of 12 steps and resumed: the same weights, bit for bit,
    the same losses and the same optimizer state as a run that never stopped."""
    cfg, s = tiny_config(), tiny_settings()
    whole, summary_whole = train_gpt(config=cfg, settings=s, out=tmp_path / "a", **TASK)

    def stop_at_8(line):
        if line.startswith("step 8:"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train_gpt(config=cfg, settings=s, out=tmp_path / "b", log=stop_at_8, **TASK)
    assert load_checkpoint(tmp_path / "b")["state"]["step"] == 8
    resumed, summary_resumed = train_gpt(out=tmp_path / "b", resume=True)

    for k in whole:
        assert whole[k].tobytes() == resumed[k].tobytes(), k
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert a["state"]["loss"] == b["state"]["loss"] and len(a["state"]["loss"]) == 12
    for k in a["opt_state"]:
        assert np.array_equal(a["opt_state"][k], b["opt_state"][k]), k
    assert summary_whole["exact_match"] == summary_resumed["exact_match"]
    assert [e["step"] for e in b["state"]["evals"]] == [4, 8, 12]


def test_resume_can_extend_but_not_change_the_run(tmp_path):
    cfg = tiny_config()
    train_gpt(config=cfg, settings=tiny_settings(steps=6), out=tmp_path / "r", **TASK)
    first = load_checkpoint(tmp_path / "r")["state"]["loss"]
    _, summary = train_gpt(out=tmp_path / "r", resume=True, changes={"steps": 9})
    state = load_checkpoint(tmp_path / "r")["state"]
    assert summary["steps"] == 9 and state["loss"][:6] == first and len(state["loss"]) == 9
    with pytest.raises(ValueError, match="lr is 0.5 but the run"):
        train_gpt(out=tmp_path / "r", resume=True, changes={"lr": 0.5})
    with pytest.raises(ValueError, match="d_model is 32 but the run"):
        train_gpt(out=tmp_path / "r", resume=True, changes={"d_model": 32})
    with pytest.raises(ValueError, match="already at step 9"):
        train_gpt(out=tmp_path / "r", resume=True, changes={"steps": 5})
    with pytest.raises(ValueError, match="no checkpoint"):
        train_gpt(out=tmp_path / "none", resume=True)


# ---------------------------------------------------------------------------------------
# generation and seq2seq
# ---------------------------------------------------------------------------------------

def test_complete_with_and_without_cache_and_bad_prompts():
    cfg = tiny_config()
    params = init_gpt(cfg, rng=np.random.default_rng(0))
    tok = CharTokenizer()
    a, ids_a = complete(params, cfg, tok, "3142")
    b, ids_b = complete(params, cfg, tok, "3142", use_cache=False)
    assert a == b and np.array_equal(ids_a, ids_b)
    # the greedy answer is the argmax chain of full forward passes
    prompt = np.array([[1, *tok.encode("3142"), 3]])
    out = generate(params, prompt, config=cfg, max_new_tokens=ids_a.size, top_k=1, use_cache=False)
    eos = np.flatnonzero(ids_a == 2)
    k = int(eos[0]) + 1 if eos.size else ids_a.size          # up to and with the first <eos>
    assert np.array_equal(out[0, prompt.shape[1]:][:k], ids_a[:k])
    assert a == tok.decode(ids_a[:k][ids_a[:k] > 3])          # the text: symbols before <eos>
    with pytest.raises(ValueError, match="unknown character 'X'"):
        complete(params, cfg, tok, "31X2")
    with pytest.raises(ValueError, match="reads at most max_len=11"):
        complete(params, cfg, tok, "1234567890")


def test_evaluate_gpt_test_loss_is_the_answer_cross_entropy():
    """test_loss = mean over answer tokens of -log p(token), computed here by hand."""
    cfg = tiny_config()
    data = make_task("reverse", 10, rng=0, split="test", min_len=1, max_len=4, unique=True)
    params = init_gpt(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    res = evaluate_gpt(params, cfg, data)
    logits, _ = gpt_forward(params, data["ids"][:, :-1], config=cfg)
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    nll = []
    for i in range(10):
        for t in np.flatnonzero(data["loss_mask"][i, 1:]):
            nll.append(-logp[i, t, data["ids"][i, t + 1]])
    assert res["test_loss"] == pytest.approx(np.mean(nll), rel=1e-12)
    assert res["exact_match"] in {k / 10 for k in range(11)}


@pytest.mark.parametrize("kind", ["encdec", "rnn"])
def test_seq2seq_training_lowers_the_loss_and_translates(kind, tmp_path):
    src_tok, tgt_tok = translation_tokenizers()
    model = seq2seq_model(kind)
    small = ({"d_model": 16, "n_heads": 2, "d_ff": 32, "n_enc_layers": 1, "n_dec_layers": 1}
             if kind == "encdec" else {"d_hidden": 16, "d_emb": 8})
    cfg = replace_config(model["default_config"](src_tok.vocab_size, tgt_tok.vocab_size), **small)
    params, cfg, summary = train_seq2seq(kind=kind, config=cfg, n_test=20, out=tmp_path / kind,
                                         settings=tiny_settings(steps=30, eval_every=15, lr=2e-2))
    losses = load_checkpoint(tmp_path / kind)["state"]["loss"]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    words, source, weights = translate(params, kind, cfg, src_tok, tgt_tok, "i am a student")
    assert source == ["i", "am", "a", "student"]
    assert weights.shape == (len(words), 4)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)   # rows are distributions
    table = alignment_table(words, source, weights)
    assert table.splitlines()[0].split() == source and len(table.splitlines()) == len(words) + 1
    ck = load_model(tmp_path / kind)
    assert ck["kind"] == kind and ck["model_config"] == cfg
    assert ck["task"] == {"task": "translation", "n_test": 20, "max_source_words": 7}


def test_alignment_table_layout():
    table = alignment_table(["je", "suis", "en"], ["I", "am", "learning"],
                            np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]]))
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["I", "am", "learning"]
    assert rows[1] == ["je", "0.70", "0.20", "0.10"]
    assert rows[3] == ["en", "0.05", "0.15", "0.80"]


def test_replace_config_lets_derived_sizes_follow():
    cfg = tiny_config(d_ff=48)
    assert replace_config(cfg, n_heads=4).n_kv_heads == 4          # not the old 2: no silent GQA
    assert replace_config(cfg, n_heads=4, n_kv_heads=1).n_kv_heads == 1
    assert replace_config(cfg, d_model=32).d_ff == 128
    assert replace_config(cfg, n_layers=2).d_ff == 48


def test_step_rng_streams_differ():
    a = step_rng(0, 1).integers(0, 1 << 30, 4)
    assert np.array_equal(a, step_rng(0, 1).integers(0, 1 << 30, 4))
    assert not np.array_equal(a, step_rng(0, 2).integers(0, 1 << 30, 4))
    assert not np.array_equal(a, step_rng(1, 1).integers(0, 1 << 30, 4))


# ---------------------------------------------------------------------------------------
# A wall-clock budget: the plan and its corrections (pretrain, lora and dpo --minutes)
# ---------------------------------------------------------------------------------------

def test_a_budget_plan_fits_the_steps_and_their_evaluations():
    """0.1 s a step and 1 s an evaluation in 60 s: the curve gets EVALS_PLANNED points (a
    tenth of the budget pays for 6 evaluations, so 6), every step and evaluation fit, and
    the warmup stays at most a tenth of the steps."""
    from numpytfmr.run.loop import EVALS_PLANNED, plan_steps
    settings = TrainSettings(steps=1200, warmup_steps=20, eval_every=300)
    plan = plan_steps(settings, 0.1, 1.0, 60.0)
    evaluations = plan.steps // plan.eval_every
    assert plan.steps * 0.1 + evaluations * 1.0 <= 60.0
    assert plan.steps * 0.1 + (evaluations + 2) * 1.0 > 60.0 * 0.9      # and the most of it
    assert 1 <= evaluations <= min(EVALS_PLANNED, 6)
    assert plan.warmup_steps == 20 <= plan.steps // 10
    short = plan_steps(settings, 1.0, 0.5, 30.0)                        # a tenth of 27 steps
    assert short.warmup_steps <= short.steps // 10 and short.steps >= 2
    assert plan_steps(settings, 100.0, 1.0, 1.0).steps == 2             # never fewer than 2


def test_the_budget_replanner_follows_the_measured_speed_on_its_own_clock():
    from numpytfmr.run.loop import REPLAN_SECONDS, budget_replanner
    clock = {"t": 100.0}
    replan = budget_replanner(deadline=160.0, finish_seconds=4.0, first_step=0,
                              clock=lambda: clock["t"])
    settings = TrainSettings(steps=50, warmup_steps=5, eval_every=10)
    history = {"step": 0}
    assert replan(history, settings) is None                 # nothing measured yet
    clock["t"], history["step"] = 100.0 + REPLAN_SECONDS, 10  # 0.2 s a step
    new = replan(history, settings)
    assert new.steps == 10 + int((60.0 - REPLAN_SECONDS - 4.0) / 0.2)
    assert replan(history, new) is None                       # not again before 2 s
    clock["t"], history["step"] = 150.0, 20      # slower: 2.5 s a step; the warmup is kept
    late = replan(history, new)
    assert late.steps == 20 + int((160.0 - 150.0 - 4.0) / 2.5) and late.warmup_steps == 5


def test_the_replanner_counts_evaluations_apart_from_steps():
    """Steps of 0.5 s and an evaluation of 30 s after step 14 (every 14 steps): at step 15,
    with 10 s left, the evaluation is not spread over the steps to come, as if each cost
    37.5 / 15 = 2.5 s (4 more steps): 13 more fit, the next evaluation (after step 28)
    being beyond them."""
    from numpytfmr.run.loop import budget_replanner
    settings = TrainSettings(steps=30, warmup_steps=2, eval_every=14)
    plans = {}
    for seconds in (30.0, None):
        clock = {"t": 0.0}
        replan = budget_replanner(deadline=47.5, finish_seconds=0.0, first_step=0,
                                  clock=lambda: clock["t"], eval_seconds=seconds)
        clock["t"] = 15 * 0.5 + 30.0
        plans[seconds] = replan({"step": 15}, settings).steps
    assert plans == {30.0: 15 + 13, None: 15 + 4}
