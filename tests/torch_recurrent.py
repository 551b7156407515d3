"""PyTorch's recurrent layers as the reference for dlrun's LSTM, GRU and SimpleRNN (float64)."""
from __future__ import annotations

import numpy as np

TORCH_NAMES = {"LSTM": "LSTM", "GRU": "GRU", "SimpleRNN": "RNN"}


def twin(torch, name: str, layer, features: int):
    """The torch.nn layer that computes what dlrun's ``layer`` (named ``name``) computes, in
    float64, holding its weights."""
    ref = getattr(torch.nn, TORCH_NAMES[name])(features, layer.units, batch_first=True,
                                              bias=layer.bias is not None).double()
    copy_weights(torch, ref, layer, name)
    return ref


def copy_weights(torch, ref, layer, name: str) -> None:
    """Copy ``layer``'s weights into ``ref``: the same layout and gate order as PyTorch's. dlrun
    has one bias except in the GRU, whose second one sits inside the reset gate's product."""
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.from_numpy(layer.weight.data))
        ref.weight_hh_l0.copy_(torch.from_numpy(layer.recurrent.data))
        if layer.bias is not None:
            ref.bias_ih_l0.copy_(torch.from_numpy(layer.bias.data))
            if name == "GRU":
                ref.bias_hh_l0.copy_(torch.from_numpy(layer.params["recurrent_bias"].data))
            else:
                ref.bias_hh_l0.zero_()


def outputs_and_input_gradient(torch, ref, x, dy, return_sequences: bool):
    """``ref``'s output on ``x`` (h_T, or every h_t with ``return_sequences``) and dL/dx for the
    output's gradient ``dy``; the weights' gradients are left in ``ref``."""
    xt = torch.from_numpy(x).requires_grad_()
    seq, _ = ref(xt)
    want = seq if return_sequences else seq[:, -1]
    want.backward(torch.from_numpy(dy))
    return want.detach().numpy(), xt.grad.numpy()


def assert_weight_gradients_equal(layer, ref, name: str) -> None:
    """Every weight gradient of ``layer`` equals ``ref``'s (float64 rounding)."""
    pairs = [("weight", ref.weight_ih_l0), ("recurrent", ref.weight_hh_l0)]
    if layer.bias is not None:
        pairs.append(("bias", ref.bias_ih_l0))
        if name == "GRU":
            pairs.append(("recurrent_bias", ref.bias_hh_l0))
    for mine, theirs in pairs:
        np.testing.assert_allclose(layer.params[mine].grad, theirs.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=mine)
