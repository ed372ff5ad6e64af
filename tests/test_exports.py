"""Gradebook exports (numpytfmr/grading/exports.py): the files Canvas and Moodle import."""
import csv

import pytest

from numpytfmr.grading.exports import CANVAS_HEAD, MOODLE_HEAD, export

ROWS = [
    {"student": "s1", "name": "Ada Lovelace", "sid": "1001", "email": "ada@example.edu", "score": 13.97,
     "status": "graded", "notes": ["override: total 12 -> 13.97 (regrade)"]},
    {"student": "s2", "name": "Alan Mathison Turing", "sid": "1002", "email": "alan@example.edu",
     "score": 9.5, "status": "graded", "notes": []},
    {"student": "s3", "name": "", "sid": "", "email": "", "score": 20.0, "status": "graded"},
    {"student": "s4", "name": "Grader Error", "sid": "4", "email": "e@x", "score": "",
     "status": "grader error"},
]


def _read(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_canvas_export_has_canvas_columns_points_possible_and_sis_ids(tmp_path):
    left = export("canvas", tmp_path / "canvas.csv", ROWS, assignment="hw1", max_score=20)
    rows = _read(tmp_path / "canvas.csv")
    assert rows[0] == CANVAS_HEAD + ["hw1"] == ["Student", "ID", "SIS User ID", "SIS Login ID",
                                                "Section", "hw1"]
    assert rows[1] == ["Points Possible", "", "", "", "", "20.00"]
    assert rows[2] == ["Lovelace, Ada", "", "1001", "ada@example.edu", "", "13.97"]
    assert rows[3] == ["Turing, Alan Mathison", "", "1002", "alan@example.edu", "", "9.50"]
    assert len(rows) == 4
    assert [x.split(" (")[0] for x in left] == ["s3", "s4"]


def test_moodle_export_has_email_id_number_grade_and_feedback(tmp_path):
    export("moodle", tmp_path / "moodle.csv", ROWS, assignment="hw1", max_score=20)
    rows = _read(tmp_path / "moodle.csv")
    assert rows[0] == MOODLE_HEAD + ["hw1", "Feedback"] == ["First name", "Last name", "ID number",
                                                            "Email address", "hw1", "Feedback"]
    assert rows[1] == ["Ada", "Lovelace", "1001", "ada@example.edu", "13.97",
                       "override: total 12 -> 13.97 (regrade)"]
    assert rows[2][:5] == ["Alan Mathison", "Turing", "1002", "alan@example.edu", "9.50"]
    assert len(rows) == 3


def test_an_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="canvas, moodle"):
        export("blackboard", tmp_path / "x.csv", ROWS, assignment="hw1", max_score=20)
