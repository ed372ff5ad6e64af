"""The machinery behind ``gradcheck.check_gradients`` (the function a student calls, and its
result, are in ``numpytfmr/gradcheck.py``): the structural checks (structure.py), the finite
differences (compare.py), the diagnoses in the order diagnose.py tries them, and the text of
the report (report.py). Each module's docstring says what it does; docs/gradcheck.md is the
guide.
"""
