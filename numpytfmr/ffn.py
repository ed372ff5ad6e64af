"""The position-wise feed-forward network that follows attention (004 eq. 17, 002 "Elementwise
nonlinearity").

The notes write it for one column vector, ``h_FF = W2 ReLU(W1 h + b1) + b2``; with tokens as
rows the same layer is ``act(x W1 + b1) W2 + b2`` with the weights transposed, applied to
every row (every token) independently. It is built from the linear and activation pairs.

The gated form of LLaMA, SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"),
replaces ``act(x W1)`` by a product of two projections, one of them through SiLU:
``(silu(x W_gate) * (x W_up)) W_down`` (:func:`swiglu_ffn_forward`).
"""
from ._validate import choice, float_array, optional_float_array, vector_arg
from .activations import (gelu_backward, gelu_forward, relu_backward, relu_forward,
                          silu_backward, silu_forward)
from .linear import linear_backward, linear_forward

__all__ = ["ffn_forward", "ffn_backward", "FFN_ACTIVATIONS", "swiglu_ffn_forward",
           "swiglu_ffn_backward"]

# name -> (forward, backward, keyword options of the forward)
_ACTIVATIONS = {
    "relu": (relu_forward, relu_backward, {}),                            # 004 eq. 17
    "gelu": (gelu_forward, gelu_backward, {"approximate": "none"}),       # exact x Phi(x)
    "gelu_tanh": (gelu_forward, gelu_backward, {"approximate": "tanh"}),  # GPT-2's tanh form
}
FFN_ACTIVATIONS = tuple(_ACTIVATIONS)


def ffn_forward(x, W1, b1, W2, b2, *, activation="relu"):
    """Feed-forward sublayer (004 eq. 17 in row form).

        h   = x W1 + b1          (d -> d_ff; the notes take d_ff = 5d, GPT uses 4d)
        a   = act(h)             act: "relu" (the notes), "gelu" (exact), "gelu_tanh" (GPT-2)
        out = a W2 + b2          (d_ff -> d_out, usually d_out = d)

    x: (..., d)   W1: (d, d_ff)   b1: (d_ff,) or None   W2: (d_ff, d_out)   b2: (d_out,) or None
    ->  out: (..., d_out)
    cache: {"lin1", "act", "lin2": the caches of the three steps, "activation"}
    """
    where = "ffn_forward"
    choice(activation, "activation", where, FFN_ACTIVATIONS)
    x = float_array(x, "x", where)
    W1 = float_array(W1, "W1", where)
    W2 = float_array(W2, "W2", where)
    b1 = optional_float_array(b1, "b1", where)
    b2 = optional_float_array(b2, "b2", where)
    # Check the shapes here so the messages name the FFN's arguments, not linear_forward's.
    if W1.ndim != 2 or W2.ndim != 2:
        raise ValueError(f"{where}: W1 has shape {W1.shape} and W2 has shape {W2.shape}; expected "
                         "matrices of shapes (d, d_ff) and (d_ff, d_out)")
    if x.ndim == 0 or x.shape[-1] != W1.shape[0]:
        raise ValueError(f"{where}: x has shape {x.shape} but W1 has shape {W1.shape}; expected x of "
                         f"shape (..., {W1.shape[0]}) (the last axis of x is d = W1.shape[0])")
    if W2.shape[0] != W1.shape[1]:
        raise ValueError(f"{where}: W2 has shape {W2.shape} but W1 has shape {W1.shape}; expected W2 "
                         f"of shape ({W1.shape[1]}, d_out) (W2.shape[0] is d_ff = W1.shape[1])")
    if b1 is not None:
        vector_arg(b1, W1.shape[1], "b1", where, "W1", W1.shape, "d_ff = W1.shape[1]")
    if b2 is not None:
        vector_arg(b2, W2.shape[1], "b2", where, "W2", W2.shape, "d_out = W2.shape[1]")

    act_forward, _, act_options = _ACTIVATIONS[activation]
    h, lin1 = linear_forward(x, W1, b1)
    a, act = act_forward(h, **act_options)
    out, lin2 = linear_forward(a, W2, b2)
    return out, {"lin1": lin1, "act": act, "lin2": lin2, "activation": activation}


def ffn_backward(dout, cache):
    """Gradient of :func:`ffn_forward`: the three steps in reverse.

    Returns (dx, dW1, db1, dW2, db2), with None for a bias that was None.
    """
    _, act_backward, _ = _ACTIVATIONS[cache["activation"]]
    da, dW2, db2 = linear_backward(dout, cache["lin2"])  # out = a W2 + b2
    dh = act_backward(da, cache["act"])                  # a = act(h)
    dx, dW1, db1 = linear_backward(dh, cache["lin1"])    # h = x W1 + b1
    return dx, dW1, db1, dW2, db2


