"""A course's logistics around the grades of a class: who each submission is, when it came in
and how late, and the staff's overrides.

Everything a submission holds is the student's, so none of it is trusted: identity and time
come from the instructor alone.

- **Identity.** Gradescope's export of an assignment holds ``submission_metadata.yml`` beside
  the submission folders: for each folder, its submitters (``:name:``, ``:sid:``, ``:email:``)
  and ``:created_at:``. :func:`read_metadata` reads the fields the grades need (a small reader
  of that file's layout, so the runtime stays NumPy-only) from the export's root only; a
  metadata file *inside* a submission's folder was written by the student and is ignored
  (:func:`student_metadata` finds them, and the feedback says so). A metadata file named on the
  command line (:func:`read_metadata_file`, ``--metadata``) or a roster CSV
  (:func:`read_roster`, ``--roster``) serves submissions collected some other way. A group (several
  submitters) keeps every member (:attr:`Identity.members`): each gets a row of the CSV and
  of the exports (:func:`member_rows`).
- **Late policy.** ``"late"`` in grading.json (:func:`late_policy`): the due date, a penalty in
  percent per started day or hour after it, a cap and a grace period. The submission time is
  the instructor's metadata's (``created_at``, or a roster's ``submitted_at``). Without one the
  policy is not applied and the CSV says "no submission time"; the files' modification times
  are used only when asked (``late_from_mtime``).
- **Overrides.** CSVs the staff keep (:func:`read_overrides`), any number of rows per student:
  the student, a function or ``total``, the new score, the reason, and optionally the
  fingerprint of the submission it was written for. Applied after grading on every run, so a
  re-run never reverts them; an override whose submission has changed since is *stale*: not
  applied, and listed with the old and new fingerprints. The fingerprint of an override that
  does not carry one is recorded the first time it is applied.
- **Cells.** :func:`safe_cell` neutralises text a spreadsheet would run as a formula (OWASP's
  CSV-injection rule): every cell of the grades CSV and of the exports goes through it.
"""
from dataclasses import dataclass, field
import csv
import datetime as dt
import hashlib
import json
import math
import os
import re

__all__ = ["Identity", "LatePolicy", "Override", "Course", "late_policy", "lateness",
           "read_metadata", "read_metadata_file", "read_roster", "read_overrides", "identities",
           "submission_time", "student_metadata", "member_rows", "safe_cell", "adjust",
           "build_course", "csv_edits", "OVERRIDE_COLUMNS", "ROSTER_COLUMNS", "NO_TIME"]

OVERRIDE_COLUMNS = ["student", "function", "score", "reason"]      # then, optionally, fingerprint
ROSTER_COLUMNS = ["file", "name", "sid", "email", "submitted_at"]
NO_TIME = "no submission time"
METADATA_NAMES = ("submission_metadata.yml", "submission_metadata.yaml", "submission_metadata.json")
_UNITS = {"day": 86400.0, "hour": 3600.0}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_TODO_REASON = ": give the reason"


def safe_cell(value):
    """A CSV cell a spreadsheet shows as text: a string starting with ``=``, ``+``, ``-``, ``@``,
    a tab or a carriage return gets a leading single quote (OWASP's rule against CSV
    injection), and carriage returns inside it become line feeds (which the csv module quotes).
    Numbers are left alone."""
    if not isinstance(value, str):
        return value
    if value.startswith(_FORMULA_START):
        value = "'" + value
    # a lone carriage return is not quoted by the csv module, and ends the row for readers
    return value.replace("\r\n", "\n").replace("\r", "\n")


def _unquote(text):
    """The text of a cell :func:`safe_cell` neutralised (as read back from our own CSV)."""
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA_START) else text


# --- identity ------------------------------------------------------------------------------

@dataclass
class Identity:
    """Who handed a submission in, and when, if known. ``members``: each submitter's
    ``{"name", "sid", "email"}`` (several for a group); ``name``/``sid``/``email`` join them
    with "; "."""
    name: str = ""
    sid: str = ""
    email: str = ""
    created_at: object = None          # an aware datetime, or None
    source: str = ""                   # where these came from (file name)
    members: list = field(default_factory=list)


