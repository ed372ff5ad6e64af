"""Skeletons as student contracts, random ops graded against the student's own draw,
instructor control of options, and make-assignment's refusal to overwrite (issue #16).

Submissions used here (tests/grading_fixtures/independent/), written from the generated
skeleton's docstrings alone, not from the reference source:
- homework.py: softmax, layernorm, attention, dropout, lora_linear, gelu, embedding, mha;
  dropout and LoRA draw their mask as ``rng.random(shape) < 1 - p`` (the reference: ``>= p``);
- dropout_binomial.py, dropout_exponential.py, lora_other_draw.py: other valid draws
  (``rng.binomial``, an exponential draw, a draw in transposed order);
- lora_plain.py: LoRA and attention for an assignment that drops dropout, rsLoRA and bias.
"""
import ast
import builtins
import importlib.util
import inspect
import json
import os
import pathlib
import re

import numpy as np
import pytest

from numpytfmr.gradcheck import check_gradients
from numpytfmr.grading import grade, make_assignment
from numpytfmr.grading.cases import (EXTRA_CASES, all_cases, droppable_options, helpers,
                                     items_from_config, load_config, make_graded_cases, own_draw,
                                     resolve)
from numpytfmr.grading.skeleton import skeleton_source
from numpytfmr.registry import bind, registry
from numpytfmr.run.cli import main

FIXTURES = pathlib.Path(__file__).parent / "grading_fixtures" / "independent"
PACKAGE = pathlib.Path(inspect.getfile(registry)).resolve().parents[1]
ALL_NAMES = list(registry()) + list(helpers())


