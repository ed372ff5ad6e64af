"""The machinery behind ``gradcheck.check_gradients``; the function a student calls, and
its result, are in ``numpytfmr/gradcheck.py``. Each module's docstring says what it does:

    structure.py      one gradient per input of its shape and dtype, linear in dout, no
                      changes to cache, inputs, dout
    compare.py        finite differences of one input, kinks told apart from wrong values
    diagnose.py       how a wrong gradient is wrong, and the order of the diagnoses below
    catalogue.py      a gradient equal to a known wrong backward of the op's catalogue
    recognise.py      which registered op a forward computes, found by its output
    evidence.py       what a diagnosis looks at, and the Diagnosis sentence with its kind
    terms.py          the case's own names for a factor (d_k, 1/scale, alpha/r, N)
    rowwise.py        a missing normalisation term, a reduction over the wrong axis
    elementwise.py    a wrong f'(x) of an elementwise op, and where
    products.py       a transposed factor inside a product (dout @ W for dout @ W.T)
    counterfactual.py the gradient of the forward with another input set to 1, 0 or
                      transposed (gamma forgotten, a path left out)
    locate.py         repeated ids, picked targets, masked positions, a wrong rotation
    report.py         the text of the report
"""
