"""Machinery that more than one subpackage needs: ``run/`` (the commands) and ``grading/``
(the autograder) both write files, and the grader must not import the command line.

    fileio.py   files written atomically (text, bytes, JSON, summaries, arrays)

A module here imports only the standard library and NumPy, never another part of numpytfmr,
so that what an instructor audits of the grader stays the grader.
"""
