"""The similarity report (numpytfmr/grading/similarity.py): planted copies are flagged,
independent correct solutions are not, and a submission close to the reference is.

Planted copies are made here from the fixtures the way students disguise a copy: every local
name renamed, the functions put in another order, the comments rewritten and the code
re-indented. Independent work: tests/grading_fixtures/independent/ and correct.py, written
separately from the contract.
"""
import ast
import inspect
import io
import json
import keyword
import pathlib
import random
import tokenize

from numpytfmr.grading import similarity as sim
from numpytfmr.grading.cases import resolve

FIXTURES = pathlib.Path(__file__).parent / "grading_fixtures"
INDEPENDENT = sorted((FIXTURES / "independent").glob("*.py")) + [FIXTURES / "correct.py"]


def _rename(source, seed):
    """Rename every name the file binds (functions, arguments, variables), keeping the layout."""
    tree = ast.parse(source)
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound.update(a.arg for a in node.args.posonlyargs + node.args.args)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_"):
            bound.add(node.name)
    options = {a.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
               for a in node.kwonlyargs}
    options |= {k.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords
                if k.arg}
    bound -= options                   # options and keywords keep their names: passed by name
    rng = random.Random(seed)
    words = ["tmp", "val", "buf", "acc", "res", "arr", "mat", "vec", "q", "w", "z", "tot"]
    new = {n: f"{rng.choice(words)}{i}" for i, n in enumerate(sorted(bound))
           if not keyword.iskeyword(n) and n not in ("np", "math")}
    out, prev = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string in new and not (prev and prev.string == "."):
            tok = tok._replace(string=new[tok.string])
        if tok.type == tokenize.COMMENT:
            tok = tok._replace(string="# " + " ".join(reversed(tok.string[1:].split())))
        out.append(tok)
        prev = tok
    return tokenize.untokenize(out)


