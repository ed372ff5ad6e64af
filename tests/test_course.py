"""A course's logistics (numpytfmr/grading/course.py): identities from Gradescope's metadata and
a roster, the late policy, the staff's overrides, and hand edits of the grades CSV."""
import datetime as dt
import os

import pytest

from numpytfmr.grading import course as c
from numpytfmr.grading.classroom import content_digest

UTC = dt.timezone.utc

METADATA = """submission_1001:
  :submitters:
  - :name: Ada Lovelace
    :sid: '1001'
    :email: ada@example.edu
  :created_at: 2026-11-20 10:00:00.123456000 -08:00
  :score: 12.0
  :status: processed
submission_1002:
  :submitters:
  - :name: "Grace O'Hopper"
    :sid: '1002'
    :email: grace@example.edu
  - :name: Alan Turing
    :sid: '1003'
    :email: alan@example.edu
  :created_at: 2026-11-22T13:00:00Z
submission_1004:
  :submitters:
  - :name: No Time
"""


def _class(tmp_path):
    subs = tmp_path / "subs"
    for name in ("submission_1001", "submission_1002", "submission_1004", "bob"):
        (subs / name).mkdir(parents=True)
        (subs / name / "homework.py").write_text("x = 1\n")
    (subs / "submission_metadata.yml").write_text(METADATA)
    return subs, [(n, str(subs / n)) for n in ("bob", "submission_1001", "submission_1002",
                                                "submission_1004")]


def test_gradescope_metadata_gives_names_ids_emails_and_times(tmp_path):
    subs, _ = _class(tmp_path)
    meta = c.read_metadata(subs)
    ada = meta["submission_1001"]
    assert (ada.name, ada.sid, ada.email) == ("Ada Lovelace", "1001", "ada@example.edu")
    assert ada.created_at == dt.datetime(2026, 11, 20, 18, 0, 0, 123456, tzinfo=UTC)
    group = meta["submission_1002"]
    assert group.name == "Grace O'Hopper; Alan Turing" and group.sid == "1002; 1003"
    assert group.created_at == dt.datetime(2026, 11, 22, 13, tzinfo=UTC)
    assert meta["submission_1004"].created_at is None and meta["submission_1004"].sid == ""
    # a submission's own submission_metadata.json was written by the student: never read
    entry = '{"created_at": "2026-11-21T09:30:00.5+01:00", "users": [{"name": "Bob B", "email": "b@x"}]}'
    (subs / "bob" / "submission_metadata.json").write_text(entry)
    assert "bob" not in c.read_metadata(subs)
    assert c.student_metadata(str(subs / "bob")) == ["submission_metadata.json"]
    # the same layout in a file the instructor names (grade --metadata FILE.json) is read
    named = tmp_path / "meta.json"
    named.write_text('{"bob": ' + entry + '}')
    bob = c.read_metadata_file(named)["bob"]
    assert bob.name == "Bob B" and bob.created_at == dt.datetime(2026, 11, 21, 8, 30, 0, 500000, tzinfo=UTC)
    (subs / "submission_metadata.yml").write_text("  :submitters:\n")
    with pytest.raises(ValueError, match="submission_metadata.yml, line 1"):
        c.read_metadata(subs)


def test_a_roster_maps_files_to_students_and_wins_over_metadata(tmp_path):
    subs, submissions = _class(tmp_path)
    roster = tmp_path / "roster.csv"
    roster.write_text("file,name,sid,email\nbob,Bob Builder,77,bob@example.edu\n"
                      "submission_1001,A. Lovelace,1001,ada@uni.edu\n")
    people = c.identities(submissions, c.read_metadata(subs), c.read_roster(roster))
    assert people["bob"].sid == "77" and people["bob"].name == "Bob Builder"
    assert people["submission_1001"].email == "ada@uni.edu"
    assert people["submission_1001"].created_at is not None       # the time still from metadata
    assert people["submission_1004"].name == "No Time"
    (tmp_path / "bad.csv").write_text("name,sid\nx,1\n")
    with pytest.raises(ValueError, match="lacks the column"):
        c.read_roster(tmp_path / "bad.csv")


