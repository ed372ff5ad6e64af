"""A course's logistics around the grades of a class: who each submission is, when it came in
and how late, and the staff's overrides.

- **Identity.** Gradescope's export of an assignment holds ``submission_metadata.yml`` beside
  the submission folders: for each folder, its submitters (``:name:``, ``:sid:``, ``:email:``)
  and ``:created_at:``. :func:`read_metadata` reads the fields the grades need (a small reader
  of that file's layout, so the runtime stays NumPy-only); a folder's own
  ``submission_metadata.json`` (Gradescope's autograder layout: ``created_at`` and ``users``)
  works too. A roster CSV (:func:`read_roster`) maps file or folder names to students, for
  submissions collected some other way.
- **Late policy.** ``"late"`` in grading.json (:func:`late_policy`): the due date, a penalty in
  percent per started day or hour after it, a cap and a grace period. The submission time is
  the metadata's ``created_at``, else the file's modification time; the CSV says which.
- **Overrides.** A CSV the staff keep (:func:`read_overrides`), one row per change: the
  student, a function or ``total``, the new score and the reason. Applied after grading on
  every run, so a re-run never reverts them.
"""
from dataclasses import dataclass, field
import csv
import datetime as dt
import json
import math
import os
import re

__all__ = ["Identity", "LatePolicy", "Override", "Course", "late_policy", "lateness",
           "read_metadata", "read_roster", "read_overrides", "identities", "submission_time",
           "adjust", "build_course", "csv_edits", "OVERRIDE_COLUMNS", "ROSTER_COLUMNS"]

OVERRIDE_COLUMNS = ["student", "function", "score", "reason"]
ROSTER_COLUMNS = ["file", "name", "sid", "email"]
_UNITS = {"day": 86400.0, "hour": 3600.0}


# --- identity ------------------------------------------------------------------------------

@dataclass
class Identity:
    """Who handed a submission in (several names for a group), and when, if known."""
    name: str = ""
    sid: str = ""
    email: str = ""
    created_at: object = None          # an aware datetime, or None
    source: str = ""                   # where these came from (file name)


def _scalar(text):
    """A YAML scalar of Gradescope's metadata: quoted or plain text."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        inner = text[1:-1]
        return inner.replace("''", "'") if text[0] == "'" else inner.replace('\\"', '"')
    return "" if text in ("~", "null") else text


def parse_time(text):
    """An aware datetime from Gradescope's ``2024-02-01 12:34:56.789012000 -08:00`` or ISO 8601
    (``Z`` or an offset; a time without an offset is taken as UTC). ValueError otherwise."""
    s = str(text).strip()
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}(?::\d{2})?)(?:\.(\d+))?\s*"
                     r"(Z|UTC|[+-]\d{2}:?\d{2})?", s)
    if not m:
        raise ValueError(f"time {text!r}: expected e.g. 2026-12-01T23:59:00+00:00")
    date, clock, frac, zone = m.groups()
    clock = clock if clock.count(":") == 2 else clock + ":00"
    micro = int((frac or "0")[:6].ljust(6, "0"))
    when = dt.datetime.fromisoformat(f"{date}T{clock}").replace(microsecond=micro)
    if zone in (None, "Z", "UTC"):
        return when.replace(tzinfo=dt.timezone.utc)
    sign = 1 if zone[0] == "+" else -1
    digits = zone[1:].replace(":", "")
    offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return when.replace(tzinfo=dt.timezone(sign * offset))


def read_metadata_yml(path):
    """{submission folder name: Identity} from Gradescope's ``submission_metadata.yml``.

    Reads the layout Gradescope writes: a top-level key per submission folder; under it
    ``:submitters:`` (a list of ``:name:``, ``:sid:``, ``:email:``) and ``:created_at:``. Other
    keys are skipped. ValueError on a file that does not have this layout.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, current, people, person, in_submitters = {}, None, [], None, False

    def close():
        if current is not None:
            ident = out[current]
            ident.name = "; ".join(p.get("name", "") for p in people if p.get("name"))
            ident.sid = "; ".join(p.get("sid", "") for p in people if p.get("sid"))
            ident.email = "; ".join(p.get("email", "") for p in people if p.get("email"))

    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip() or raw.lstrip().startswith("#") or raw.strip() == "---":
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        text = raw.strip()
        if indent == 0:
            if not text.endswith(":"):
                raise ValueError(f"{path}, line {lineno}: expected a submission name and ':'")
            close()
            current = _scalar(text[:-1])
            out[current] = Identity(source=os.path.basename(path))
            people, person, in_submitters = [], None, False
            continue
        if current is None:
            raise ValueError(f"{path}, line {lineno}: indented text before any submission")
        item = text.startswith("- ")
        if item:
            text = text[2:].strip()
        if ": " in text:
            key, _, value = text.partition(": ")
        elif text.endswith(":"):
            key, value = text[:-1], ""
        else:
            continue
        key = key.strip().strip(":")
        if key == "submitters":
            in_submitters, person = True, None
            continue
        if item and in_submitters:
            person = {}
            people.append(person)
        if key == "created_at" and not item and (person is None or indent <= 2):
            in_submitters = False
            try:
                out[current].created_at = parse_time(_scalar(value))
            except ValueError as exc:
                raise ValueError(f"{path}, line {lineno}: {exc}") from None
            continue
        if in_submitters and person is not None and key in ("name", "sid", "email"):
            person[key] = _scalar(value)
        elif indent <= 2 and not item:
            in_submitters = False
    close()
    return out


