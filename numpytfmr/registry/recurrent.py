"""Registry entries for the recurrent model of the slides (002): the GRU cell."""
import numpy as np

from numpytfmr.registry import Case, OpSpec, wrong
from numpytfmr.rnn import gru_cell_backward, gru_cell_forward


def _gru_cell_cases(rng, dtype):
    """Example inputs for the op registry (``registry.Case`` objects):
    ``(e, h_prev, W_e, W_h, b, c, W_c)`` with leading batch axes, odd sizes, no context
    (the encoder's cell), no bias, a zero first state and no batch axis at all."""

    def case(lead, d_e, d, d_c, label, with_b=True, h_scale=0.8):
        # N(0, scale^2) entries in the requested dtype (scale a Python float: no upcast)
        r = lambda shape, scale=1.0: (scale * rng.standard_normal(shape)).astype(dtype)  # noqa: E731
        args = (r(lead + (d_e,)), r(lead + (d,), h_scale), r((d_e, 3 * d), d_e ** -0.5),
                r((d, 3 * d), d ** -0.5), r((3 * d,), 0.3) if with_b else None,
                r(lead + (d_c,)) if d_c else None, r((d_c, 3 * d), d_c ** -0.5) if d_c else None)
        return Case(args, {}, label)
    return [case((3,), 5, 7, 4, "e (3, 5), h (3, 7), c (3, 4)"),
            case((2, 3), 4, 5, 6, "leading axes (2, 3), d_c=6"),
            case((2, 1, 3), 3, 4, 0, "no context, no bias (the encoder's cell)", with_b=False),
            case((2,), 3, 5, 3, "h_prev = 0 (first step)", h_scale=0.0),
            case((), 6, 7, 3, "single vector, no batch axis")]


# ---------------------------------------------------------------------------------------
# Known wrong backwards (the catalogue the gradient checker names)
# ---------------------------------------------------------------------------------------

def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _gru_variant(dh, c, bug):
    """The GRU cell's backward as a student writes it, with one mistake ``bug``."""
    e, h_prev, cx, W_e, W_h, W_c = (c[k] for k in ("e", "h_prev", "c", "W_e", "W_h", "W_c"))
    R, Z, Rh, h_tilde = c["R"], c["Z"], c["Rh"], c["h_tilde"]
    d = h_prev.shape[-1]
    dZ = dh * (h_tilde - h_prev) if bug == "dZ sign" else dh * (h_prev - h_tilde)
    direct = 0.0 if bug == "no direct path" else dh * Z
    tanh_grad = 1.0 if bug == "no tanh derivative" else 1.0 - h_tilde * h_tilde
    dP_h = dh * (1.0 - Z) * tanh_grad
    dP_z = dZ * Z * (1.0 - Z)
    dRh = dP_h @ W_h[:, 2 * d:].T
    dP_r = dRh * h_prev * R * (1.0 - R)
    dP_rz = np.concatenate([dP_r, dP_z], axis=-1)
    dP = np.concatenate([dP_rz, dP_h], axis=-1)
    dh_prev = direct + dRh * R + dP_rz @ W_h[:, :2 * d].T
    de = dP @ W_e.T
    dW_e = _rows(e).T @ _rows(dP)
    candidate_in = h_prev if bug == "h_prev for R h_prev" else Rh
    dW_h = np.concatenate([_rows(h_prev).T @ _rows(dP_rz), _rows(candidate_in).T @ _rows(dP_h)],
                          axis=-1)
    db = _rows(dP).sum(axis=0) if c["has_b"] else None
    dc = None if cx is None else dP @ W_c.T
    dW_c = None if cx is None else _rows(cx).T @ _rows(dP)
    return de, dh_prev, dW_e, dW_h, db, dc, dW_c


_GRU_NAMES = ("e", "h_prev", "W_e", "W_h", "b", "c", "W_c")


def _gru(bug, text, of):
    return wrong(bug, text, lambda dh, c: _gru_variant(dh, c, bug), _GRU_NAMES, of)


_ALL = ("e", "h_prev", "W_e", "W_h", "b", "c", "W_c")
_GRU = (
    _gru("no direct path", "h = Z h_prev + (1 - Z) h~ carries h_prev straight through: "
         "dh_prev gets dh * Z besides the paths through the gates", ("h_prev",))
    + _gru("dZ sign", "h = Z h_prev + (1 - Z) h~, so dZ = dh * (h_prev - h~), not "
           "dh * (h~ - h_prev)", _ALL)
    + _gru("no tanh derivative", "h~ = tanh(P_h), so dP_h = dh * (1 - Z) * (1 - h~^2): the "
           "tanh derivative is missing", _ALL)
    + _gru("h_prev for R h_prev", "the candidate's recurrent weights see the reset state "
           "R * h_prev, so dW_hh = (R h_prev)^T dP_h", ("W_h",)))

OPS = [
    OpSpec("gru_cell", gru_cell_forward, gru_cell_backward, _gru_cell_cases,
           "002 'Hidden state of the decoder'", "full", mistakes=_GRU),
]
