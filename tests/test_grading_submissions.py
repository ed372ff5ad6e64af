"""Submissions as students hand them in (numpytfmr/grading/notebook.py: choose_submission and
the import rule): a nested folder, several files, a .py beside a notebook, and modules the
instructor allows or not. Submissions: tests/grading_fixtures/selfcheck/ and correct.py."""
import json
import pathlib

import pytest

from numpytfmr.grading.notebook import SubmissionError, choose_submission, import_problems
from numpytfmr.grading.notebook import make_notebook
from numpytfmr.run.cli import main

FIXTURES = pathlib.Path(__file__).parent / "grading_fixtures"
SOLUTION = (FIXTURES / "selfcheck" / "correct.py").read_text()
STUB = ("import numpy as np\n\n\ndef relu_forward(x):\n    \"\"\"doc\"\"\"\n    raise NotImplementedError\n\n\n"
        "def relu_backward(dout, cache):\n    raise NotImplementedError\n")
FUNCTIONS = ["relu_forward", "relu_backward", "softmax_forward", "softmax_backward"]


def _notebook(path, code):
    path.write_text(json.dumps(make_notebook([("code", code, None)])))


def test_a_nested_folder_is_searched(tmp_path):
    (tmp_path / "sub" / "hw1").mkdir(parents=True)
    (tmp_path / "sub" / "hw1" / "homework.py").write_text(SOLUTION)
    (tmp_path / "sub" / "__MACOSX").mkdir()
    (tmp_path / "sub" / "__MACOSX" / "._homework.py").write_text("junk")
    path, note = choose_submission(tmp_path / "sub", "homework", functions=FUNCTIONS)
    assert path.endswith("hw1/homework.py")
    assert note == "graded hw1/homework.py, the only .py or .ipynb file of the submission"
    with pytest.raises(SubmissionError, match="nor in its subfolders"):
        choose_submission(tmp_path / "sub" / "__MACOSX")


def test_among_several_files_the_one_defining_the_functions_is_graded(tmp_path):
    (tmp_path / "helpers.py").write_text("def unrelated():\n    return 1\n")
    (tmp_path / "homework.py").write_text(STUB)                  # the untouched skeleton
    (tmp_path / "my_solution.py").write_text(SOLUTION)
    path, note = choose_submission(tmp_path, "homework", functions=FUNCTIONS)
    assert path.endswith("my_solution.py")
    assert note.startswith("graded my_solution.py of 3 files (it defines 4 of the assignment's "
                           "functions, homework.py 0)") and "not graded: homework.py, helpers.py" in note
    # the file the config names wins, whatever it holds
    path, note = choose_submission(tmp_path, "homework", submission="homework.py", functions=FUNCTIONS)
    assert path.endswith("homework.py") and "the file the assignment names (homework.py)" in note


def test_a_py_beside_a_notebook_follows_the_same_rule_and_says_so(tmp_path):
    _notebook(tmp_path / "homework.ipynb", SOLUTION)
    (tmp_path / "homework.py").write_text(STUB)
    path, note = choose_submission(tmp_path, "homework", functions=FUNCTIONS)
    assert path.endswith("homework.ipynb") and "not graded: homework.py" in note
    (tmp_path / "homework.py").write_text(SOLUTION)              # both the same: the .py, said
    path, note = choose_submission(tmp_path, "homework", functions=FUNCTIONS)
    assert path.endswith("homework.py")
    assert "a .py file wins over a notebook" in note and "not graded: homework.ipynb" in note
    path, note = choose_submission(tmp_path, "homework", submission="homework.ipynb",
                                   functions=FUNCTIONS)
    assert path.endswith("homework.ipynb")


def test_imports_outside_numpy_and_the_standard_library_are_named_with_the_rule(tmp_path):
    path = tmp_path / "homework.py"
    path.write_text("import math, os.path\nimport numpy as np\nfrom scipy.special import erf\n"
                    "import torch.nn\nfrom . import x\n")
    problems = import_problems(str(path))
    assert [p.split(" imports ")[1].split(",")[0] for p in problems] == ["scipy", "torch"]
    assert ("a submission may import NumPy and the standard library; the instructor can allow "
            "more (grade --allow-module NAME") in problems[0]
    problems = import_problems(str(path), allowed=["scipy"])
    assert len(problems) == 1 and "torch" in problems[0] and "allows (scipy)" in problems[0]


def test_grade_names_the_graded_file_and_the_refused_import(tmp_path, capsys):
    sub = tmp_path / "submission"
    (sub / "hw1").mkdir(parents=True)
    (sub / "hw1" / "homework.py").write_text(SOLUTION + "\nimport not_a_real_module_xyz\n")
    (sub / "notes.py").write_text("print('scratch')\n")
    results = tmp_path / "results.json"
    assert main(["grade", str(sub), "--only", "relu", "--json", str(results), "--brief"]) == 1
    out = capsys.readouterr().out
    assert "graded hw1/homework.py of 2 files" in out and "not graded: notes.py" in out
    assert "homework.py imports not_a_real_module_xyz, which this assignment does not allow" in out
    assert "graded hw1/homework.py" in json.loads(results.read_text())["output"]
    # an allowed module must be installed where the submissions import from: said at once
    assert main(["grade", str(sub), "--only", "relu", "--brief",
                 "--allow-module", "not_a_real_module_xyz"]) == 2
    assert "--allow-module: module 'not_a_real_module_xyz' is not installed" in capsys.readouterr().err
    assert main(["grade", str(sub), "--only", "relu", "--allow-module", "not-a-name"]) == 2
    assert "--allow-module 'not-a-name'" in capsys.readouterr().err


def test_make_assignment_records_the_submission_name_and_the_allowed_modules(tmp_path, capsys):
    out = tmp_path / "hw"
    assert main(["make-assignment", "relu", "-o", str(out), "--submission", "homework.ipynb",
                 "--allow-module", "scipy", "--allow-module", "pandas"]) == 0
    config = json.loads((out / "autograder" / "grading.json").read_text())
    assert config["submission"] == "homework.ipynb" and config["allow_modules"] == ["pandas", "scipy"]
    capsys.readouterr()
    assert main(["make-assignment", "relu", "-o", str(tmp_path / "b"), "--submission", "hw"]) == 2
    assert "'submission' is 'hw'" in capsys.readouterr().err
