"""Which ops of an artifact XNNPACK runs: its delegate partitions and the ops left to
LiteRT's other kernels (builtin optimized or reference), as the phone's CPU runtime
plans them.

ai-edge-litert applies XNNPACK when the interpreter allocates (the AUTO resolver, as
LiteRT's CPU runtime does on a phone); each partition becomes one DELEGATE node in the
interpreter's node list, whose outputs are the tensors the partition hands out. The
Python interpreter does not expose the execution plan, so the ops left outside are found
from the graph: walking back from the model's outputs (and from tensors nothing reads,
such as a fused LSTM's state reset), a tensor a DELEGATE node produces leads to that
node, any other to the op that produces it, and every op reached that way runs outside
XNNPACK. A graph split into more partitions than its float counterpart pays a hand-over
(and often a float <-> int8 conversion) at each boundary: the pipeline says so when a
candidate splits further (convert/pipeline.py).
"""

from __future__ import annotations

import collections
import warnings

from ai_edge_litert.interpreter import Interpreter, OpResolverType

DELEGATE = "DELEGATE"


def xnnpack_plan(model: bytes) -> dict:
    """{"partitions": XNNPACK delegate nodes, "ops": the model's ops, "delegated": ops inside them,
    "left": {op name: count} of the ops other kernels run} for the model's first subgraph."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        interp = Interpreter(model_content=model, num_threads=1, experimental_op_resolver_type=OpResolverType.AUTO)
    interp.allocate_tensors()
    nodes = interp._get_ops_details()  # noqa: SLF001 - the node list after delegation; no public accessor
    delegates = [n for n in nodes if n["op_name"] == DELEGATE]
    ops = [n for n in nodes if n["op_name"] != DELEGATE]
    producer = {int(t): n for n in ops for t in n["outputs"]}
    producer.update({int(t): n for n in delegates for t in n["outputs"]})  # a partition's outputs are its own
    read = {int(t) for n in nodes for t in n["inputs"]}
    sinks = [int(d["index"]) for d in interp.get_output_details()]
    # an op none of whose outputs is read runs for its side effect (a fused LSTM's state reset writes
    # its variable tensors); an op with one output unread among others (SPLIT) is reached through the rest
    sinks += [int(n["outputs"][0]) for n in ops if len(n["outputs"]) and not {int(t) for t in n["outputs"]} & read]
    seen: set[int] = set()
    left: collections.Counter = collections.Counter()
    scopes: list[str] = []  # each op's outputs, named as ai-edge-quantizer scopes an op (quantize keep_float)
    names = {d["index"]: d["name"] for d in interp.get_tensor_details()}
    stack = list(sinks)
    while stack:
        node = producer.get(stack.pop())
        if node is None or node["index"] in seen:
            continue
        seen.add(node["index"])
        if node["op_name"] != DELEGATE:
            left[node["op_name"]] += 1
            scopes.append(";".join(names[int(t)] for t in node["outputs"]))
        stack += [int(t) for t in node["inputs"] if t >= 0]
    n_left = sum(left.values())
    return {"partitions": len(delegates), "ops": len(ops), "delegated": len(ops) - n_left,
            "left": dict(sorted(left.items())), "left_scopes": scopes}


def splits_more(candidate: dict | None, baseline: dict | None) -> str | None:
    """One line when `candidate` (an xnnpack_plan) splits the graph into more XNNPACK partitions, or
    leaves more ops outside XNNPACK, than `baseline` (its float counterpart's); None otherwise."""
    if not candidate or not baseline:
        return None
    more_parts = candidate["partitions"] > baseline["partitions"]
    more_left = candidate["ops"] - candidate["delegated"] > baseline["ops"] - baseline["delegated"]
    if not (more_parts or more_left):
        return None
    left = ", ".join(f"{op} x{n}" for op, n in candidate["left"].items()) or "none"
    return (f"XNNPACK splits it into {candidate['partitions']} partition(s) against the float32 export's "
            f"{baseline['partitions']}, with {candidate['ops'] - candidate['delegated']} op(s) left to other kernels "
            f"(float32: {baseline['ops'] - baseline['delegated']}): {left}")
