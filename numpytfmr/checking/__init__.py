"""The machinery behind ``gradcheck.check_gradients``; the function a student calls, and
its result, are in ``numpytfmr/gradcheck.py``.

    structure.py   what every backward must do besides being right: one gradient per input
                   of its shape and dtype, linear in dout, no changes to cache, inputs, dout
    compare.py     finite differences of one input, entry by entry or along directions,
                   with kinks told apart from wrong values
    diagnose.py    sentences that say how a wrong gradient is wrong (a factor, a sign, a
                   transpose, a missing dout term, one slice)
    report.py      the text of the report
"""