def test_submission_time_is_created_at_and_file_times_only_when_asked(tmp_path):
    subs, submissions = _class(tmp_path)
    people = c.identities(submissions, c.read_metadata(subs))
    when, source = c.submission_time(str(subs / "submission_1001"), people["submission_1001"])
    assert source == "created_at in submission_metadata.yml" and when.year == 2026
    os.utime(subs / "bob" / "homework.py", (1_700_000_000, 1_700_000_000))
    # a file's time is the student's to set: not a submission time unless the instructor asks
    assert c.submission_time(str(subs / "bob"), people["bob"]) == (None, "no submission time")
    when, source = c.submission_time(str(subs / "bob"), people["bob"], from_mtime=True)
    assert source == "file mtime (--late-from-mtime)"
    assert when == dt.datetime.fromtimestamp(1_700_000_000, UTC)


@pytest.mark.parametrize("late, submitted, units, percent", [
    ({"due": "2026-12-01T23:59:00+00:00", "penalty_percent": 10}, "2026-12-01T23:58:00Z", 0, 0),
    ({"due": "2026-12-01T23:59:00+00:00", "penalty_percent": 10}, "2026-12-02T00:00:00Z", 1, 10),
    ({"due": "2026-12-01T23:59:00+00:00", "penalty_percent": 10}, "2026-12-03T23:59:01Z", 3, 30),
    ({"due": "2026-12-01T23:59:00+00:00", "penalty_percent": 10, "max_percent": 25},
     "2026-12-09T00:00:00Z", 8, 25),
    ({"due": "2026-12-01T23:59:00+00:00", "penalty_percent": 2, "per": "hour"},
     "2026-12-02T02:00:00Z", 3, 6),
    ({"due": "2026-12-01T23:59:00+01:00", "penalty_percent": 10, "grace_minutes": 15},
     "2026-12-01T23:10:00Z", 0, 0),
    ({"due": "2026-12-01T23:59:00+01:00", "penalty_percent": 10, "grace_minutes": 15},
     "2026-12-01T23:15:00Z", 1, 10),
])
def test_late_policy_counts_started_days_or_hours_after_the_grace(late, submitted, units, percent):
    policy = c.late_policy(late)
    _, got_units, got_percent = c.lateness(policy, c.parse_time(submitted))
    assert (got_units, got_percent) == (units, percent)


@pytest.mark.parametrize("late, message", [
    ({"penalty_percent": 10}, "needs 'due'"),
    ({"due": "tomorrow", "penalty_percent": 10}, "late.due"),
    ({"due": "2026-12-01", "penalty_percent": 10}, "late.due"),
    ({"due": "2026-12-01T10:00", "penalty_percent": 150}, "late.penalty_percent"),
    ({"due": "2026-12-01T10:00", "penalty_percent": 10, "per": "week"}, "late.per"),
    ({"due": "2026-12-01T10:00", "penalty_percent": 10, "every": 1}, "unknown key"),
    ({"due": "2026-12-01T10:00"}, "penalty_percent"),
])
def test_a_bad_late_policy_is_refused_naming_the_key(late, message):
    with pytest.raises(ValueError, match=message):
        c.late_policy(late)
    from numpytfmr.grading.cases import load_config
    with pytest.raises(ValueError, match=message):
        load_config({"late": late})


def test_overrides_apply_after_grading_function_then_late_then_total():
    fns = {"softmax_forward": 4.0, "softmax_backward": 6.0}
    ov = [c.Override("ada", "softmax_backward", 3.0, "regraded by hand")]
    a = c.adjust(10.0, fns, late=(1, 10.0, "1 day late"), overrides=ov)
    assert a.functions["softmax_backward"] == 3.0 and a.score == pytest.approx(6.3)
    assert a.notes == ["override: softmax_backward 6 -> 3 (regraded by hand)", "late: 1 day late"]
    ov.append(c.Override("ada", "total", 9.0, "extension"))
    a = c.adjust(10.0, fns, late=(1, 10.0, "1 day late"), overrides=ov)
    assert a.score == 9.0 and a.notes[-1] == "override: total 6.3 -> 9 (extension)"
    assert c.adjust(10.0, fns).score == 10.0


