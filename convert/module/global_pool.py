"""Average pools whose window covers the whole map, exported as a mean.

Hugging Face EfficientNet pools with `AvgPool2d(1280, ceil_mode=True)`: at
128 px the map is 4 x 4, so the pool is the mean over it. litert-torch 0.10
lowers it literally: PAD to 1280 x 1280, AVERAGE_POOL_2D (divisor
1280 x 1280), and the correction (x102,400) folded into the next layer's
weights. Measured on the zoo's EfficientNet-B0: the padded activation alone
takes 8 GiB on the interpreter (24 GiB peak while localizing), and the folded
weights (up to 152,100) are beyond float16's 65,504, so every float16 artifact
outputs NaN. `as_mean` rewrites such a pool, in a copy of the module, as a mean
over the map (MEAN), which PyTorch computes identically; the copy is checked
against the original on the sample inputs and dropped if it differs.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class _MapMean(nn.Module):
    def forward(self, x):
        return x.mean(dim=(-2, -1), keepdim=True)


def _whole_map(in_shape, out_shape, kernel, padding, divisor_override) -> bool:
    """The pool's one window covers the whole map and divides by its size: a mean."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
    pads = (padding,) if isinstance(padding, int) else tuple(padding)
    return (len(in_shape) >= 3 and tuple(out_shape[-2:]) == (1, 1) and kh >= in_shape[-2] and kw >= in_shape[-1]
            and not any(pads) and divisor_override is None)


def _graph_pools(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    found = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.aten.avg_pool2d.default:
            continue
        x, val = n.args[0], n.meta.get("val")
        in_val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        args = list(n.args) + [None] * 7
        kernel, padding = args[1], args[3] if args[3] is not None else n.kwargs.get("padding", 0)
        divisor = args[6] if len(n.args) > 6 else n.kwargs.get("divisor_override")
        if in_val is not None and val is not None and _whole_map(in_val.shape, val.shape, kernel, padding, divisor):
            found.append(n)
    return found


def _rewrite_graph(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, int]:
    pools = _graph_pools(gm)
    if not pools:
        return gm, 0
    gm = copy.deepcopy(gm)
    for n in _graph_pools(gm):
        with gm.graph.inserting_before(n):
            mean = gm.graph.call_function(torch.ops.aten.mean.dim, (n.args[0], [-2, -1], True))
        mean.meta = dict(n.meta)  # module stack kept: localization still names the pool's module
        n.replace_all_uses_with(mean)
        gm.graph.erase_node(n)
    gm.recompile()
    return gm, len(pools)


def _rewrite_modules(module: nn.Module, sample_args) -> tuple[nn.Module, int]:
    pools = {name: m for name, m in module.named_modules() if type(m) is nn.AvgPool2d}
    if not pools:
        return module, 0
    shapes: dict[str, tuple] = {}

    def record(name, i, o) -> None:  # a forward hook that returns a value replaces the module's output
        shapes.setdefault(name, (i[0].shape, o.shape))

    hooks = [m.register_forward_hook(lambda _m, i, o, name=name: record(name, i, o)) for name, m in pools.items()]
    try:
        with torch.no_grad():
            module(*sample_args)
    finally:
        for h in hooks:
            h.remove()
    names = [name for name, m in pools.items() if name in shapes and _whole_map(
        *shapes[name], m.kernel_size, m.padding, m.divisor_override)]
    if not names:
        return module, 0
    module = copy.deepcopy(module)
    for name in names:
        parent, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, leaf, _MapMean())
    return module, len(names)


def as_mean(module: nn.Module, sample_args) -> tuple[nn.Module, list[str]]:
    """-> (the module to export, report notes). The module itself when nothing is rewritten or
    the rewrite does not reproduce it on the sample inputs."""
    if isinstance(module, torch.fx.GraphModule):
        new, n = _rewrite_graph(module)
    else:
        new, n = _rewrite_modules(module, sample_args)
    if not n:
        return module, []
    with torch.no_grad():
        want, got = module(*sample_args), new(*sample_args)
    flat = [(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got))
            if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if not flat or not all(torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(a.abs().max()) + 1e-12) for a, b in flat):
        return module, []
    return new, [f"{n} average pool(s) whose window covers the whole map exported as a mean (MEAN): litert-torch "
                 "pads them to the window and folds the divisor into the next weights (docs/DESIGN.md)"]
