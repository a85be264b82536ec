"""The per-layer, per-direction weights of a PyTorch LSTM or GRU, for their export rewrites
(recurrent.py, gru.py)."""

from __future__ import annotations

from torch import nn


def layer_weights(rnn: nn.RNNBase):
    """(suffix, weight_ih, weight_hh, bias_ih, bias_hh) of each layer and direction of a PyTorch
    LSTM or GRU, detached; zero biases for bias=False."""
    gates = rnn.weight_ih_l0.shape[0]
    for layer in range(rnn.num_layers):
        for d in range(2 if rnn.bidirectional else 1):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            w, r = getattr(rnn, "weight_ih" + sfx).detach(), getattr(rnn, "weight_hh" + sfx).detach()
            zero = w.new_zeros(gates)
            bi = getattr(rnn, "bias_ih" + sfx).detach() if rnn.bias else zero
            bh = getattr(rnn, "bias_hh" + sfx).detach() if rnn.bias else zero
            yield sfx, w, r, bi, bh