def test_overrides_name_students_by_file_sid_email_or_name_and_refuse_unknown_ones(tmp_path):
    subs, submissions = _class(tmp_path)
    fns = ["relu_forward", "relu_backward"]
    path = tmp_path / "ov.csv"
    path.write_text("student,function,score,reason\n1001,relu_backward,1,TA regrade\n"
                    "alan@example.edu,total,5,extension\nbob,relu_forward,0,copied\n")
    course = c.build_course(submissions, fns, metadata_dir=str(subs), overrides=str(path))
    assert {s: [o.function for o in v] for s, v in course.overrides.items()} == {
        "submission_1001": ["relu_backward"], "submission_1002": ["total"], "bob": ["relu_forward"]}
    for row, message in [("nobody,total,1,x", "line 2: student 'nobody' is not in the class"),
                         ("bob,gelu_forward,1,x", "line 2: function 'gelu_forward' is not graded"),
                         ("bob,total,lots,x", "line 2: score 'lots' is not a number"),
                         ("bob,total,-1,x", "line 2: score -1"),
                         ("bob,total,1,", "line 2: give the reason")]:
        path.write_text("student,function,score,reason\n" + row + "\n")
        with pytest.raises(ValueError, match=message):
            c.build_course(submissions, fns, metadata_dir=str(subs), overrides=str(path))


def test_course_rows_carry_identity_lateness_and_overrides(tmp_path):
    subs, submissions = _class(tmp_path)
    path = tmp_path / "ov.csv"
    path.write_text("student,function,score,reason\nGrace O'Hopper,relu_backward,6,TA regrade\n")
    course = c.build_course(submissions, ["relu_forward", "relu_backward"], metadata_dir=str(subs),
                            late={"due": "2026-11-21T00:00:00Z", "penalty_percent": 10},
                            overrides=str(path))
    row = {"student": "submission_1002", "score": 8.0, "max_score": 10.0, "status": "graded",
           "functions": {"relu_forward": 4.0, "relu_backward": 4.0}}
    out = course.apply(row)
    assert out["sid"] == "1002; 1003" and out["late_penalty_percent"] == 20
    assert out["graded_score"] == 8.0 and out["score"] == pytest.approx(8.0)   # (4 + 6) * 0.8
    assert out["submitted_from"] == "created_at in submission_metadata.yml"
    assert out["overrides"] == "relu_backward=6 (TA regrade)"
    feedback = course.feedback(out)
    assert any("due 2026-11-21T00:00+00:00: 1.54 days late" in line for line in feedback)
    assert "override: relu_backward 4 -> 6 (TA regrade)" in feedback
    assert course.columns() == ["name", "sid", "email", "graded_score", "late_penalty_percent", "late",
                                "submitted_at", "submitted_from", "overrides"]
    assert c.Course().columns() == []


def test_hand_edits_of_the_grades_csv_are_found_and_turned_into_overrides():
    written = "student,score,max_score,relu_forward\nada,10.00,10.00,4.00\nbob,5.00,10.00,2.00\n"
    current = "student,score,max_score,relu_forward\nada,10.00,10.00,4.00\nbob,7.00,10.00,4.00\n"
    edits = c.csv_edits(written, current, ["relu_forward"])
    assert edits == [("bob", "total", "5.00", "7.00"), ("bob", "relu_forward", "2.00", "4.00")]
    text = c.edits_as_overrides(edits)
    assert text.splitlines()[0] == "student,function,score,reason,fingerprint"
    assert "bob,total,7.00,edited in the grades CSV (was 5.00)" in text
    assert c.csv_edits(written, written, ["relu_forward"]) == []


