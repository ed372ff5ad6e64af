"""The position-wise feed-forward network that follows attention (004 eq. 17, 002 "Elementwise
nonlinearity").

The notes write it for one column vector, ``h_FF = W2 ReLU(W1 h + b1) + b2``; with tokens as
rows the same layer is ``act(x W1 + b1) W2 + b2`` with the weights transposed, applied to
every row (every token) independently. It is built from the linear and activation pairs.

The gated form of LLaMA, SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"),
replaces ``act(x W1)`` by a product of two projections, one of them through SiLU:
``(silu(x W_gate) * (x W_up)) W_down`` (:func:`swiglu_ffn_forward`).
"""
from .activations import (gelu_backward, gelu_forward, relu_backward, relu_forward,
                          silu_backward, silu_forward)
from .contract import backward_of, one_of, op
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


# The weights are listed first so that a mismatched x is reported against W1.
@op("W1: (d, d_ff)", "b1: (d_ff,)?", "W2: (d_ff, d_out)", "b2: (d_out,)?", "x: (..., d)",
    activation=one_of(*FFN_ACTIVATIONS))
def ffn_forward(x, W1, b1, W2, b2, *, activation="relu"):
    """Feed-forward sublayer (004 eq. 17 in row form).

        h   = x W1 + b1          (d -> d_ff; the notes take d_ff = 5d, GPT uses 4d)
        a   = act(h)             act: "relu" (the notes), "gelu" (exact), "gelu_tanh" (GPT-2)
        out = a W2 + b2          (d_ff -> d_out, usually d_out = d)

    x: (..., d)   W1: (d, d_ff)   b1: (d_ff,) or None   W2: (d_ff, d_out)   b2: (d_out,) or None
    ->  out: (..., d_out)
    cache: {"lin1", "act", "lin2": the caches of the three steps, "activation"}
    """
    act_forward, _, options = _ACTIVATIONS[activation]
    h, lin1 = linear_forward(x, W1, b1)         # h = x W1 + b1
    a, act = act_forward(h, **options)          # a = act(h)
    out, lin2 = linear_forward(a, W2, b2)       # out = a W2 + b2
    return out, {"lin1": lin1, "act": act, "lin2": lin2, "activation": activation}


@backward_of(ffn_forward)
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


@op("W_gate: (d, d_ff)", "W_up: (d, d_ff)", "W_down: (d_ff, d_out)", "x: (..., d)",
    activation=one_of(*_GATE_ACTIVATIONS))
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
    act_forward, _, options = _GATE_ACTIVATIONS[activation]
    g, gate = linear_forward(x, W_gate)         # g = x W_gate
    u, up = linear_forward(x, W_up)             # u = x W_up
    a, act = act_forward(g, **options)          # a = silu(g)
    h = a * u                                   # the gate opens or closes each hidden unit
    out, down = linear_forward(h, W_down)       # out = h W_down
    return out, {"gate": gate, "up": up, "act": act, "down": down, "a": a, "u": u,
                 "activation": activation}


@backward_of(swiglu_ffn_forward)
def swiglu_ffn_backward(dout, cache):
    """Gradient of :func:`swiglu_ffn_forward`: the four steps in reverse.

    Returns (dx, dW_gate, dW_up, dW_down). ``x`` feeds both projections, so its gradient
    is the sum of the two paths.
    """
    _, act_backward, _ = _GATE_ACTIVATIONS[cache["activation"]]
    dh, dW_down, _ = linear_backward(dout, cache["down"])     # out = h W_down
    da = dh * cache["u"]                                       # h = a * u:  dh/da = u
    du = dh * cache["a"]                                       #             dh/du = a
    dg = act_backward(da, cache["act"])                        # a = silu(g)
    dx_gate, dW_gate, _ = linear_backward(dg, cache["gate"])   # g = x W_gate
    dx_up, dW_up, _ = linear_backward(du, cache["up"])         # u = x W_up
    return dx_gate + dx_up, dW_gate, dW_up, dW_down            # x feeds both projections
