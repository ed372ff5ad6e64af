"""Registry entries for the recurrent model of the slides (002): the GRU cell."""
from numpytfmr.registry import Case, OpSpec
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


OPS = [
    OpSpec("gru_cell", gru_cell_forward, gru_cell_backward, _gru_cell_cases,
           "002 'Hidden state of the decoder'", "full"),
]
