# Forward bug: the LoRA scale uses the input size A.shape[0] where the rank A.shape[1] belongs.


def lora_linear_forward(x, W, A, B, b=None, *, alpha, rank_stabilized=False, dropout=0.0, rng=None,
                        train=True):
    rank = A.shape[0]                                  # should be A.shape[1]
    scale = alpha / np.sqrt(rank) if rank_stabilized else alpha / rank
    if train and dropout > 0:
        keep = rng.random(x.shape) >= dropout
        xd = x * keep / (1.0 - dropout)
    else:
        keep = None
        xd = x
    h = xd @ A
    y = x @ W + scale * (h @ B)
    if b is not None:
        y = y + b
    return y.astype(x.dtype), {"x": x, "W": W, "A": A, "B": B, "keep": keep, "p": dropout,
                               "xd": xd, "h": h, "scale": scale}


def lora_linear_backward(dout, cache):
    A, B, scale = cache["A"], cache["B"], cache["scale"]
    d_out = dout.reshape(-1, dout.shape[-1])
    dh = scale * (d_out @ B.T)
    dB = scale * (cache["h"].reshape(-1, B.shape[0]).T @ d_out)
    dA = cache["xd"].reshape(-1, A.shape[0]).T @ dh
    dxd = (dh @ A.T).reshape(cache["x"].shape)
    if cache["keep"] is not None:
        dxd = dxd * cache["keep"] / (1.0 - cache["p"])
    dx = dout @ cache["W"].T + dxd
    return dx.astype(dout.dtype), None, dA.astype(dout.dtype), dB.astype(dout.dtype), None
