"""numpytfmr/special.py: erf and erfc against the standard library's (dense grids, tails,
float32), and the normal CDF and density built on them; still importable from activations."""
import math

import numpy as np

import numpytfmr.activations
from numpytfmr.special import erf, erfc, normal_cdf, normal_pdf


def test_erf_matches_math_erf_on_a_dense_grid_with_tails():
    x = np.concatenate([np.linspace(-30.0, 30.0, 60001),
                        np.geomspace(1e-300, 30.0, 4001), -np.geomspace(1e-300, 30.0, 4001),
                        [0.0, 0.46875, 0.46875 + 1e-15, 4.0, 4.0 + 1e-14, 26.5, 1e300, -1e300]])
    ref = np.array([math.erf(v) for v in x])
    got = erf(x)
    nz = ref != 0
    assert np.max(np.abs(got[nz] - ref[nz]) / np.abs(ref[nz])) <= 1e-14
    assert np.all(got[~nz] == 0)


def test_erfc_has_relative_accuracy_in_the_tail():
    x = np.concatenate([np.linspace(-6.0, 26.5, 40001), [0.0, 0.46875, 4.0, 10.0, 20.0, 26.0]])
    ref = np.array([math.erfc(v) for v in x])
    got = erfc(x)
    assert np.max(np.abs(got - ref) / ref) <= 1e-14
    assert np.all(erfc(np.array([27.5, 40.0, 1e300])) == 0)
    assert np.all(erfc(np.array([-27.5, -1e300])) == 2)


def test_erf_float32_keeps_dtype_and_float32_accuracy():
    x = np.linspace(-6, 6, 2001).astype(np.float32)
    got = erf(x)
    assert got.dtype == np.float32
    ref = np.array([math.erf(float(v)) for v in x])
    assert np.max(np.abs(got - ref)) <= 1e-6


def test_normal_cdf_keeps_its_relative_precision_in_the_lower_tail():
    x = np.concatenate([np.linspace(-37.0, 8.0, 9001), [0.0, -0.6629126073623883]])
    ref = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    got = normal_cdf(x)
    assert np.max(np.abs(got - ref) / ref) <= 1e-14          # Phi(-37) ~ 6e-300, not 0
    assert normal_cdf(np.array([0.0]))[0] == 0.5
    assert normal_cdf(np.array([-40.0, 40.0])).tolist() == [0.0, 1.0]


def test_normal_pdf_is_the_density_and_vanishes_beyond_40():
    x = np.linspace(-38.0, 38.0, 7601)
    ref = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(normal_pdf(x), ref, rtol=1e-15, atol=0)
    assert normal_pdf(np.array([-1e300, 41.0, 1e300])).tolist() == [0.0, 0.0, 0.0]


def test_float32_in_float32_out_and_other_input_read_as_float64():
    x32 = np.linspace(-5, 5, 101, dtype=np.float32)
    for f in (erf, erfc, normal_cdf, normal_pdf):
        assert f(x32).dtype == np.float32
        assert f([0, 1, 2]).dtype == np.float64
        np.testing.assert_allclose(f(x32), f(x32.astype(np.float64)), rtol=1e-6, atol=1e-30)


def test_activations_still_gives_the_special_functions():
    for name in ("erf", "erfc", "normal_cdf", "normal_pdf"):
        assert getattr(numpytfmr.activations, name) is globals()[name]