def _read_json_metadata(path):
    """An Identity from Gradescope's per-submission ``submission_metadata.json``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    users = data.get("users") or data.get("submitters") or []
    ident = Identity(source=os.path.basename(path))
    ident.name = "; ".join(str(u.get("name", "")) for u in users if isinstance(u, dict) and u.get("name"))
    ident.sid = "; ".join(str(u.get("sid", "")) for u in users if isinstance(u, dict) and u.get("sid"))
    ident.email = "; ".join(str(u.get("email", "")) for u in users
                            if isinstance(u, dict) and u.get("email"))
    if data.get("created_at"):
        ident.created_at = parse_time(data["created_at"])
    return ident


def read_metadata(folder):
    """{submission folder name: Identity} from the metadata files in and under ``folder``:
    ``submission_metadata.yml`` beside the submissions, and ``submission_metadata.json`` inside
    a submission's folder. ValueError naming the file when one cannot be read."""
    out = {}
    top = os.path.join(folder, "submission_metadata.yml")
    if os.path.isfile(top):
        out.update(read_metadata_yml(top))
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            inner = os.path.join(folder, name, "submission_metadata.json")
            if name not in out and os.path.isfile(inner):
                try:
                    out[name] = _read_json_metadata(inner)
                except (OSError, ValueError, AttributeError) as exc:
                    raise ValueError(f"{inner}: {exc}") from None
    return out


def _read_csv(path, required, what):
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            head = [(h or "").strip().lower() for h in reader.fieldnames or []]
    except OSError as exc:
        raise ValueError(f"{what} {path!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path!r} is not UTF-8 text") from None
    missing = [c for c in required if c not in head]
    if missing:
        raise ValueError(f"{what} {path!r} lacks the column(s) {', '.join(missing)}; expected a "
                         f"header row with {', '.join(required)}")
    return [{(k or "").strip().lower(): (v or "").strip() for k, v in r.items()} for r in rows]


def read_roster(path):
    """{file or folder name (with or without its suffix): Identity} from a roster CSV with the
    columns ``file`` and any of ``name``, ``sid``, ``email``."""
    out = {}
    for k, row in enumerate(_read_csv(path, ["file"], "--roster"), start=2):
        key = row["file"]
        if not key:
            raise ValueError(f"--roster {path!r}, line {k}: the file column is empty")
        out[key] = Identity(name=row.get("name", ""), sid=row.get("sid", ""),
                            email=row.get("email", ""), source=os.path.basename(path))
    return out


