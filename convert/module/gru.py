"""nn.GRU exported as a short unrolled graph: TFLite has no fused GRU builtin.

litert-torch 0.10 unrolls nn.GRU into 19 ops a step (measured: 154 ops at T=8, 6.75 of them
SLICE a step, cutting the three gates out of stacked tensors). `FusedGRU` computes the same
recurrence with the input projection of every step done once before the loop (one
FULLY_CONNECTED over [B, T, F] per gate group, then UNPACK by step) and, per step: one
FULLY_CONNECTED for the reset and update gates together, one for the candidate, and the gate
arithmetic, no slices of stacked tensors but one SPLIT of r|z. Export still grows with the
sequence length: the runtimes here run no loop op the converter emits for it. The weights are
constants shared by every step: the .tflite stores each once (measured on a 2-layer, 64-unit
keyword spotter at T=49: 72 KB of int8 buffers for 46k parameters); what grows with T is the
graph (ops and tensors).

TFLM's CONCATENATION takes at most 10 inputs (kMaxInputNum): a layer's T step outputs stacked
in one op fail to prepare on TFLM whatever the arena (issue 30: "Node CONCATENATION failed to
prepare" with 256 KiB, 1 MiB and 4 MiB). A later layer is therefore fed step by step (its input
projection one FULLY_CONNECTED a step, the same constant weights) and the output sequence is
stacked in groups of at most STACK_GROUP steps, then the groups.
"""

from __future__ import annotations

import torch
from torch import nn

from tpu_pipeline.convert.module.rnn_weights import layer_weights


STACK_GROUP = 8  # steps per CONCATENATION: TFLM's kernel takes at most 10 inputs


def stack_steps(steps: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack(steps, 1) with no concatenation of more than STACK_GROUP inputs."""
    while len(steps) > STACK_GROUP:
        steps = [torch.cat(steps[i:i + STACK_GROUP], 1) if steps[0].dim() == 3 else
                 torch.stack(steps[i:i + STACK_GROUP], 1) for i in range(0, len(steps), STACK_GROUP)]
    return torch.cat(steps, 1) if steps[0].dim() == 3 else torch.stack(steps, 1)


class FusedGRU(nn.Module):
    """An nn.GRU (any layers, directions, batch_first) with the same outputs (output, h_n);
    an initial state given at call time runs the original."""

    def __init__(self, gru: nn.GRU):
        super().__init__()
        self.original = gru
        self.batch_first, self.hidden = gru.batch_first, gru.hidden_size
        self.layers, self.directions = gru.num_layers, 2 if gru.bidirectional else 1
        self.fell_back = False
        h = gru.hidden_size
        for sfx, w, r, bi, bh in layer_weights(gru):
            # r and z see b_ih + b_hh summed; the candidate's b_hh sits inside r * (W_hn h + b_hn)
            self.register_buffer("w_rz" + sfx, w[:2 * h].clone())
            self.register_buffer("b_rz" + sfx, (bi[:2 * h] + bh[:2 * h]).clone())
            self.register_buffer("w_n" + sfx, w[2 * h:].clone())
            self.register_buffer("b_in" + sfx, bi[2 * h:].clone())
            self.register_buffer("r_rz" + sfx, r[:2 * h].clone())
            self.register_buffer("r_n" + sfx, r[2 * h:].clone())
            self.register_buffer("b_hn" + sfx, bh[2 * h:].clone())

    def _direction(self, x, sfx: str, reverse: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
        """x [B, T, F] (the first layer: one projection for every step) or a list of T steps [B, F]
        (a later layer) -> (outputs, T steps [B, H], last state [B, H])."""
        p = {k: getattr(self, k + sfx) for k in ("w_rz", "b_rz", "w_n", "b_in", "r_rz", "r_n", "b_hn")}
        if isinstance(x, torch.Tensor):
            x_rz = nn.functional.linear(x, p["w_rz"], p["b_rz"]).unbind(1)
            x_n = nn.functional.linear(x, p["w_n"], p["b_in"]).unbind(1)
        else:
            x_rz = [nn.functional.linear(s, p["w_rz"], p["b_rz"]) for s in x]
            x_n = [nn.functional.linear(s, p["w_n"], p["b_in"]) for s in x]
        h = x_rz[0].new_zeros(x_rz[0].shape[0], self.hidden)
        order = range(len(x_rz) - 1, -1, -1) if reverse else range(len(x_rz))
        outs = [None] * len(x_rz)
        for t in order:
            r, z = torch.sigmoid(x_rz[t] + nn.functional.linear(h, p["r_rz"])).chunk(2, dim=-1)
            n = torch.tanh(x_n[t] + r * nn.functional.linear(h, p["r_n"], p["b_hn"]))
            h = n + z * (h - n)
            outs[t] = h
        return outs, h

    def forward(self, x: torch.Tensor, hx=None):
        if hx is not None:
            self.fell_back = True
            return self.original(x, hx)
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        if not self.batch_first:
            x = x.transpose(0, 1)
        last = []
        for layer in range(self.layers):
            outs = []
            for d in range(self.directions):
                y, h = self._direction(x, f"_l{layer}" + ("_reverse" if d else ""), reverse=bool(d))
                outs.append(y)
                last.append(h)
            x = outs[0] if len(outs) == 1 else [torch.cat(steps, dim=-1) for steps in zip(*outs)]
        x = stack_steps(x)
        h_n = torch.stack(last)
        if not self.batch_first:
            x = x.transpose(0, 1)
        if unbatched:
            x, h_n = x.squeeze(0 if self.batch_first else 1), h_n.squeeze(1)
        return x, h_n
