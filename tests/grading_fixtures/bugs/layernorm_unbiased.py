# Planted bug: LayerNorm with the unbiased variance (divided by n - 1).


def layernorm_forward(x, gamma, beta, *, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1)
    inv = 1.0 / np.sqrt(var + eps)
    xhat = xc * inv
    out = xhat if gamma is None else xhat * gamma
    if beta is not None:
        out = out + beta
    return out, {"xhat": xhat, "inv": inv, "gamma": gamma, "has_beta": beta is not None}