def _identity(people, source, created_at=None):
    """An :class:`Identity` of the submitters ``people`` (dicts with name, sid, email)."""
    members = [{k: str(p.get(k) or "").strip() for k in ("name", "sid", "email")} for p in people]
    members = [m for m in members if any(m.values())]
    return Identity(name="; ".join(m["name"] for m in members if m["name"]),
                    sid="; ".join(m["sid"] for m in members if m["sid"]),
                    email="; ".join(m["email"] for m in members if m["email"]),
                    created_at=created_at, source=source, members=members)


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
            out[current] = _identity(people, out[current].source, out[current].created_at)

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


def _json_identity(data, source):
    """An Identity from one entry of Gradescope's autograder layout: ``created_at`` and
    ``users`` (or ``submitters``), each with name, sid, email."""
    if not isinstance(data, dict):
        raise ValueError("expected an object with created_at and users")
    users = data.get("users") or data.get("submitters") or []
    people = [u for u in users if isinstance(u, dict)] if isinstance(users, list) else []
    when = parse_time(data["created_at"]) if data.get("created_at") else None
    return _identity(people, source, when)


def read_metadata_file(path):
    """{submission folder name: Identity} from a metadata file the instructor names (``grade
    --metadata FILE``): Gradescope's ``submission_metadata.yml`` layout, or JSON mapping each
    folder name to ``{"created_at": ..., "users": [{"name", "sid", "email"}]}``. ValueError
    naming the file when it cannot be read."""
    path = os.fspath(path)
    try:
        if not path.endswith(".json"):
            return read_metadata_yml(path)
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("expected an object mapping each submission folder to its metadata")
        return {str(k): _json_identity(v, os.path.basename(path)) for k, v in data.items()}
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except ValueError as exc:
        raise ValueError(str(exc) if str(exc).startswith(path) else f"{path}: {exc}") from None


def read_metadata(folder):
    """{submission folder name: Identity} from Gradescope's ``submission_metadata.yml`` at the
    root of an export (``folder``), or {} without one. Metadata files inside the submissions'
    own folders are never read: :func:`student_metadata` lists them."""
    top = os.path.join(os.fspath(folder), "submission_metadata.yml")
    return read_metadata_yml(top) if os.path.isfile(top) and not os.path.islink(top) else {}


def student_metadata(path):
    """The names of the metadata files a student put at the top of their submission folder
    (``submission_metadata.json``, ``.yml``...): ignored, and said so. Links are not followed."""
    if os.path.islink(path) or not os.path.isdir(path):
        return []
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [n for n in names if n.lower() in METADATA_NAMES]


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
    columns ``file`` and any of ``name``, ``sid``, ``email``, ``submitted_at`` (an ISO 8601
    time: the submission time). Several rows with one file are a group's members."""
    rows = {}
    for k, row in enumerate(_read_csv(path, ["file"], "--roster"), start=2):
        key = row["file"]
        if not key:
            raise ValueError(f"--roster {path!r}, line {k}: the file column is empty")
        when = row.get("submitted_at") or row.get("created_at") or ""
        try:
            when = parse_time(when) if when else None
        except ValueError as exc:
            raise ValueError(f"--roster {path!r}, line {k}: submitted_at: {exc}") from None
        people, first = rows.setdefault(key, ([], [None]))
        people.append(row)
        if when is not None:
            if first[0] not in (None, when):
                raise ValueError(f"--roster {path!r}, line {k}: {key!r} has two submission times")
            first[0] = when
    return {key: _identity(people, os.path.basename(path), first[0])
            for key, (people, first) in rows.items()}


