"""Runs a compiled model as a phone would split it: each NPU partition's bytecode on Qualcomm's
x86 HTP simulator, the ops left on the CPU on LiteRT's CPU interpreter (XNNPACK), stitched in
execution order.

The HTP simulator is libQnnHtp.so's x86 build, driven by onnxruntime's QNN execution provider
(onnxruntime-qnn): the exact context binary LiteRT appended to the .tflite is cut out (offset and
size from its DISPATCH_OP) and wrapped in an ONNX `com.microsoft.EPContext` node (embed_mode 1),
with onnxruntime's CPU fallback disabled, so a partition the simulator cannot run fails instead of
silently running on onnxruntime's CPU kernels. LiteRT's own docs (vendors/qualcomm/doc/
LITERT_QNN_NATIVE_RUN.md) call the x86 HTP run the reference the phone "should match closely".

The CPU ops between partitions run as small .tflite models cut from the compiled one (its tensors,
buffers and op codes, only those ops), on the same interpreter the android target's parity uses.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from tpu_pipeline.convert.npu.compile import Partition, read_compiled
from tpu_pipeline.convert.runtimes.litert import from_artifact, to_artifact
from tpu_pipeline.convert.tflite_info import IOTensor
from tpu_pipeline.convert.tool_output import quiet_native
from tpu_pipeline.errors import ConversionError

# TensorType -> (numpy dtype, onnx TensorProto element type)
_TYPES = {0: ("float32", 1), 1: ("float16", 10), 2: ("int32", 6), 3: ("uint8", 2), 4: ("int64", 7),
          6: ("bool", 9), 7: ("int16", 5), 9: ("int8", 3)}


@dataclasses.dataclass
class _Segment:
    partition: Partition | None  # None: CPU ops
    ops: list[int]
    inputs: list[int]
    outputs: list[int]
    runner: object = None


class HtpSimulator:
    """One compiled model, ready to run rows: `run(sample)` takes and returns arrays in PyTorch's
    terms (quantized I/O (de)quantized with the model's scales), like LitertRunner.run."""

    def __init__(self, model: bytes, input_names: list[str] | None = None, output_names: list[str] | None = None):
        """input_names/output_names: the order rows and results take (the uncompiled model's signature
        order, ModelInfo's); the compile keeps tensor names, not necessarily the subgraph's order."""
        self.model = model
        self.m, self.partitions, self.cpu_ops = read_compiled(model)
        sg = self.m.subgraphs[0]
        self.sg = sg
        self.inputs = _ordered([self._io(i, pos) for pos, i in enumerate(sg.inputs)], input_names, "input")
        self.outputs = _ordered([self._io(i, pos) for pos, i in enumerate(sg.outputs)], output_names, "output")
        if not self.partitions:
            raise ConversionError("the compiled model has no NPU partition: nothing runs on the NPU")
        self.segments = self._segments()
        self.session_s = 0.0
        t0 = time.perf_counter()
        # the simulator prints its thread-storage notice on fd 1, where --json writes
        with quiet_native():
            for seg in self.segments:
                seg.runner = self._htp_session(seg.partition) if seg.partition else self._cpu_model(seg)
        self.session_s = time.perf_counter() - t0

    def _io(self, index: int, pos: int) -> IOTensor:
        t = self.sg.tensors[index]
        q = t.quantization
        scale = float(q.scale[0]) if q is not None and q.scale is not None and len(q.scale) == 1 else 0.0
        zp = int(q.zeroPoint[0]) if q is not None and q.zeroPoint is not None and len(q.zeroPoint) == 1 else 0
        shape = [int(d) for d in t.shape]
        return IOTensor(key=str(pos), tensor_index=int(index), position=pos, name=t.name.decode(), shape=shape,
                        shape_signature=shape, dtype=_TYPES[t.type][0], scale=scale, zero_point=zp)

    def _segments(self) -> list[_Segment]:
        """Execution order cut into runs of CPU ops and single partitions; each segment's inputs are
        the non-constant tensors it reads and does not make, its outputs those read later or returned."""
        by_op = {p.op_index: p for p in self.partitions}
        ops = self.sg.operators
        segs: list[_Segment] = []
        for i in range(len(ops)):
            if i in by_op:
                segs.append(_Segment(by_op[i], [i], [], []))
            elif segs and segs[-1].partition is None:
                segs[-1].ops.append(i)
            else:
                segs.append(_Segment(None, [i], [], []))
        made_by = {}
        for s_i, seg in enumerate(segs):
            for i in seg.ops:
                for t in ops[i].outputs:
                    made_by[int(t)] = s_i
        constant = {t for t in range(len(self.sg.tensors)) if t not in made_by and t not in set(self.sg.inputs)}
        for s_i, seg in enumerate(segs):
            own = {int(t) for i in seg.ops for t in ops[i].outputs}
            seen = []
            for i in seg.ops:
                for t in ops[i].inputs:
                    t = int(t)
                    if t >= 0 and t not in own and t not in constant and t not in seen:
                        seen.append(t)
            seg.inputs = seen
        needed_later = {}
        for s_i, seg in enumerate(segs):
            for t in seg.inputs:
                needed_later.setdefault(t, []).append(s_i)
        returned = {int(t) for t in self.sg.outputs}
        for s_i, seg in enumerate(segs):
            made = [int(t) for i in seg.ops for t in ops[i].outputs]
            seg.outputs = [t for t in made if t in returned or any(j > s_i for j in needed_later.get(t, []))]
        return segs

    def _value_info(self, index: int):
        from onnx import helper

        t = self.sg.tensors[index]
        return helper.make_tensor_value_info(t.name.decode(), _TYPES[t.type][1], [int(d) for d in t.shape])

    def _htp_session(self, p: Partition):
        import onnxruntime as ort
        from onnx import helper

        ins = [self._value_info(t) for t in p.inputs]
        outs = [self._value_info(t) for t in p.outputs]
        blob = self.model[p.bytecode_offset:p.bytecode_offset + p.bytecode_size]
        node = helper.make_node("EPContext", [v.name for v in ins], [v.name for v in outs], name=p.name,
                                domain="com.microsoft", embed_mode=1, ep_cache_context=blob, source="QNN",
                                partition_name=p.name)
        graph = helper.make_graph([node], p.name, ins, outs)
        onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                             helper.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.log_severity_level = 3  # QNN's own warnings (file-mapped weights, positional I/O names) are not ours
        so.add_provider_for_devices(_qnn_devices(), {"backend_type": "htp"})
        # a partition the simulator refuses must fail, not run on onnxruntime's CPU kernels
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            return ort.InferenceSession(onnx_model.SerializeToString(), so)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own Fail/RuntimeException types
            first = " ".join(str(e).split())[:300]
            raise ConversionError(f"the HTP simulator refused {p.name}: {first}") from None

    def _cpu_model(self, seg: _Segment) -> Interpreter:
        """The segment's ops as a .tflite of their own (the compiled model's tensors, buffers and op
        codes; nothing renumbered), on ai-edge-litert's default CPU resolver (XNNPACK)."""
        m = schema.ModelT.InitFromPackedBuf(self.model, 0)
        sg = m.subgraphs[0]
        sg.operators = [sg.operators[i] for i in seg.ops]
        sg.inputs, sg.outputs = list(seg.inputs), list(seg.outputs)
        m.signatureDefs, m.metadata = [], []
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        try:
            it = Interpreter(model_content=bytes(b.Output()))
            it.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            first = " ".join(str(e).split())[:300]
            raise ConversionError(f"the CPU ops between NPU partitions do not load on ai-edge-litert: {first}") from None
        return it

    def run_raw(self, feed: list[np.ndarray]) -> list[np.ndarray]:
        """Artifact-typed inputs (int8 where the model takes int8) -> artifact-typed outputs."""
        values = {t.tensor_index: np.asarray(x) for x, t in zip(feed, self.inputs)}
        for seg in self.segments:
            if seg.partition is not None:
                names = [i.name for i in seg.runner.get_inputs()]
                got = seg.runner.run(None, {n: values[t] for n, t in zip(names, seg.inputs)})
            else:
                it = seg.runner  # the cut model keeps the compiled model's tensor indices
                for t in seg.inputs:
                    it.set_tensor(t, values[t])
                it.invoke()
                got = [it.get_tensor(t) for t in seg.outputs]
            values.update(zip(seg.outputs, (np.asarray(g) for g in got)))
        return [values[t.tensor_index] for t in self.outputs]

    def run(self, sample: list[np.ndarray]) -> list[np.ndarray]:
        raw = self.run_raw([to_artifact(x, t) for x, t in zip(sample, self.inputs)])
        return [from_artifact(y, t) for y, t in zip(raw, self.outputs)]


def _ordered(io: list[IOTensor], names: list[str] | None, what: str) -> list[IOTensor]:
    if names is None:
        return io
    by_name = {t.name: t for t in io}
    if sorted(by_name) != sorted(names):
        raise ConversionError(f"the compiled model's {what}s ({', '.join(sorted(by_name))}) are not the model's "
                              f"({', '.join(names)})")
    return [by_name[n] for n in names]


_DEVICES: list = []
_LOCK = threading.Lock()


def _qnn_devices() -> list:
    """onnxruntime's QNN devices, the plugin EP registered once per process (targets run in threads)."""
    import onnxruntime as ort
    import onnxruntime_qnn

    with _LOCK:
        if not _DEVICES:
            if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
                ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
            _DEVICES.extend(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")
        if not _DEVICES:
            raise ConversionError("onnxruntime's QNN execution provider lists no device: the HTP simulator is "
                                  "not available")
        return _DEVICES