def identities(submissions, metadata=None, roster=None):
    """{student: Identity} for ``[(student, path)]``: the roster's entry for the file or
    folder name (or its stem), else the metadata's for the folder, else an empty one."""
    metadata, roster = metadata or {}, roster or {}
    out = {}
    for student, path in submissions:
        base = os.path.basename(os.path.normpath(path))
        stem = base.rsplit(".", 1)[0] if os.path.isfile(path) else base
        ident = None
        for key in (base, stem, student):
            ident = ident or roster.get(key)
        meta = metadata.get(base) or metadata.get(stem)
        if ident is None:
            ident = Identity(**{k: getattr(meta, k) for k in ("name", "sid", "email", "created_at",
                                                               "source")}) if meta else Identity()
        elif meta is not None and ident.created_at is None:
            ident.created_at = meta.created_at
        out[student] = ident
    return out


def submission_time(path, ident):
    """(datetime, source): the metadata's ``created_at``, else the newest modification time of
    the submitted files."""
    if ident is not None and ident.created_at is not None:
        return ident.created_at, f"created_at in {ident.source or 'the metadata'}"
    newest = None
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(root, n) for root, _, names in os.walk(path) for n in names
                 if n.endswith((".py", ".ipynb"))] or [path]
    for p in paths:
        try:
            st = os.stat(p, follow_symlinks=False)      # a link's own time, never its target's
        except OSError:
            continue
        t = st.st_mtime
        newest = t if newest is None else max(newest, t)
    if newest is None:
        return None, ""
    return dt.datetime.fromtimestamp(newest, dt.timezone.utc), "file mtime"


# --- late policy -------------------------------------------------------------------------------

@dataclass
class LatePolicy:
    """``"late": {"due": ..., "penalty_percent": 10, "per": "day", "max_percent": 100,
    "grace_minutes": 0}`` in grading.json."""
    due: dt.datetime
    penalty_percent: float
    per: str = "day"
    max_percent: float = 100.0
    grace_minutes: float = 0.0


def late_policy(value):
    """The :class:`LatePolicy` of a config's ``"late"`` entry; ValueError naming the key."""
    if not isinstance(value, dict):
        raise ValueError(f"grading config: 'late' is {value!r}; expected an object with due, "
                         "penalty_percent and per")
    allowed = {"due", "penalty_percent", "per", "max_percent", "grace_minutes"}
    unknown = set(value) - allowed
    if unknown:
        raise ValueError(f"grading config: 'late' has unknown key(s) {', '.join(sorted(unknown))}; "
                         f"expected some of {', '.join(sorted(allowed))}")
    if "due" not in value:
        raise ValueError("grading config: 'late' needs 'due' (e.g. \"2026-12-01T23:59:00+00:00\")")
    try:
        due = parse_time(value["due"])
    except ValueError as exc:
        raise ValueError(f"grading config: 'late.due': {exc}") from None

    def number(key, default, top=math.inf):
        v = value.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v <= top):
            raise ValueError(f"grading config: 'late.{key}' is {v!r}; expected a number from 0 "
                             f"to {top:g}")
        return float(v)
    per = value.get("per", "day")
    if per not in _UNITS:
        raise ValueError(f"grading config: 'late.per' is {per!r}; expected \"day\" or \"hour\"")
    if "penalty_percent" not in value:
        raise ValueError("grading config: 'late' needs 'penalty_percent' (per day or hour late)")
    return LatePolicy(due=due, penalty_percent=number("penalty_percent", 0.0, 100), per=per, max_percent=number("max_percent", 100.0, 100),
                      grace_minutes=number("grace_minutes", 0.0))


def lateness(policy, submitted):
    """(seconds late, started units late, penalty percent) of a submission at ``submitted``:
    every started day (or hour) after the due date and the grace period costs
    ``penalty_percent``, up to ``max_percent``."""
    if policy is None or submitted is None:
        return 0.0, 0, 0.0
    late = (submitted - policy.due).total_seconds()
    if late <= policy.grace_minutes * 60:
        return max(late, 0.0), 0, 0.0
    units = math.ceil(late / _UNITS[policy.per])
    return late, units, min(policy.max_percent, units * policy.penalty_percent)


def describe_late(policy, seconds, units, percent):
    if policy is None:
        return ""
    if units == 0:
        return "on time"
    hours = seconds / 3600.0
    span = f"{hours / 24:.2f} days" if hours >= 24 else f"{hours:.2f} hours"
    return (f"{span} late ({units} started {policy.per}{'s' if units != 1 else ''} at "
            f"{policy.penalty_percent:g}% each, at most {policy.max_percent:g}%): -{percent:g}%")