def identities(submissions, metadata=None, roster=None):
    """{student: Identity} for ``[(student, path)]``: the roster's entry for the file or
    folder name (or its stem), else the metadata's for the folder, else an empty one. A
    roster entry without a time takes the metadata's."""
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
                                                               "source", "members")}) \
                if meta else Identity()
        elif meta is not None and ident.created_at is None:
            ident = Identity(**{**ident.__dict__, "created_at": meta.created_at,
                                "source": meta.source})
        out[student] = ident
    return out


def submission_time(path, ident, from_mtime=False):
    """(datetime, source) of a submission: the instructor's metadata's time; else, only when
    ``from_mtime`` (``grade --late-from-mtime``), the newest modification time of the submitted
    files; else (None, :data:`NO_TIME`). A student controls a file's time: it is never a
    default."""
    if ident is not None and ident.created_at is not None:
        return ident.created_at, f"created_at in {ident.source or 'the metadata'}"
    if not from_mtime:
        return None, NO_TIME
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
        return None, NO_TIME
    return dt.datetime.fromtimestamp(newest, dt.timezone.utc), "file mtime (--late-from-mtime)"


def member_rows(row):
    """The rows of a CSV row for each member of its submission (one each for a group's, with
    that member's name, SID and email), or [row] when it has one member or none."""
    members = row.get("members") or []
    if len(members) <= 1:
        return [row]
    return [dict(row, name=m["name"], sid=m["sid"], email=m["email"], member=k)
            for k, m in enumerate(members)]


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
    fingerprint: str = ""           # of the submission it was written for ("": not given)
    file: str = ""

    def where(self):
        return f"--overrides {self.file!r}, line {self.line}" if self.file else f"line {self.line}"

    def key(self):
        """What identifies this override across runs: its student, function, score, reason."""
        text = "\x1f".join([self.student.lower(), self.function, repr(self.score), self.reason])
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def text(self):
        return f"{self.function}={self.score:g} ({self.reason})"


def read_overrides(path):
    """The overrides in a CSV with the columns student, function, score, reason and optionally
    fingerprint (``function`` is a graded function or ``total``; the grader's own
    ``grades-edits.csv`` is such a file). ValueError naming the line of a bad row."""
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
        if row["reason"].endswith(_TODO_REASON):
            raise ValueError(f"--overrides {path!r}, line {k}: the reason still ends in "
                             f"{_TODO_REASON[2:]!r}: replace that with why the score changed")
        fingerprint = _unquote(row.get("fingerprint", "")).lower()
        if fingerprint and not re.fullmatch(r"[0-9a-f]{6,64}", fingerprint):
            raise ValueError(f"--overrides {path!r}, line {k}: fingerprint {fingerprint!r}; "
                             "expected the hexadecimal fingerprint the grades CSV shows")
        out.append(Override(_unquote(row["student"]), _unquote(row["function"]), score,
                            row["reason"], k, fingerprint, os.fspath(path)))
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
class Stale:
    """An override not applied: its submission changed since it was written."""
    student: str
    override: Override
    written: str                     # the fingerprint it was written for
    now: str                         # the submission's fingerprint now

    def text(self):
        return (f"STALE, not applied: {self.override.text()}: written for submission "
                f"{self.written}, now {self.now}")


