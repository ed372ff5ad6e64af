"""The machinery behind ``gradcheck.check_gradients``; the function a student calls, and
its result, are in ``numpytfmr/gradcheck.py``.

    structure.py      what every backward must do besides being right: one gradient per
                      input of its shape and dtype, linear in dout, no changes to cache,
                      inputs, dout
    compare.py        finite differences of one input, entry by entry or along directions,
                      with kinks told apart from wrong values
    diagnose.py       sentences that say how a wrong gradient is wrong (a factor, a sign, a
                      transpose, a missing dout term, one slice), and the order in which the
                      case-wide diagnoses below are tried
    catalogue.py      a gradient equal to a known wrong backward of the op's catalogue
                      (declared with its registration: softmax's diagonal only, LayerNorm's
                      unbiased variance, DPO's sigmoid(+margin)), times a factor or not
    recognise.py      which registered op a forward computes, found by its output (a
                      student's own softmax is softmax, with its axis; LayerNorm with its
                      eps), or which op it is close to (a scale, an input left out): the
                      catalogue's way into a forward written without the package
    evidence.py       what a diagnosis looks at (the two gradients, the case) and the
                      Diagnosis sentence with its kind
    terms.py          the case's own names for a factor (d_k, 1/scale, alpha/r, N)
    rowwise.py        a missing normalisation term, a reduction over the wrong axis, the
                      variance's normaliser (softmax, log-softmax, cross-entropy, LayerNorm,
                      RMSNorm)
    elementwise.py    a wrong f'(x) of an elementwise op, and where
    products.py       a transposed factor inside a product (dout @ W for dout @ W.T)
    counterfactual.py the gradient of the forward with another input set to 1, 0 or
                      transposed (gamma forgotten, a path left out)
    locate.py         rows of repeated ids, entries picked by targets, positions a mask
                      hides, a rotation in the wrong direction
    report.py         the text of the report
"""
