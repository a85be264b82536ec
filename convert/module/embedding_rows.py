"""How far random token ids may go: the row count of the embedding table each
integer model input indexes, recorded during the loader's own forward run.

Random token ids for calibration and parity must stay inside the table, or
the float32 export and PyTorch read past it differently.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def embedding_rows(module: nn.Module, sample_args: tuple) -> Iterator[list[int | None]]:
    """Around the caller's own forward run of `module` on `sample_args` (the loader runs it
    anyway): yields a list that holds, per input, after the block, the number of rows of the
    embedding table that input indexes directly (nn.Embedding called on it, or aten.embedding on
    it in an exported graph), else None. An input that goes through another op first (ids +
    offset, ids.long()) is not followed."""
    found: list[int | None] = [None] * len(sample_args)
    rows: dict[int, int] = {}
    positions = {id(a): i for i, a in enumerate(sample_args)
                 if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dtype != torch.bool}
    hooks = []
    if positions and isinstance(module, torch.fx.GraphModule):
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        if len(placeholders) == len(sample_args):
            index = {n: i for i, n in enumerate(placeholders)}
            for n in module.graph.nodes:
                if n.op == "call_function" and n.target is torch.ops.aten.embedding.default \
                        and n.args[1] in index and getattr(n.args[0], "op", None) == "get_attr":
                    table = functools.reduce(getattr, n.args[0].target.split("."), module)
                    _narrow(rows, index[n.args[1]], int(table.shape[0]))
    if positions:
        def seen(emb, args):
            if args and id(args[0]) in positions:
                _narrow(rows, positions[id(args[0])], emb.num_embeddings)

        hooks = [m.register_forward_pre_hook(seen) for m in module.modules() if isinstance(m, nn.Embedding)]
    try:
        yield found
    finally:
        for h in hooks:
            h.remove()
        found[:] = [rows.get(i) for i in range(len(sample_args))]


def _narrow(rows: dict[int, int], position: int, n: int) -> None:
    """An input read by several tables must fit the smallest."""
    rows[position] = min(rows.get(position, n), n)
