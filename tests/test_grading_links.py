"""Symbolic links in a submission are data, never followed (grading/notebook.py's discovery and
reading, grading/classroom.py's class discovery and fingerprints, grading/course.py's file
times): a linked file or folder is refused with a message naming the link, and the file it
points to is never graded, at any depth, whoever runs the grader.

The routes: a homework.py that links to a classmate's file (a student folder, and a class of
files), a linked folder, a link deep inside a submission, and on a Gradescope-style layout a
link to /etc/shadow (and to a root-only file holding a secret)."""
import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from numpytfmr.grading import grade
from numpytfmr.grading.classroom import content_digest, find_submissions
from numpytfmr.grading.notebook import (SubmissionError, candidate_files, choose_submission,
                                        linked_entries, read_submission)
from numpytfmr.grading.sandbox import Isolation, bubblewrap_problem
from numpytfmr.run.cli import main

CORRECT = Path(__file__).parent / "grading_fixtures" / "correct.py"
SECRET = "s3cr3t-line-of-a-root-only-file"
NOT_FOLLOWED = "is a symbolic link, so it was not read"
MODES = ["none"] + ([] if bubblewrap_problem() else ["bubblewrap"])


def _class(tmp_path):
    """A class: bob's correct folder, and students whose work is a link to it at each depth."""
    subs = tmp_path / "class"
    (subs / "bob").mkdir(parents=True)
    shutil.copy(CORRECT, subs / "bob" / "homework.py")
    (subs / "alice").mkdir()                                       # a linked file in a folder
    (subs / "alice" / "homework.py").symlink_to("../bob/homework.py")
    (subs / "carol.py").symlink_to("bob/homework.py")               # a linked file in the class
    (subs / "dave").symlink_to("bob")                               # a linked folder
    (subs / "erin" / "hw").mkdir(parents=True)                      # a link two folders down
    (subs / "erin" / "hw" / "deep").symlink_to("../../bob")
    return subs


def test_discovery_lists_no_link_and_reading_refuses_one(tmp_path):
    subs = _class(tmp_path)
    assert candidate_files(subs / "alice") == [] and linked_entries(subs / "alice") == ["homework.py"]
    assert candidate_files(subs / "erin") == []
    assert linked_entries(subs / "erin") == [os.path.join("hw", "deep")]
    for path in (subs / "alice" / "homework.py", subs / "carol.py"):
        with pytest.raises(SubmissionError, match=NOT_FOLLOWED):
            read_submission(path)
        with pytest.raises(SubmissionError, match=NOT_FOLLOWED):
            choose_submission(path)
    for folder, name in ((subs / "alice", "homework.py"), (subs / "erin", "deep")):
        with pytest.raises(SubmissionError, match="never followed") as exc:
            choose_submission(folder)
        assert name in str(exc.value)
    with pytest.raises(SubmissionError, match=f"dave {NOT_FOLLOWED}"):
        choose_submission(subs / "dave")
    # a real file beside a link is graded, and the note names the link it did not follow
    shutil.copy(CORRECT, subs / "alice" / "mine.py")
    chosen, note = choose_submission(subs / "alice")
    assert chosen == str(subs / "alice" / "mine.py") and "homework.py" in note and "not followed" in note


def test_a_fingerprint_does_not_read_through_a_link(tmp_path):
    subs = _class(tmp_path)
    before = {p: content_digest(subs / p) for p in ("alice", "carol.py", "dave", "erin")}
    (subs / "bob" / "homework.py").write_text("changed = 1\n")
    assert {p: content_digest(subs / p) for p in before} == before


def test_a_pipe_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "homework.py")
    with pytest.raises(SubmissionError, match="not a regular file"):
        read_submission(tmp_path / "homework.py")


@pytest.mark.parametrize("mode", MODES)
def test_a_class_whose_students_link_to_a_classmate_gets_nothing(tmp_path, capsys, mode):
    subs = _class(tmp_path)
    grades = tmp_path / "grades.csv"
    argv = ["grade", str(subs), "--only", "relu", "--csv", str(grades), "--isolation", mode]
    assert main(argv) == 0, capsys.readouterr().err
    students = dict(find_submissions(subs))
    assert set(students) == {"alice", "bob", "carol", "dave", "erin"}
    rows = {r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
    assert float(rows["bob"]["score"]) == float(rows["bob"]["max_score"]) > 0
    for student, named in (("alice", "homework.py"), ("carol", "carol.py"), ("dave", "dave"),
                           ("erin", "deep")):
        row = rows[student]
        assert float(row["score"]) == 0 and row["status"] == "not read", row
        assert named in row["message"] and "symbolic link" in row["message"], row["message"]
        report = (tmp_path / "grades_results" / student / "report.txt").read_text()
        assert named in report and "never followed" in report


@pytest.fixture
def root_only_secret(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, 0o600)
    return secret


@pytest.mark.parametrize("target", ["secret", "/etc/shadow"])
@pytest.mark.parametrize("mode", MODES)
def test_a_gradescope_submission_linking_to_a_root_file_shows_none_of_it(
        tmp_path, capsys, root_only_secret, target, mode):
    """/autograder/submission/homework.py -> /etc/shadow: the grader (root on Gradescope) reads
    the link's target never, so no line of it reaches the student's load error."""
    target = str(root_only_secret) if target == "secret" else target
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    lines = Path(target).read_text(errors="replace").splitlines() if os.access(target, os.R_OK) \
        else [SECRET]
    submission = tmp_path / "autograder" / "submission"
    submission.mkdir(parents=True)
    (submission / "homework.py").symlink_to(target)
    out = tmp_path / "results.json"
    for what in (submission, submission / "homework.py"):
        assert main(["grade", str(what), "--only", "relu", "--json", str(out),
                     "--isolation", mode]) == 1
        printed = capsys.readouterr()
        results = json.loads(out.read_text())
        shown = printed.out + printed.err + json.dumps(results)
        assert results["score"] == 0 and "homework.py" in results["output"]
        assert "symbolic link" in shown and "never followed" in shown
        assert not any(line.strip() and line.strip() in shown for line in lines[:5])
    report = grade(submission, only=["relu"], isolation=Isolation(mode))
    assert report.score == 0 and "homework.py" in report.load_error