def _reorder(source, seed):
    """The top-level functions in another order (the rest of the file first)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    blocks, taken = [], set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            start = node.lineno - 1 - len(node.decorator_list)
            blocks.append("\n".join(lines[start:node.end_lineno]))
            taken.update(range(start, node.end_lineno))
    rest = "\n".join(line for i, line in enumerate(lines) if i not in taken)
    random.Random(seed).shuffle(blocks)
    return rest + "\n\n\n" + "\n\n\n".join(blocks) + "\n"


def _reindent(source):
    """Four-space indentation made two, blank lines doubled: only the layout changes."""
    out = []
    for line in source.splitlines():
        stripped = line.lstrip(" ")
        out.append(" " * ((len(line) - len(stripped)) // 2) + stripped)
        if not stripped:
            out.append("")
    return "\n".join(out) + "\n"


def _plant(source, seed):
    return _reindent(_reorder(_rename(source, seed), seed))


def test_a_planted_copy_normalises_to_the_same_tokens_up_to_the_order_of_functions():
    source = (FIXTURES / "independent" / "homework.py").read_text()
    copy = _plant(source, 1)
    compile(copy, "copy.py", "exec")                       # still a working program
    assert copy != source
    assert sorted(t for t, _ in sim.normalise(copy)) == sorted(t for t, _ in sim.normalise(source))
    # names, strings, comments and layout are gone; attributes and NumPy calls stay
    tokens = [t for t, _ in sim.normalise("def f(x):  # doc\n    '''d'''\n    return np.exp(x).sum()\n")]
    assert tokens == ["def", "V", "(", "V", ")", ":", "return", "np", ".", "exp", "(", "V", ")", ".",
                      "sum", "(", ")"]


def test_winnowing_keeps_a_fingerprint_of_every_long_match():
    base = (FIXTURES / "correct.py").read_text()
    prints = sim.fingerprints(base)
    assert 0 < len(prints) < len(sim.normalise(base))
    # a piece of at least W + K - 1 tokens (here each function) shares a fingerprint with the whole
    tree = ast.parse(base)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            piece = ast.get_source_segment(base, node)
            if len(sim.normalise(piece)) >= sim.W + sim.K - 1:
                assert set(sim.fingerprints(piece)) & set(prints), node.name
    assert len(sim.fingerprints("x = 1")) == 0


def test_planted_copies_are_flagged_and_independent_solutions_are_not():
    sources = {p.stem: p.read_text() for p in INDEPENDENT}
    sources["copy_of_homework"] = _plant(sources["homework"], 3)
    sources["copy_of_correct"] = _plant(sources["correct"], 4)
    # one function copied into other work is found too (containment)
    part = ast.parse(sources["correct"])
    seg = [ast.get_source_segment(sources["correct"], n) for n in part.body
           if isinstance(n, ast.FunctionDef) and n.name.startswith("attention")]
    sources["lora_plain_plus_copied_attention"] = (sources["lora_plain"] + "\n\n"
                                                  + _rename("\n\n".join(seg), 5))
    rep = sim.report(sources)
    flagged = {frozenset((p["a"], p["b"])) for p in rep["pairs"]}
    assert frozenset(("homework", "copy_of_homework")) in flagged
    assert frozenset(("correct", "copy_of_correct")) in flagged
    independent = {p.stem for p in INDEPENDENT}
    assert not [p for p in rep["pairs"] if p["a"] in independent and p["b"] in independent], rep["pairs"]
    pair = next(p for p in rep["pairs"] if {p["a"], p["b"]} == {"correct", "copy_of_correct"})
    assert pair["jaccard"] > 0.6 and "attention_forward" in pair["functions_a"]
    assert rep["note"] == "flags are for review, never penalties"
    text = sim.report_text(rep)
    assert "copy_of_homework" in text and "never penalties" in text
    assert rep["median_jaccard"] < 0.1
    groups = [set(c["members"]) for c in rep["clusters"]]
    assert {"homework", "copy_of_homework"} in groups and {"correct", "copy_of_correct"} <= set().union(*groups)
    assert "groups of alike submissions" in text


def test_a_submission_close_to_the_reference_is_flagged():
    refs = {}
    for name in ("softmax", "layernorm", "attention"):
        item = resolve(name)
        for fn in (item.spec.forward, item.spec.backward):
            refs[fn.__name__] = inspect.getsource(fn)
    copied = _rename(inspect.getsource(resolve("layernorm").spec.forward), 7)
    sources = {p.stem: p.read_text() for p in INDEPENDENT}
    sources["from_the_reference"] = "import numpy as np\n\n" + copied
    rep = sim.report(sources, references=refs)
    assert {c["student"] for c in rep["reference"]} == {"from_the_reference"}
    assert rep["reference"][0]["reference"] == "layernorm_forward"


def test_code_every_student_was_given_is_boilerplate():
    from numpytfmr.grading.skeleton import skeleton_source
    given = (FIXTURES / "correct.py").read_text()            # say, scaffolding handed out
    own = {p.stem: p.read_text() for p in INDEPENDENT if p.stem != "correct"}
    sources = {k: given + "\n\n" + v for k, v in own.items()}
    assert sim.report(sources)["pairs"]                        # alike, without the rule
    assert not sim.report(sources, boilerplate_sources=[given])["pairs"]
    # the skeleton's signatures are boilerplate too
    skeleton = "\n\n".join(s for n in ("softmax", "attention", "mha") for s in skeleton_source(resolve(n)))
    assert set(sim.fingerprints(skeleton))


def test_the_report_is_written_as_text_or_json(tmp_path):
    rep = sim.report({"a": "x = 1", "b": "y = 2"})
    sim.write_report(tmp_path / "s.json", rep)
    assert json.loads((tmp_path / "s.json").read_text())["submissions"] == 2
    sim.write_report(tmp_path / "s.txt", rep)
    assert (tmp_path / "s.txt").read_text().startswith("similarity of 2 submissions")