# --- overrides -----------------------------------------------------------------------------

@dataclass
class Override:
    student: str
    function: str                   # a function's name, or "total"
    score: float
    reason: str
    line: int = 0


def read_overrides(path):
    """The overrides in a CSV with the columns student, function, score, reason (``function``
    is a graded function or ``total``). ValueError naming the line of a bad row."""
    out = []
    for k, row in enumerate(_read_csv(path, OVERRIDE_COLUMNS, "--overrides"), start=2):
        if not any(row.values()):
            continue
        try:
            score = float(row["score"])
        except ValueError:
            raise ValueError(f"--overrides {path!r}, line {k}: score {row['score']!r} is not a "
                             "number") from None
        if not math.isfinite(score) or score < 0:
            raise ValueError(f"--overrides {path!r}, line {k}: score {score:g}; expected a number "
                             ">= 0")
        if not row["student"] or not row["function"]:
            raise ValueError(f"--overrides {path!r}, line {k}: student and function must be given")
        if not row["reason"]:
            raise ValueError(f"--overrides {path!r}, line {k}: give the reason for the override")
        out.append(Override(row["student"], row["function"], score, row["reason"], k))
    return out


@dataclass
class Adjusted:
    """A row's score after the course's rules: what changed and why."""
    score: object
    functions: dict
    notes: list = field(default_factory=list)
    penalty_percent: float = 0.0
    overrides: list = field(default_factory=list)


def adjust(graded, functions, *, late=None, overrides=(), decimals=2):
    """Apply, in order: function overrides, the late penalty (``late`` = (units, percent,
    sentence) or None) to the sum, then a total override, which is final.

    graded: the grader's total (a number, or "" when there is none); functions: its
    {function: score}. Returns :class:`Adjusted`.
    """
    per = dict(functions)
    notes, applied = [], []
    for o in overrides:
        if o.function != "total":
            old = per.get(o.function, 0.0)
            per[o.function] = o.score
            notes.append(f"override: {o.function} {old:g} -> {o.score:g} ({o.reason})")
            applied.append(o)
    if graded == "" and not overrides:
        return Adjusted("", per, notes)
    changed = bool(applied)
    total = round(math.fsum(per.values()), decimals) if changed else (graded or 0.0)
    percent = 0.0
    if late is not None and late[1] > 0:
        percent = late[1]
        total = round(total * (1 - percent / 100.0), decimals)
        notes.append(f"late: {late[2]}")
    for o in overrides:
        if o.function == "total":
            notes.append(f"override: total {total:g} -> {o.score:g} ({o.reason})")
            total = o.score
            applied.append(o)
    return Adjusted(round(total, decimals), per, notes, percent, applied)


# --- a class's course: everything above, applied to the rows of the grades --------------------