def _load(path):
    spec = importlib.util.spec_from_file_location(f"student_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _failures(report):
    return "\n\n".join(t.output() for t in report.tests if not t.passed)


# --- independent submissions get full marks ------------------------------------------------------

@pytest.mark.parametrize("name, items", [
    ("homework.py", {"softmax", "layernorm", "attention", "dropout", "lora_linear", "gelu",
                     "embedding", "mha"}),
    ("dropout_binomial.py", {"dropout"}),
    ("dropout_exponential.py", {"dropout"}),
    ("lora_other_draw.py", {"lora_linear"}),
])
def test_independent_submissions_score_full_marks(name, items):
    report = grade(FIXTURES / name, hidden_seed=2024)
    assert {t.item for t in report.tests} == items
    assert report.passed, _failures(report)
    assert report.score == report.max_score == pytest.approx(10.0 * len(items))


# --- random ops: the student's own draw -----------------------------------------------------------

def _student_runs(module, op, seed=0, hidden_seed=77):
    """(graded case, out, dout, grads) of the student's functions on every random case."""
    item = resolve(op)
    fwd, bwd = getattr(module, f"{op}_forward"), getattr(module, f"{op}_backward")
    for gc in make_graded_cases(item, seed=seed, hidden_seed=hidden_seed):
        out, cache = bind(fwd, gc.case.kwargs)(*gc.case.args)
        dout = np.random.default_rng(gc.index).standard_normal(np.shape(out)).astype(out.dtype)
        grads = bwd(dout, cache)
        yield item, gc, out, dout, list(grads) if isinstance(grads, tuple) else [grads]


@pytest.mark.parametrize("name, op", [("homework.py", "dropout"),
                                      ("dropout_binomial.py", "dropout"),
                                      ("dropout_exponential.py", "dropout"),
                                      ("homework.py", "lora_linear"),
                                      ("lora_other_draw.py", "lora_linear")])
def test_own_draw_reads_the_mask_of_any_valid_draw(name, op):
    module = _load(FIXTURES / name)
    random_cases = 0
    for item, gc, out, dout, grads in _student_runs(module, op):
        check = own_draw(item, gc, out, dout)
        p = gc.case.kwargs.get("p", gc.case.kwargs.get("dropout", 0))
        if p == 0 or not gc.case.kwargs.get("train", True):
            assert check is None                     # deterministic: the usual comparison
            continue
        random_cases += 1
        assert check is not None and check.ok, check.lines if check else None
        tol = 1e-9 if gc.dtype == "float64" else 1e-4
        np.testing.assert_allclose(out, check.out, rtol=tol, atol=tol)
        for got, want in zip(grads, check.grads):
            assert (got is None) == (want is None)
            if got is not None:
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert random_cases >= 2          # a visible one, and the hidden statistics case


def test_the_three_draws_differ_yet_all_pass():
    """The draws are really different: the masks of rng.random < 1 - p, the exponential draw
    and the reference's rng.random >= p disagree on the same seed."""
    item = resolve("dropout")
    gc = next(g for g in make_graded_cases(item, seed=0, float32_case=False)
              if "statistics" in g.label)
    masks = []
    for name in ("homework.py", "dropout_exponential.py"):
        fwd = _load(FIXTURES / name).dropout_forward
        out, _ = bind(fwd, gc.case.kwargs)(*gc.case.args)
        masks.append(own_draw(item, gc, out, np.ones_like(out)).mask)
    ref, _ = bind(item.spec.forward, gc.case.kwargs)(*gc.case.args)
    masks.append(own_draw(item, gc, ref, np.ones_like(ref)).mask)
    assert not np.array_equal(masks[0], masks[1])
    assert not np.array_equal(masks[0], masks[2]) and not np.array_equal(masks[1], masks[2])


def _one_case(op, label):
    item = resolve(op)
    gc = next(g for g in make_graded_cases(item, seed=0, float32_case=False) if g.label == label)
    return item, gc


def test_own_draw_fails_an_unscaled_mask_with_a_diagnosis():
    item, gc = _one_case("dropout", "x (2, 3, 7), p 0.3")
    x = gc.case.args[0]
    keep = np.random.default_rng(0).random(x.shape) < 0.7
    check = own_draw(item, gc, np.where(keep, x, 0.0), np.ones_like(x))
    assert check is not None and not check.ok and check.out is None
    text = "\n".join(check.lines)
    assert "neither 0 (dropped) nor x/(1-p)" in text
    assert "every kept entry is x * 1; inverted dropout scales the kept entries by 1/(1-p)" in text


def test_own_draw_fails_a_mask_kept_with_probability_p():
    item, gc = _one_case("dropout", "x (40, 50), p 0.3: statistics of the mask")
    x, p = gc.case.args[0], gc.case.kwargs["p"]
    keep = np.random.default_rng(3).random(x.shape) < p          # the dropped ones kept
    out = np.where(keep, x / (1 - p), 0.0)
    check = own_draw(item, gc, out, np.ones_like(x))
    assert check is not None and not check.ok and check.short == "mask statistics"
    assert check.out is not None                   # consistent with its own mask, though
    np.testing.assert_allclose(check.out, out)
    assert "must be kept with probability 1 - p = 0.7" in check.lines[0]
    assert "close to p" in check.lines[1]


def test_own_draw_fails_dropout_on_the_frozen_path_of_lora():
    item, gc = _one_case("lora_linear", "x (3, 3, 7), dropout 0.3 on the branch")
    x, W, A, B, b = gc.case.args
    kw = gc.case.kwargs
    keep = np.random.default_rng(kw["rng"]).random(x.shape) < 1 - kw["dropout"]
    xd = np.where(keep, x / (1 - kw["dropout"]), 0)
    s = kw["alpha"] / A.shape[1]
    wrong = xd @ W + b + s * (xd @ A) @ B                         # frozen path sees drop(x)
    check = own_draw(item, gc, wrong, np.ones_like(wrong))
    assert check is not None and not check.ok and check.out is None
    assert "for no dropout mask" in check.lines[0]


def test_own_draw_leaves_deterministic_cases_alone():
    for op, part in (("dropout", "train=False"), ("dropout", "p 0"),
                     ("lora_linear", "dropout 0.3, train=False"),
                     ("lora_linear", "x (2, 2, 3, 5), r 4, rsLoRA"),
                     ("softmax", "x (2, 3, 7), last axis")):
        item, gc = _one_case(op, part)
        out, _ = bind(item.spec.forward, gc.case.kwargs)(*gc.case.args)
        assert own_draw(item, gc, out, np.ones_like(out)) is None
    # an answer of the wrong shape is left to the usual comparison
    item, gc = _one_case("dropout", "x (2, 3, 7), p 0.3")
    assert own_draw(item, gc, np.zeros((2, 2)), np.ones((2, 3, 7))) is None


# --- skeletons are student contracts ------------------------------------------------------------

def _package_function_names():
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names


def _option_strings():
    """String option values (e.g. "gelu_tanh") the cases pass: words, not functions."""
    out = set()
    for spec in registry().values():
        for case in spec.make_cases(np.random.default_rng(0), np.float64):
            out |= {v for v in case.kwargs.values() if isinstance(v, str)}
    return out


_PACKAGE_NAMES = _package_function_names()
_OPTION_STRINGS = _option_strings()


@pytest.fixture(scope="module")
def full_skeleton(tmp_path_factory):
    out = tmp_path_factory.mktemp("all") / "hw"
    paths = make_assignment(ALL_NAMES, out, hidden_seed=1)
    return pathlib.Path(paths["skeleton"]).read_text(encoding="utf-8")


def test_skeleton_code_references_only_builtins_numpy_math_and_itself(full_skeleton):
    tree = ast.parse(full_skeleton)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert sorted(a.name for n in imports for a in n.names) == ["math", "numpy"]
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    defined |= {a.asname or a.name for n in imports for a in n.names}
    allowed = set(dir(builtins)) | defined
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        assert not fn.decorator_list, f"{fn.name} carries a decorator"
        local = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                assert node.id in allowed | local, f"{fn.name} references {node.id}"
    assert "@op" not in full_skeleton and "numpytfmr." not in full_skeleton
    assert {f"{n}_forward" for n in registry()} <= defined and set(helpers()) <= defined


@pytest.mark.parametrize("name", ALL_NAMES)
def test_skeleton_docstrings_name_no_function_the_student_lacks(name):
    """Each item alone: its docstrings name no function of the package it does not define."""
    tree = ast.parse("\n\n".join(skeleton_source(resolve(name))))
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    defined = {f.name for f in functions}
    params = {a.arg for f in functions for a in f.args.args + f.args.kwonlyargs}
    words = _OPTION_STRINGS | defined | params | {name}
    for fn in functions:
        doc = ast.get_docstring(fn) or ""
        assert ":func:" not in doc and "``" not in doc, fn.name
        for word in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", doc)):
            if word in words:
                continue
            # a function of the package (public or private) that the skeleton does not define
            named = word in _PACKAGE_NAMES and ("_" in word.strip("_") or word.startswith("_"))
            assert not named, f"{fn.name} names {word}"
        for helper in ("rope_frequencies", "yarn_attention_scale", "dpo_metrics", "normal_cdf",
                       "_ROPE_KEYS", "causal_mask", "padding_mask", "sliding_window_mask"):
            assert helper not in doc or helper in defined, f"{fn.name} names {helper}"


def _doc(skeleton, name):
    tree = ast.parse(skeleton)
    return next(ast.get_docstring(f) for f in tree.body
                if isinstance(f, ast.FunctionDef) and f.name == name)


def test_docstrings_separate_required_from_suggested(full_skeleton):
    for op in registry():
        fwd = _doc(full_skeleton, f"{op}_forward")
        bwd = _doc(full_skeleton, f"{op}_backward")
        assert "Required (graded):" in fwd and "returns (out, cache):" in fwd, op
        assert "Required (graded):" in bwd and "returns" in bwd.split("Required (graded):")[1], op
        required = fwd.split("Required (graded):")[1].split("Suggested (not graded):")[0]
        assert "cache: anything you like" in required, op        # the cache is never graded
        assert "cache keys" not in fwd, op
        if "Suggested (not graded):" in fwd:
            assert fwd.index("Suggested") > fwd.index("Required"), op
        for p in inspect.signature(registry()[op].forward).parameters:
            assert re.search(rf"^\s+{p}: ", required, re.M), f"{op}: {p} not described"
    mha = _doc(full_skeleton, "mha_forward")
    assert mha.count("\n") < 90 and "T_past" in mha and "positions_q" in mha
    assert "scaling" not in mha                   # rope["scaling"] is not part of the contract


def test_docstrings_say_what_the_student_may_use(full_skeleton):
    for op in ("gelu", "ffn", "swiglu_ffn"):
        assert "math.erfc" in _doc(full_skeleton, f"{op}_forward")
        assert "element-wise" in _doc(full_skeleton, f"{op}_forward")
    assert "np.add.at" in _doc(full_skeleton, "embedding_forward")
    header = ast.get_docstring(ast.parse(full_skeleton))
    assert "NumPy (np) and the math module" in header
    for op in ("dropout", "lora_linear"):
        assert "rng.random(x.shape) < 1 - p" in _doc(full_skeleton, f"{op}_forward")
        assert "YOUR mask" in _doc(full_skeleton, f"{op}_forward")


def _graded_cases(op):
    item = resolve(op)
    return [gc.case for gc in make_graded_cases(item, seed=0, hidden_seed=None, float32_case=False)]


@pytest.mark.parametrize("op", list(registry()))
def test_every_option_a_skeleton_shows_is_graded(op):
    """Each option of the skeleton is passed by some case with a non-default value, and each
    optional input both given and None."""
    item = resolve(op)
    cases = _graded_cases(op)
    params = inspect.signature(item.spec.forward).parameters
    positional = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    for name, p in params.items():
        if p.kind == p.KEYWORD_ONLY and p.default is not p.empty:
            values = [c.kwargs[name] for c in cases if name in c.kwargs]
            assert any(isinstance(v, np.ndarray) or v is not p.default and v != p.default
                       for v in values), f"{op}: no case sets {name}"
        elif p.kind == p.POSITIONAL_OR_KEYWORD and p.default is None:
            i = positional.index(name)
            given = [len(c.args) > i and c.args[i] is not None for c in cases]
            assert any(given) and not all(given), f"{op}: {name} is always or never given"


def test_mha_cases_cover_the_kv_cache_step_and_every_rope_key():
    cases = _graded_cases("mha")
    assert any(c.kwargs.get("kv_cache") is not None and c.args[0].shape[-2] == 1 for c in cases)
    ropes = [c.kwargs["rope"] for c in cases if isinstance(c.kwargs.get("rope"), dict)]
    keys = {k for r in ropes for k in r}
    assert {"layout", "base", "freqs", "positions_q", "positions_k"} <= keys
    assert any(np.ndim(r.get("positions_q", ())) == 2 for r in ropes)    # per-sequence positions
    assert any(c.kwargs.get("scale") is not None for c in cases)


@pytest.mark.parametrize("op", list(EXTRA_CASES))
def test_grading_only_cases_pass_the_reference_gradient_check(op):
    spec = registry()[op]
    names = list(inspect.signature(spec.forward).parameters)
    start = len(spec.make_cases(np.random.default_rng(0), np.float64))
    cases = all_cases(resolve(op), np.random.default_rng(0), np.float64)[start:]
    assert cases
    for k, case in enumerate(cases):
        if not case.check:
            continue
        res = check_gradients(bind(spec.forward, case.kwargs), spec.backward, case.args, seed=k,
                              mode=spec.mode, names=names[:len(case.args)])
        assert res.passed, f"{case.label}\n{res}"


# --- instructor control of options -------------------------------------------------------------

def test_dropped_options_vanish_from_skeleton_docstring_and_cases(tmp_path):
    drop = {"lora_linear": ["dropout", "rank_stabilized"], "attention": ["bias"]}
    paths = make_assignment(["lora_linear", "attention"], tmp_path / "hw", hidden_seed=3, drop=drop)
    source = pathlib.Path(paths["skeleton"]).read_text()
    tree = ast.parse(source)
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    lora = funcs["lora_linear_forward"]
    assert [a.arg for a in lora.args.args] == ["x", "W", "A", "B", "b"]
    assert [a.arg for a in lora.args.kwonlyargs] == ["alpha"]          # rng and train went too
    assert [a.arg for a in funcs["attention_forward"].args.kwonlyargs] == ["mask", "scale"]
    lora_doc = ast.get_docstring(lora) + ast.get_docstring(funcs["lora_linear_backward"])
    for gone in ("dropout", "drop(x)", "rank_stabilized", "rsLoRA", "rng", "train", "mask"):
        assert gone not in lora_doc, gone
    assert "y = x W + b + s (x A) B" in lora_doc and "dA = x^T du" in lora_doc
    assert "bias" not in ast.get_docstring(funcs["attention_forward"])
    config = json.loads(pathlib.Path(paths["config"]).read_text())
    recorded = {f["name"]: f.get("drop") for f in config["functions"]}
    assert recorded == {"lora_linear": ["dropout", "rng", "train", "rank_stabilized"],
                        "attention": ["bias"]}
    # the grader reads the choice through the config: no case uses a dropped option
    items = {i.name: i for i in items_from_config(load_config(paths["config"]))}
    lora_cases = make_graded_cases(items["lora_linear"], seed=0, hidden_seed=3)
    gone = {"dropout", "rank_stabilized", "rng", "train"}
    assert lora_cases and not any(gone & set(g.case.kwargs) for g in lora_cases)
    full = make_graded_cases(resolve("lora_linear"), seed=0, hidden_seed=3)
    assert len(lora_cases) < len(full)
    att = make_graded_cases(items["attention"], seed=0)
    assert att and not any("bias" in g.case.kwargs for g in att)
    # a submission without the dropped options gets full marks with that config
    report = grade(FIXTURES / "lora_plain.py", config=paths["config"])
    assert {t.item for t in report.tests} == {"lora_linear", "attention"}
    assert report.passed, _failures(report)
    # and without the config it fails the cases that use them
    assert not grade(FIXTURES / "lora_plain.py", only=["lora_linear"]).passed


def test_dropping_trailing_inputs_and_refusing_what_cannot_be_dropped():
    item = resolve("mha", drop=["bq", "bk", "bv", "bo"])
    cases = make_graded_cases(item, seed=0, float32_case=False)
    assert cases and all(len(g.case.args) == 6 for g in cases)
    assert set(droppable_options(resolve("lora_linear"))) == {
        "b", "rank_stabilized", "dropout", "rng", "train"}
    assert "dtype" not in droppable_options(resolve("sinusoidal_encoding"))   # never shown
    with pytest.raises(ValueError, match="only trailing inputs can be left out"):
        resolve("mha", drop=["bk"])
    with pytest.raises(ValueError,
                       match="cannot drop 'p'; the options that can be dropped are: train"):
        resolve("dropout", drop=["p"])
    with pytest.raises(ValueError, match="cannot drop 'nope'"):
        resolve("attention", drop=["nope"])
    with pytest.raises(ValueError, match="'drop' of 'attention'"):
        load_config({"functions": [{"name": "attention", "drop": "bias"}]})
    with pytest.raises(ValueError, match="uses an option the assignment drops"):
        make_graded_cases(resolve("attention", cases=[4], drop=["bias"]), seed=0)


def test_drop_flag_of_the_command_line(tmp_path, capsys):
    out = tmp_path / "a"
    assert main(["make-assignment", "lora_linear", "attention", "-o", str(out), "--drop",
                 "lora_linear:dropout,rank_stabilized", "--drop", "attention:bias"]) == 0
    config = json.loads((out / "autograder" / "grading.json").read_text())
    assert [f.get("drop") for f in config["functions"]] == [
        ["dropout", "rng", "train", "rank_stabilized"], ["bias"]]
    capsys.readouterr()
    for bad, message in ((["--drop", "attention"], "expected OP:OPTION"),
                         (["--drop", "attention:colour"], "cannot drop 'colour'"),
                         (["--drop", "softmax:axis"], "not in the assignment")):
        assert main(["make-assignment", "attention", "-o", str(tmp_path / "b")] + bad) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


# --- make-assignment never loses work -----------------------------------------------------------

def test_make_assignment_refuses_a_non_empty_folder(tmp_path, capsys):
    out = tmp_path / "hw"
    assert main(["make-assignment", "softmax", "-o", str(out)]) == 0
    skeleton = out / "student" / "homework.py"
    skeleton.write_text("# the instructor's edits\n")
    seed = json.loads((out / "autograder" / "grading.json").read_text())["hidden_seed"]
    capsys.readouterr()
    assert main(["make-assignment", "softmax", "layernorm", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(out) in err and "--force" in err
    assert "Traceback" not in err
    assert skeleton.read_text() == "# the instructor's edits\n"          # nothing touched
    # an empty folder is fine without --force
    (tmp_path / "empty").mkdir()
    assert main(["make-assignment", "softmax", "-o", str(tmp_path / "empty")]) == 0
    # --force rewrites, keeping the hidden seed; --new-seed draws another
    assert main(["make-assignment", "softmax", "layernorm", "-o", str(out), "--force"]) == 0
    config = json.loads((out / "autograder" / "grading.json").read_text())
    assert config["hidden_seed"] == seed and len(config["functions"]) == 2
    assert "def layernorm_forward" in skeleton.read_text()
    assert main(["make-assignment", "softmax", "-o", str(out), "--force", "--new-seed"]) == 0
    assert json.loads((out / "autograder" / "grading.json").read_text())["hidden_seed"] != seed
    assert main(["make-assignment", "softmax", "-o", str(out), "--force",
                 "--hidden-seed", "5"]) == 0
    assert json.loads((out / "autograder" / "grading.json").read_text())["hidden_seed"] == 5


@pytest.mark.parametrize("umask, data, script", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                 (0o002, 0o664, 0o775)])
def test_make_assignment_files_get_the_modes_the_umask_gives(tmp_path, umask, data, script):
    old = os.umask(umask)
    try:
        paths = make_assignment(["relu"], tmp_path / "hw", hidden_seed=1)
    finally:
        os.umask(old)
    for key in ("skeleton", "notebook", "config"):
        assert os.stat(paths[key]).st_mode & 0o777 == data, key
    for key in ("setup", "run"):
        assert os.stat(paths[key]).st_mode & 0o777 == script, key


# --- the Gradescope bundle and its tests (issue #25, item 7) ------------------------------------

def test_make_assignment_writes_the_gradescope_zip_with_its_files_at_the_root(tmp_path):
    import stat
    import zipfile

    paths = make_assignment(["relu", "softmax"], tmp_path / "hw", hidden_seed=3,
                            weights={"softmax": 7}, late={"due": "2026-12-01T23:59:00+00:00",
                                                          "penalty_percent": 10})
    with zipfile.ZipFile(paths["zip"]) as z:
        names = z.namelist()
        assert {"setup.sh", "run_autograder", "grading.json"} <= set(names)
        assert "numpytfmr/grading/grader.py" in names and "numpytfmr/__init__.py" in names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        assert not [n for n in names if n.startswith(("student/", "autograder/"))]
        for script in ("setup.sh", "run_autograder"):
            assert (z.getinfo(script).external_attr >> 16) & stat.S_IXUSR
            assert z.read(script) == (tmp_path / "hw" / "autograder" / script).read_bytes()
        config = json.loads(z.read("grading.json"))
    assert config["hidden_seed"] == 3 and config["late"]["penalty_percent"] == 10
    assert sum(f["weight"] for f in config["functions"]) == 17          # Gradescope's total
    # written atomically: no temporary file left beside it
    assert sorted(os.listdir(tmp_path / "hw")) == ["autograder", "autograder.zip", "student"]


def test_students_see_one_gradescope_test_per_function_with_its_cases(tmp_path):
    path = tmp_path / "homework.py"
    path.write_text("\n\n".join((FIXTURES.parent / "selfcheck" / name).read_text()
                                for name in ("correct.py", "softmax_tuple.py")))
    report = grade(path, only=["softmax", "relu"], hidden_seed=5)
    results = report.gradescope()
    names = [t["name"] for t in results["tests"]]
    # by default the last third of each function's cases is hidden: one of softmax's and relu's
    assert names == ["softmax_forward", "softmax_backward", "softmax_forward [hidden: 1 case]",
                     "softmax_backward [hidden: 1 case]", "relu_forward", "relu_backward",
                     "relu_forward [hidden: 1 case]", "relu_backward [hidden: 1 case]"]
    tests = {t["name"]: t for t in results["tests"]}
    back = tests["softmax_backward"]         # (dx,): a contract slip, 10% of each case's points
    assert back["status"] == "passed" and back["score"] == pytest.approx(0.9 * back["max_score"], abs=0.03)
    assert back["output"].startswith("softmax_backward: 4 of 4 cases passed")
    assert "PASS  x (2, 3, 7), last axis" in back["output"]
    assert tests["relu_forward"]["status"] == "passed"
    assert {t["visibility"] for t in results["tests"] if "hidden" in t["name"]} == {"after_due_date"}
    assert sum(t["max_score"] for t in results["tests"]) == pytest.approx(results["max_score"])
    assert sum(t["score"] for t in results["tests"]) == pytest.approx(results["score"])
    per_case = report.gradescope(per_case=True)["tests"]
    assert len(per_case) == len(report.tests) and per_case[0]["name"] == report.tests[0].name


def test_a_load_failure_is_one_gradescope_test_and_said_once(tmp_path):
    path = tmp_path / "homework.py"
    path.write_text("import numpy as np\n\ndef relu_forward(x)\n    return x\n")
    report = grade(path, only=["softmax", "relu", "layernorm"], hidden_seed=5)
    results = report.gradescope()
    assert len(results["tests"]) == 1 and results["tests"][0]["name"] == "submission"
    assert results["tests"][0]["max_score"] == results["max_score"] == 30
    assert "SyntaxError" in results["tests"][0]["output"]
    table = report.table()
    assert table.count("SyntaxError") == 1 and "layernorm_backward: 0.00/6.00" in table


def test_make_assignment_options_for_the_course(tmp_path, capsys):
    out = tmp_path / "hw"
    assert main(["make-assignment", "relu", "-o", str(out), "--due", "2026-12-01T23:59:00+01:00",
                 "--late-penalty", "5/hour", "--late-max", "50", "--grace-minutes", "10",
                 "--gradescope-tests", "case"]) == 0
    printed = capsys.readouterr().out
    assert "autograder.zip" in printed and "python check.py homework.py" in printed
    config = json.loads((out / "autograder" / "grading.json").read_text())
    assert config["late"] == {"due": "2026-12-01T23:59:00+01:00", "penalty_percent": 5.0,
                              "per": "hour", "max_percent": 50.0, "grace_minutes": 10.0}
    assert config["gradescope_tests"] == "case"
    for bad, message in ((["--late-penalty", "5/hour"], "--late-penalty needs --due"),
                         (["--due", "2026-12-01T10:00", "--late-penalty", "5/week"], "PERCENT/day"),
                         (["--due", "soon"], "late.due")):
        assert main(["make-assignment", "relu", "-o", str(tmp_path / "x")] + bad) == 2
        assert message in capsys.readouterr().err


# --- Gradescope installs (issue #32, item 10) ------------------------------------------------------

def _fake_image(tmp_path, python_version):
    """A PATH on which apt-get does nothing and python3 reports ``python_version`` and logs
    what it is asked to do (setup.sh as Gradescope's build would run it, without root)."""
    bin_dir = tmp_path / f"bin{python_version}"
    bin_dir.mkdir()
    log = tmp_path / f"log{python_version}"
    (bin_dir / "apt-get").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "python3").write_text(f'''#!/bin/sh
echo "python3 $*" >> {log}
case "$*" in
    *version_info*) echo {python_version} ;;
esac
exit 0
''')
    for name in ("apt-get", "python3"):
        os.chmod(bin_dir / name, 0o755)
    return bin_dir, log


def test_setup_sh_pins_the_numpy_of_the_documented_image_and_installs_every_allowed_module(tmp_path):
    import importlib.metadata
    import subprocess

    from numpytfmr.grading.skeleton import gradescope_image

    image = gradescope_image()
    python, numpy = image["image"]["python"], image["numpy"]
    assert python in image["numpy_pythons"]
    # the docs name the same image, its Python and the NumPy pinned for it
    docs = (pathlib.Path(__file__).parent.parent / "docs" / "instructor.md").read_text()
    gradescope = docs.split("## Gradescope", 1)[1].split("\n## ", 1)[0]
    im = image["image"]
    assert f"Base Image OS {im['name']}, Version {im['version']}, Variant {im['variant']}" in gradescope
    assert f"Python {python}" in gradescope and f"NumPy {numpy}" in gradescope
    # setup.sh: that NumPy, and the distribution of every allowed module (_pytest is pytest's)
    paths = make_assignment(["relu"], tmp_path / "hw", hidden_seed=1, allow_modules=["_pytest"])
    script = pathlib.Path(paths["setup"]).read_text()
    assert f'"numpy=={numpy}"' not in script and f"numpy=={numpy}" in script
    assert "numpy==" + np.__version__ not in script or np.__version__ == numpy
    expected = sorted(importlib.metadata.packages_distributions()["_pytest"])[0]
    bin_dir, log = _fake_image(tmp_path, python)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", paths["setup"]], capture_output=True, text=True, env=env,
                          timeout=60)
    calls = log.read_text().splitlines()
    install = [c for c in calls if " -m pip install" in c]
    assert install and install[0].split("install ", 1)[1].split() == [
        "--quiet", "--only-binary=numpy", f"numpy=={numpy}", expected]
    assert any(c.endswith(" numpy _pytest") and "import_module" in c for c in calls)
    if not os.path.isdir("/autograder/source"):      # the last step needs Gradescope's folders
        assert proc.returncode != 0 and "/autograder/source" in proc.stderr
    # another Python: the build stops before installing anything, and says which image to use
    bin_dir, log = _fake_image(tmp_path, "3.9")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", paths["setup"]], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "this image has Python 3.9" in proc.stderr
    assert f"base image {im['name']} {im['version']}" in proc.stderr
    assert not [c for c in log.read_text().splitlines() if "pip install" in c]


@pytest.mark.slow
def test_pypi_has_the_pinned_numpy_for_the_documented_python(tmp_path):
    import subprocess
    import sys

    from numpytfmr.grading.skeleton import gradescope_image

    image = gradescope_image()
    found = {}
    for python in [image["image"]["python"]]:
        proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "numpy",
                               "--python-version", python, "--implementation", "cp",
                               "--platform", "manylinux2014_x86_64", "--only-binary=:all:",
                               "--disable-pip-version-check"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0 or "Available versions" not in proc.stdout:
            pytest.skip(f"PyPI cannot be asked here: {proc.stderr.strip()[-200:]}")
        found[python] = proc.stdout.split("Available versions:", 1)[1].split("\n")[0]
    assert all(image["numpy"] in [v.strip() for v in listed.split(",")] for listed in found.values()), found
