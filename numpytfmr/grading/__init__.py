"""The autograder: grade homework against the reference, safely.

- :func:`grade` runs a submission (.py or .ipynb) in separate, limited, sandboxed processes
  and compares each function it defines with the reference on the op registry's cases
  (``numpytfmr grade``); :func:`make_plan` fixes what a run grades.
- :func:`grade_class` grades a whole class in parallel into a CSV and a results.json per
  student, skipping unchanged submissions on a later run (``numpytfmr grade DIR --csv``).
- :func:`make_assignment` writes the students' folder (a skeleton, its notebook and the
  self-check ``check.py``, see :mod:`.selfcheck`, with its judge ``judge.py``: :mod:`.judge`,
  the comparison and verdict code the grader imports too), a grading config and the Gradescope
  ``setup.sh``/``run_autograder`` pair and ``autograder.zip`` (``numpytfmr make-assignment``).
- A class's logistics: :mod:`.course` (identity, late policy, overrides), :mod:`.exports`
  (Canvas and Moodle), :mod:`.similarity` (alike submissions, for review). The instructor's
  guide is docs/instructor.md.

``child.py`` is the script that runs inside the submission process; it imports only NumPy and
the standard library, and installs the sandbox (an audit hook) before the submission loads.
"""
from .classroom import find_submissions, grade_class
from .grader import Plan, Report, TestResult, grade, make_plan
from .skeleton import make_assignment

__all__ = ["grade", "make_plan", "Plan", "Report", "TestResult", "grade_class", "find_submissions",
           "make_assignment"]