@dataclass
class Course:
    """The identities, submission times, late policy and overrides of a class's submissions."""
    identities: dict = field(default_factory=dict)      # student -> Identity
    times: dict = field(default_factory=dict)           # student -> (datetime or None, source)
    late: object = None                                 # LatePolicy or None
    overrides: dict = field(default_factory=dict)       # student -> [Override]

    def columns(self):
        """The CSV columns this course fills: identity when any is known, the submission time
        when known or needed, the late policy's, and the overrides'."""
        out = []
        if any(i.name or i.sid or i.email for i in self.identities.values()):
            out += ["name", "sid", "email"]
        if self.late is not None or self.overrides:
            out.append("graded_score")
        if self.late is not None:
            out += ["late_penalty_percent", "late"]
        if self.late is not None or any(i.created_at for i in self.identities.values()):
            out += ["submitted_at", "submitted_from"]
        if self.overrides:
            out.append("overrides")
        return out

    def apply(self, row, decimals=2):
        """``row`` (a CSV row of the grader) with the course's columns and the adjusted score."""
        student = row["student"]
        ident = self.identities.get(student) or Identity()
        when, source = self.times.get(student, (None, ""))
        out = dict(row, name=ident.name, sid=ident.sid, email=ident.email,
                   graded_score=row["score"], late_penalty_percent="", late="",
                   submitted_at=when.isoformat(timespec="seconds") if when else "",
                   submitted_from=source, overrides="", notes=[])
        late = None
        if self.late is not None and when is not None:
            seconds, units, percent = lateness(self.late, when)
            sentence = describe_late(self.late, seconds, units, percent)
            late = (units, percent, sentence)
            out["late"] = sentence
            out["late_penalty_percent"] = percent
        mine = self.overrides.get(student, [])
        if row.get("status") == "grader error" and not mine:
            return out
        adjusted = adjust(row["score"], row.get("functions") or {}, late=late, overrides=mine,
                          decimals=decimals)
        out.update(score=adjusted.score, functions=adjusted.functions, notes=adjusted.notes,
                   overrides="; ".join(f"{o.function}={o.score:g} ({o.reason})"
                                       for o in adjusted.overrides))
        return out

    def feedback(self, row):
        """The lines the student's report gets about the late policy and the overrides."""
        lines = []
        if row.get("submitted_at"):
            lines.append(f"submitted at {row['submitted_at']} ({row['submitted_from']})")
        if self.late is not None:
            lines.append(f"due {self.late.due.isoformat(timespec='minutes')}: "
                         + (row["late"] or "no submission time known: no late penalty"))
        lines += [n for n in row.get("notes") or [] if not n.startswith("late: ")]
        if lines and row.get("graded_score") not in ("", None) and row["score"] != row["graded_score"]:
            lines.append(f"score: {row['graded_score']:g} graded, {row['score']:g} after these")
        return lines


def build_course(submissions, functions, *, metadata_dir=None, roster=None, late=None,
                 overrides=None):
    """The :class:`Course` of ``[(student, path)]`` graded on ``functions``.

    metadata_dir: the folder of Gradescope's metadata (:func:`read_metadata`), or None;
    roster / overrides: CSV paths or None; late: the config's ``"late"`` entry or None.
    An override naming no student of the class (by file name, SID, email or name) or no graded
    function is a ValueError naming its line: it would otherwise be lost without a word.
    """
    meta = read_metadata(metadata_dir) if metadata_dir else {}
    people = identities(submissions, meta, read_roster(roster) if roster else None)
    times = {s: submission_time(p, people.get(s)) for s, p in submissions}
    course = Course(identities=people, times=times,
                    late=late_policy(late) if late is not None else None)
    if overrides:
        keys = {}
        for student, _ in submissions:
            ident = people[student]
            for key in (student, ident.sid, ident.email, ident.name):
                for part in str(key).split("; "):
                    if part:
                        keys.setdefault(part.lower(), set()).add(student)
        for o in read_overrides(overrides):
            who = keys.get(o.student.lower(), set())
            if len(who) != 1:
                raise ValueError(f"--overrides {os.fspath(overrides)!r}, line {o.line}: student "
                                 f"{o.student!r} " + ("matches several submissions" if who else
                                                      "is not in the class (give the file name, "
                                                      "SID, email or name)"))
            if o.function != "total" and o.function not in functions:
                raise ValueError(f"--overrides {os.fspath(overrides)!r}, line {o.line}: function "
                                 f"{o.function!r} is not graded; expected one of "
                                 f"{', '.join(functions)} or total")
            course.overrides.setdefault(who.pop(), []).append(o)
    return course


def csv_edits(written, current, functions):
    """The score cells of a grades CSV changed by hand since the grader wrote it (``written``
    and ``current`` are the file's texts): [(student, column, old, new)]."""
    def table(text):
        rows = list(csv.DictReader(text.splitlines()))
        return {r.get("student"): r for r in rows}
    before, after = table(written), table(current)
    out = []
    for student, row in after.items():
        old = before.get(student)
        if old is None:
            continue
        for column in ["score"] + list(functions):
            if (row.get(column) or "") != (old.get(column) or ""):
                out.append((student, "total" if column == "score" else column,
                            old.get(column) or "", row.get(column) or ""))
    return out


def edits_as_overrides(edits):
    """Hand edits of a grades CSV as the rows of an overrides CSV (text)."""
    import io
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OVERRIDE_COLUMNS)
    for student, column, old, new in edits:
        w.writerow([student, column, new, f"edited in the grades CSV (was {old}): give the reason"])
    return buf.getvalue()