# The gate's activation: "silu" is SwiGLU (LLaMA); the GELU forms give GEGLU (Shazeer 2020).
_GATE_ACTIVATIONS = {
    "silu": (silu_forward, silu_backward, {}),
    "gelu": (gelu_forward, gelu_backward, {"approximate": "none"}),
    "gelu_tanh": (gelu_forward, gelu_backward, {"approximate": "tanh"}),
}


def swiglu_ffn_forward(x, W_gate, W_up, W_down, *, activation="silu"):
    """Gated feed-forward sublayer, SwiGLU (Shazeer 2020; the FFN of LLaMA), in row form.

        g   = x W_gate           (d -> d_ff)  the gate's pre-activation
        u   = x W_up             (d -> d_ff)  the value that is gated
        h   = silu(g) * u        elementwise; silu(g) = g sigmoid(g)
        out = h W_down           (d_ff -> d_out)

    No biases (LLaMA has none). ``activation`` picks the gate's nonlinearity: "silu"
    (SwiGLU), or "gelu" / "gelu_tanh" (GEGLU).

    x: (..., d)   W_gate, W_up: (d, d_ff)   W_down: (d_ff, d_out)   ->  out: (..., d_out)
    cache: {"gate", "up", "act", "down": the caches of the four steps, "a": silu(g),
            "u": u, "activation"}
    """
    where = "swiglu_ffn_forward"
    choice(activation, "activation", where, tuple(_GATE_ACTIVATIONS))
    x = float_array(x, "x", where)
    W_gate = float_array(W_gate, "W_gate", where)
    W_up = float_array(W_up, "W_up", where)
    W_down = float_array(W_down, "W_down", where)
    # Check the shapes here so the messages name these arguments, not linear_forward's.
    if W_gate.ndim != 2 or W_up.ndim != 2 or W_down.ndim != 2:
        raise ValueError(f"{where}: W_gate has shape {W_gate.shape}, W_up {W_up.shape} and W_down "
                         f"{W_down.shape}; expected matrices (d, d_ff), (d, d_ff), (d_ff, d_out)")
    if x.ndim == 0 or x.shape[-1] != W_gate.shape[0]:
        raise ValueError(f"{where}: x has shape {x.shape} but W_gate has shape {W_gate.shape}; "
                         f"expected x of shape (..., {W_gate.shape[0]}) (the last axis of x is "
                         "d = W_gate.shape[0])")
    if W_up.shape != W_gate.shape:
        raise ValueError(f"{where}: W_up has shape {W_up.shape} but W_gate has shape "
                         f"{W_gate.shape}; expected the same shape (d, d_ff)")
    if W_down.shape[0] != W_gate.shape[1]:
        raise ValueError(f"{where}: W_down has shape {W_down.shape} but W_gate has shape "
                         f"{W_gate.shape}; expected W_down of shape ({W_gate.shape[1]}, d_out) "
                         "(W_down.shape[0] is d_ff = W_gate.shape[1])")

    act_forward, _, act_options = _GATE_ACTIVATIONS[activation]
    g, gate = linear_forward(x, W_gate)     # g = x W_gate
    u, up = linear_forward(x, W_up)         # u = x W_up
    a, act = act_forward(g, **act_options)  # a = silu(g)
    h = a * u                               # the gate opens or closes each hidden unit
    out, down = linear_forward(h, W_down)   # out = h W_down
    return out, {"gate": gate, "up": up, "act": act, "down": down, "a": a, "u": u,
                 "activation": activation}


def swiglu_ffn_backward(dout, cache):
    """Gradient of :func:`swiglu_ffn_forward`: the four steps in reverse.

    Returns (dx, dW_gate, dW_up, dW_down). ``x`` feeds both projections, so its gradient
    is the sum of the two paths.
    """
    _, act_backward, _ = _GATE_ACTIVATIONS[cache["activation"]]
    dh, dW_down, _ = linear_backward(dout, cache["down"])   # out = h W_down
    da = dh * cache["u"]                                     # h = a * u:  dh/da = u
    du = dh * cache["a"]                                     #             dh/du = a
    dg = act_backward(da, cache["act"])                      # a = silu(g)
    dx_gate, dW_gate, _ = linear_backward(dg, cache["gate"])  # g = x W_gate
    dx_up, dW_up, _ = linear_backward(du, cache["up"])        # u = x W_up
    return dx_gate + dx_up, dW_gate, dW_up, dW_down          # x feeds both projections