@dataclass
class Course:
    """The identities, submission times, late policy and overrides of a class's submissions."""
    identities: dict = field(default_factory=dict)      # student -> Identity
    times: dict = field(default_factory=dict)           # student -> (datetime or None, source)
    late: object = None                                 # LatePolicy or None
    overrides: dict = field(default_factory=dict)       # student -> [Override] (applied)
    fingerprints: dict = field(default_factory=dict)    # student -> its submission's fingerprint
    stale: list = field(default_factory=list)           # [Stale]
    ignored: dict = field(default_factory=dict)         # student -> [metadata files it holds]
    warnings: list = field(default_factory=list)        # for the instructor, printed by grade

    def columns(self):
        """The CSV columns this course fills: identity when any is known, the submission time
        when known or needed, the late policy's, and the overrides'."""
        out = []
        if any(i.name or i.sid or i.email for i in self.identities.values()):
            out += ["name", "sid", "email"]
        if self.late is not None or self.overrides or self.stale:
            out.append("graded_score")
        if self.late is not None:
            out += ["late_penalty_percent", "late"]
        if self.late is not None or any(i.created_at for i in self.identities.values()):
            out += ["submitted_at", "submitted_from"]
        if self.overrides or self.stale:
            out.append("overrides")
        return out

    def covers(self, student, function, score):
        """Whether an override (applied or stale) of ``student`` sets ``function`` to ``score``
        (a cell's text): a hand edit of the grades CSV that is already in --overrides."""
        try:
            value = float(score)
        except ValueError:
            return False
        mine = self.overrides.get(student, []) + [s.override for s in self.stale
                                                  if s.student == student]
        return any(o.function == function and abs(o.score - value) < 0.005 for o in mine)

    def apply(self, row, decimals=2):
        """``row`` (a CSV row of the grader) with the course's columns and the adjusted score."""
        student = row["student"]
        ident = self.identities.get(student) or Identity()
        when, source = self.times.get(student, (None, NO_TIME))
        stale = [s.text() for s in self.stale if s.student == student]
        out = dict(row, name=ident.name, sid=ident.sid, email=ident.email, members=ident.members,
                   graded_score=row["score"], late_penalty_percent="", late="",
                   submitted_at=when.isoformat(timespec="seconds") if when else "",
                   submitted_from=source, overrides="; ".join(stale), notes=[],
                   fingerprint=self.fingerprints.get(student, ""))
        late = None
        if self.late is not None and when is None:
            out["late"] = NO_TIME
        elif self.late is not None:
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
                   overrides="; ".join([o.text() for o in adjusted.overrides] + stale))
        return out

    def feedback(self, row):
        """The lines the student's report gets about the late policy and the overrides."""
        lines = []
        for name in self.ignored.get(row["student"], []):
            lines.append(f"{name} in your submission was ignored: who you are and when you "
                         "submitted come from the course's records only")
        if row.get("submitted_at"):
            lines.append(f"submitted at {row['submitted_at']} ({row['submitted_from']})")
        if self.late is not None:
            lines.append(f"due {self.late.due.isoformat(timespec='minutes')}: "
                         + (f"{NO_TIME}: the late policy was not applied"
                            if row["late"] in ("", NO_TIME) else row["late"]))
        lines += [n for n in row.get("notes") or [] if not n.startswith("late: ")]
        if lines and row.get("graded_score") not in ("", None) and row["score"] != row["graded_score"]:
            lines.append(f"score: {row['graded_score']:g} graded, {row['score']:g} after these")
        return lines


