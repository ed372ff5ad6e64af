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


def test_every_cell_is_neutralised_and_unmatchable_rows_are_left_out(tmp_path):
    rows = [
        {"student": "a", "name": "@SUM(1+1)*cmd|' /C calc'!A0", "sid": "7", "email": "a@x.edu",
         "score": 5.0, "status": "graded", "notes": ["-2+3 was the override"]},
        {"student": "b", "name": "\tTab Start", "sid": "+44", "email": "b@x.edu", "score": 6.0,
         "status": "graded", "notes": []},
        {"student": "c", "name": "\rCarriage", "sid": "9", "email": "", "score": 7.0, "status": "graded"},
        {"student": "d", "name": "Dee Plain", "sid": "", "email": "=d@x.edu", "score": 8.0,
         "status": "graded"},
    ]
    left = export("canvas", tmp_path / "c.csv", rows, assignment="=hw", max_score=10)
    got = _read(tmp_path / "c.csv")
    assert got[0][-1] == "'=hw"
    assert got[2:] == [["'\nCarriage", "", "9", "", "", "7.00"],
                       ["calc'!A0, @SUM(1+1)*cmd|' /C", "", "7", "a@x.edu", "", "5.00"]]
    assert [x.split(" (")[0] for x in left] == ["b", "d"] and "begins with =, +, -, @" in left[0]
    left = export("moodle", tmp_path / "m.csv", rows, assignment="hw", max_score=10)
    got = _read(tmp_path / "m.csv")
    # Moodle stops the whole import at a row without the user's email: c is left out too
    assert got[1:] == [["'@SUM(1+1)*cmd|' /C", "calc'!A0", "7", "a@x.edu", "5.00",
                        "'-2+3 was the override"]]
    assert [x.split(" (")[0] for x in left] == ["b", "c", "d"]


def test_a_group_gives_each_member_a_row_and_moodle_ids_are_all_or_none(tmp_path):
    members = [{"name": "Grace Hopper", "sid": "1002", "email": "grace@x.edu"},
               {"name": "Alan Turing", "sid": "", "email": "alan@x.edu"}]
    rows = [{"student": "g", "name": "Grace Hopper; Alan Turing", "sid": "1002",
             "email": "grace@x.edu; alan@x.edu", "members": members, "score": 4.0,
             "status": "graded", "notes": []},
            {"student": "h", "name": "Ada Lovelace", "sid": "1001", "email": "ada@x.edu",
             "members": [members[0] | {"name": "Ada Lovelace", "sid": "1001", "email": "ada@x.edu"}],
             "score": 3.0, "status": "graded"}]
    assert export("canvas", tmp_path / "c.csv", rows, assignment="hw", max_score=10) == []
    assert _read(tmp_path / "c.csv")[2:] == [["Lovelace, Ada", "", "1001", "ada@x.edu", "", "3.00"],
                                             ["Turing, Alan", "", "", "alan@x.edu", "", "4.00"],
                                             ["Hopper, Grace", "", "1002", "grace@x.edu", "", "4.00"]]
    export("moodle", tmp_path / "m.csv", rows, assignment="hw", max_score=10)
    # Alan has no SID: a blank ID number would give his grade to the row before, so the column
    # is left empty for every row (map the email)
    assert [r[2:4] for r in _read(tmp_path / "m.csv")[1:]] == [["", "ada@x.edu"], ["", "alan@x.edu"],
                                                              ["", "grace@x.edu"]]
    # one person in two submissions: neither row goes to the gradebook
    rows[1]["members"][0]["sid"] = rows[1]["sid"] = "1002"
    left = export("canvas", tmp_path / "c.csv", rows, assignment="hw", max_score=10)
    assert len(left) == 2 and all("1002 is in submissions g, h" in x for x in left)
