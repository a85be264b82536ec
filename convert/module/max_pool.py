"""Adaptive max pools to one value per channel, exported as a max over the
pooled axes (`amax`).

litert-torch 0.10 has no lowering for aten.adaptive_max_pool2d (what
nn.AdaptiveMaxPool1d/2d trace to: "Lowering not found"), so the standard text
CNN's max over time, written `nn.AdaptiveMaxPool1d(1)`, converted for no
target. With an output size of 1 the pool is exactly `amax` over the pooled
axes (keepdim), which lowers to REDUCE_MAX (int8 on TFLM: convert/precision/tflm_int8.py).
`as_amax` swaps such modules in a copy of the model; other output sizes and
`return_indices=True` are left as they are.
"""

from __future__ import annotations

import copy

from torch import nn


class _AxesMax(nn.Module):
    def __init__(self, axes: tuple[int, ...]):
        super().__init__()
        self.axes = axes

    def forward(self, x):
        return x.amax(dim=self.axes, keepdim=True)


def _ones(size) -> bool:
    return all(s == 1 for s in (size if isinstance(size, (tuple, list)) else (size,)))


def as_amax(module: nn.Module) -> tuple[nn.Module, list[str]]:
    """-> (the module to export, report notes); the module itself when it has no such pool."""
    axes = {nn.AdaptiveMaxPool1d: (-1,), nn.AdaptiveMaxPool2d: (-2, -1)}
    names = [name for name, m in module.named_modules()
             if type(m) in axes and _ones(m.output_size) and not m.return_indices]
    if not names:
        return module, []
    module = copy.deepcopy(module)
    for name in names:
        parent, _, leaf = name.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        setattr(owner, leaf, _AxesMax(axes[type(getattr(owner, leaf))]))
    return module, [f"{len(names)} adaptive max pool(s) to size 1 exported as a max over the pooled axes "
                    "(REDUCE_MAX): litert-torch has no lowering for adaptive_max_pool2d (convert/module/max_pool.py)"]