def test_any_number_of_overrides_per_student_and_stale_ones_are_listed(tmp_path):
    subs, submissions = _class(tmp_path)
    fns = ["relu_forward", "relu_backward"]
    first, second = tmp_path / "ov.csv", tmp_path / "more.csv"
    first.write_text("student,function,score,reason\nbob,relu_backward,1,TA regrade\n"
                     "bob,total,5,extension\nbob,relu_forward,2,first look\n")
    second.write_text("student,function,score,reason\nbob,relu_forward,3,second look\n")
    record = tmp_path / "results" / ".override-fingerprints.json"
    digest = lambda path: content_digest(path)[:12]                       # noqa: E731
    course = c.build_course(submissions, fns, metadata_dir=str(subs), overrides=[first, second],
                            record=record, fingerprint=digest)
    assert [(o.function, o.score) for o in course.overrides["bob"]] == [
        ("relu_backward", 1.0), ("total", 5.0), ("relu_forward", 3.0)]
    assert course.warnings == [f"--overrides {str(second)!r}, line 2 replaces --overrides "
                               f"{str(first)!r}, line 4 (bob, relu_forward)"]
    row = {"student": "bob", "score": 10.0, "max_score": 10.0, "status": "graded",
           "functions": {"relu_forward": 4.0, "relu_backward": 6.0}}
    assert course.apply(row)["score"] == 5.0 and not course.stale
    # bob resubmits: every override written for the old submission is stale, none applied
    before = course.fingerprints["bob"]
    (subs / "bob" / "homework.py").write_text("x = 2\n")
    course = c.build_course(submissions, fns, metadata_dir=str(subs), overrides=[first, second],
                            record=record, fingerprint=digest)
    now = course.fingerprints["bob"]
    assert now != before and not course.overrides
    assert [(s.override.function, s.written, s.now) for s in course.stale] == [
        ("relu_backward", before, now), ("total", before, now), ("relu_forward", before, now)]
    out = course.apply(row)
    assert out["score"] == 10.0 and out["overrides"].startswith(
        f"STALE, not applied: relu_backward=1 (TA regrade): written for submission {before}, now {now}")
    assert any("stale override, not applied" in w and now in w for w in course.warnings)
    # a fingerprint column written for the new submission makes it apply again
    second.write_text(f"student,function,score,reason,fingerprint\nbob,total,4,regraded,{now}\n")
    course = c.build_course(submissions, fns, metadata_dir=str(subs), overrides=[second], record=record,
                            fingerprint=digest)
    assert course.apply(row)["score"] == 4.0 and not course.stale
    second.write_text("student,function,score,reason,fingerprint\nbob,total,4,regraded,xyz\n")
    with pytest.raises(ValueError, match="line 2: fingerprint 'xyz'"):
        c.build_course(submissions, fns, overrides=[second])


def test_a_roster_can_give_groups_and_submission_times(tmp_path):
    subs, submissions = _class(tmp_path)
    roster = tmp_path / "roster.csv"
    roster.write_text("file,name,sid,email,submitted_at\nbob,Bob B,77,b@x,2026-11-21T10:00:00Z\n"
                      "bob,Eve E,78,e@x,\n")
    course = c.build_course(submissions, ["relu_forward"], metadata_dir=str(subs), roster=roster,
                            late={"due": "2026-11-21T00:00:00Z", "penalty_percent": 10})
    assert course.times["bob"] == (dt.datetime(2026, 11, 21, 10, tzinfo=UTC), "created_at in roster.csv")
    row = course.apply({"student": "bob", "score": 10.0, "max_score": 10.0, "status": "graded",
                        "functions": {"relu_forward": 10.0}})
    assert row["score"] == 9.0
    assert [(r["name"], r["sid"]) for r in c.member_rows(row)] == [("Bob B", "77"), ("Eve E", "78")]
    # submission_1004 has metadata without a time: no late penalty, and the CSV says so
    none = course.apply({"student": "submission_1004", "score": 10.0, "max_score": 10.0,
                         "status": "graded", "functions": {"relu_forward": 10.0}})
    assert none["score"] == 10.0 and none["late"] == "no submission time"
    assert none["submitted_from"] == "no submission time"


def test_edits_of_a_neutralised_cell_round_trip_to_the_same_student(tmp_path):
    written = "student,score,max_score\n'-rf,10.00,10.00\n"
    current = "student,score,max_score\n'-rf,8.00,10.00\n"
    edits = c.csv_edits(written, current, [])
    assert edits == [("-rf", "total", "10.00", "8.00")]
    path = tmp_path / "edits.csv"
    path.write_text(c.edits_as_overrides(edits, {"-rf": "abcdef123456"}))
    assert path.read_text().splitlines()[1].startswith("'-rf,total,8.00,")
    path.write_text(path.read_text().replace("give the reason", "checked"))
    (o,) = c.read_overrides(path)
    assert (o.student, o.function, o.score, o.fingerprint) == ("-rf", "total", 8.0, "abcdef123456")
    assert c.safe_cell("=1+1") == "'=1+1" and c.safe_cell("a\rb") == "a\nb" and c.safe_cell(3.5) == 3.5
