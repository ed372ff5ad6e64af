"""The autograder: grade homework against the reference, safely.

- :func:`grade` runs a submission (.py or .ipynb) in a separate, limited process and compares
  each function it defines with the reference on the op registry's cases (``numpytfmr grade``).
- :func:`make_assignment` writes a student skeleton, its notebook, a grading config and the
  Gradescope ``setup.sh``/``run_autograder`` pair (``numpytfmr make-assignment``).

``child.py`` is the script that runs inside the submission process; it imports only NumPy and
the standard library.
"""
from .grader import Report, TestResult, grade
from .skeleton import make_assignment

__all__ = ["grade", "Report", "TestResult", "make_assignment"]