def _load_record(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def build_course(submissions, functions, *, metadata_dir=None, metadata=None, roster=None,
                 late=None, overrides=None, late_from_mtime=False, record=None, fingerprint=None):
    """The :class:`Course` of ``[(student, path)]`` graded on ``functions``.

    metadata_dir: the export's root, whose ``submission_metadata.yml`` is read
    (:func:`read_metadata`), or None; metadata: a metadata file the instructor names
    (:func:`read_metadata_file`), which wins; roster: a roster CSV, which wins for identity;
    overrides: an overrides CSV or a list of them (later lines win over earlier ones for the same
    student and function); late: the config's ``"late"`` entry or None; late_from_mtime: take
    the files' modification times where no submission time is known; fingerprint: a callable
    giving the fingerprint of a submission's path (what is graded there), or None (then no
    override can be found stale); record: a JSON file in which the fingerprint of each override
    without one is kept from its first application.

    An override naming no student of the class (by file name, SID, email or name) or no graded
    function is a ValueError naming its line: it would otherwise be lost without a word.
    """
    meta = read_metadata(metadata_dir) if metadata_dir else {}
    if metadata:
        meta.update(read_metadata_file(metadata))
    people = identities(submissions, meta, read_roster(roster) if roster else None)
    times = {s: submission_time(p, people.get(s), late_from_mtime) for s, p in submissions}
    course = Course(identities=people, times=times,
                    late=late_policy(late) if late is not None else None,
                    fingerprints={s: fingerprint(p) for s, p in submissions} if fingerprint
                    else {})
    course.ignored = {s: found for s, p in submissions if (found := student_metadata(p))}
    if not overrides:
        return course
    keys = {}
    for student, _ in submissions:
        ident = people[student]
        for key in [student, ident.sid, ident.email, ident.name] + \
                [m[k] for m in ident.members for k in ("sid", "email", "name")]:
            for part in str(key).split("; "):
                if part:
                    keys.setdefault(part.strip().lower(), set()).add(student)
    chosen = {}                       # (student, function) -> Override: a later line wins
    for path in [overrides] if isinstance(overrides, (str, os.PathLike)) else overrides:
        for o in read_overrides(path):
            who = keys.get(o.student.lower(), set())
            if len(who) != 1:
                raise ValueError(f"{o.where()}: student {o.student!r} "
                                 + ("matches several submissions" if who else
                                    "is not in the class (give the file name, SID, email or "
                                    "name)"))
            if o.function != "total" and o.function not in functions:
                raise ValueError(f"{o.where()}: function {o.function!r} is not graded; expected "
                                 f"one of {', '.join(functions)} or total")
            (student,) = who
            earlier = chosen.get((student, o.function))
            if earlier is not None:
                course.warnings.append(f"{o.where()} replaces {earlier.where()} ({student}, "
                                       f"{o.function})")
            chosen[(student, o.function)] = o
    recorded = _load_record(record) if record else {}
    changed = False
    for (student, _), o in chosen.items():
        now = course.fingerprints.get(student, "")
        written = o.fingerprint or recorded.get(o.key(), "")
        if not written:
            recorded[o.key()] = written = now
            changed = True
        if now and not (now.startswith(written) or written.startswith(now)):
            course.stale.append(Stale(student, o, written, now))
        else:
            course.overrides.setdefault(student, []).append(o)
    if record and changed:
        from ..shared.fileio import write_json
        os.makedirs(os.path.dirname(os.path.abspath(record)), exist_ok=True)
        write_json(record, recorded)
    for s in course.stale:
        course.warnings.append(f"stale override, not applied: {s.override.where()} ({s.student}, "
                               f"{s.override.text()}) was written for submission {s.written}, "
                               f"which is now {s.now}: check the new submission, then set the "
                               f"line's fingerprint to {s.now} (or delete the line)")
    return course


def csv_edits(written, current, functions):
    """The score cells of a grades CSV changed by hand since the grader wrote it (``written``
    and ``current`` are the file's texts): [(student, column, old, new)]. A group's rows (one
    per member) are compared row by row; an edit of several of them is listed once."""
    def table(text):
        out, seen = {}, {}
        for r in csv.DictReader(text.splitlines()):
            student = _unquote(r.get("student") or "")
            seen[student] = seen.get(student, -1) + 1
            out[(student, seen[student])] = r
        return out
    before, after = table(written), table(current)
    out = []
    for (student, _), row in after.items():
        old = before.get((student, _))
        if old is None:
            continue
        for column in ["score"] + list(functions):
            if (row.get(column) or "") != (old.get(column) or ""):
                edit = (student, "total" if column == "score" else column,
                        old.get(column) or "", row.get(column) or "")
                if edit not in out:
                    out.append(edit)
    return out


def edits_as_overrides(edits, fingerprints=None):
    """Hand edits of a grades CSV as the rows of an overrides CSV (text), each with the
    fingerprint of the submission the edited grade was given to (``fingerprints``)."""
    import io
    fingerprints = fingerprints or {}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OVERRIDE_COLUMNS + ["fingerprint"])
    for student, column, old, new in edits:
        w.writerow([safe_cell(v) for v in (student, column, new, f"edited in the grades CSV (was "
                                           f"{old}){_TODO_REASON}", fingerprints.get(student, ""))])
    return buf.getvalue()
