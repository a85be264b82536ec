"""LiteRT's ahead-of-time compile for a phone NPU, and what it left on the CPU.

`compile_for(model, soc)` runs LiteRT's own AOT flow (`prepare_for_npu`: its MLIR transforms, then
its apply-plugin tool with the vendor's compiler plugin) for one SoC. The output is a .tflite in
which each NPU partition is one `DISPATCH_OP` custom op (its options: `bytecode_offset`,
`bytecode_size`, `name`) and the vendor's context binary sits after the flatbuffer; every op the
plugin did not take stays a CPU builtin. `read_compiled` reads that back: the partitions, and the
CPU ops by op and by PyTorch module path (tflite_info.module_path: tensor names survive the compile).

Only Qualcomm compiles here: MediaTek's, Google Tensor's, Samsung's and Intel's plugins need their
vendor's SDK, a download LiteRT's sdk packages fetch at install time from the vendor's host.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from tpu_pipeline.convert.npu.qnn_libs import QnnLibs
from tpu_pipeline.convert.tflite_info import module_path
from tpu_pipeline.convert.tool_output import quiet_native
from tpu_pipeline.errors import ConversionError, UserError

DISPATCH_OP = "DISPATCH_OP"
ROOT_MODULE = "the model's own forward"  # an op whose tensor names no submodule
# vendor -> why its SoCs cannot be compiled on this machine (checked with ai-edge-litert 2.3.0)
NOT_HERE = {
    "MediaTek": "LiteRT's MediaTek plugin needs MediaTek's NeuroPilot SDK, a vendor download "
                "(ai-edge-litert-sdk-mediatek fetches it from MediaTek at install time); this tool compiles "
                "Qualcomm SoCs only",
    "Google Tensor": "LiteRT's Google Tensor compiler is in an invite-only SDK (ai-edge-litert-sdk-google-tensor "
                     "does not install without it); this tool compiles Qualcomm SoCs only",
    "Samsung": "LiteRT's Samsung plugin needs Samsung's Exynos AI Studio SDK, a vendor download; this tool "
               "compiles Qualcomm SoCs only",
    "Intel": "LiteRT's Intel OpenVINO plugin targets PC NPUs, not phones, and needs Intel's SDK download; this tool "
             "compiles Qualcomm SoCs only",
}
_BUILTIN_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


def _vendor_socs() -> dict[str, list[str]]:
    from ai_edge_litert.aot.vendors.google_tensor import target as tensor
    from ai_edge_litert.aot.vendors.intel_openvino import target as intel
    from ai_edge_litert.aot.vendors.mediatek import target as mtk
    from ai_edge_litert.aot.vendors.qualcomm import target as qnn
    from ai_edge_litert.aot.vendors.samsung import target as samsung

    return {vendor: [s.value for s in mod.SocModel if s.value != "ALL"]
            for vendor, mod in (("Qualcomm", qnn), ("MediaTek", mtk), ("Google Tensor", tensor),
                                ("Samsung", samsung), ("Intel", intel))}


def check_socs(socs: list[str], where: str) -> None:
    """A UserError in one line for the first SoC this machine cannot compile for, saying why."""
    if not socs:
        raise UserError(f"{where}: npu_socs is empty; name at least one SoC (e.g. SM8650)")
    known = _vendor_socs()
    for soc in socs:
        if soc in known["Qualcomm"]:
            continue
        vendor = next((v for v, names in known.items() if soc in names), None)
        if vendor is None:
            raise UserError(f"{where}: unknown SoC {soc!r}; Qualcomm SoCs LiteRT compiles for: "
                            + ", ".join(known["Qualcomm"]))
        raise UserError(f"{where}: SoC {soc} ({vendor}) cannot be compiled here: {NOT_HERE[vendor]}")


@dataclasses.dataclass(kw_only=True)
class Partition:
    name: str             # qnn_partition_0: the QNN graph name inside the context binary
    op_index: int         # position of its DISPATCH_OP among the compiled subgraph's ops
    bytecode_offset: int
    bytecode_size: int
    inputs: list[int]     # tensor indices of the compiled model
    outputs: list[int]


@dataclasses.dataclass(kw_only=True)
class Compiled:
    soc: str
    model: bytes
    compile_s: float
    ops_total: int
    ops_on_npu: int
    partitions: list[Partition]
    cpu_ops: list[dict]   # {"op", "module", "tensor"} per op left on the CPU, in execution order
    plugin_stats: dict | None  # the plugin's own count, when it printed one

    @property
    def npu_share(self) -> float:
        return self.ops_on_npu / self.ops_total if self.ops_total else 0.0

    def stats(self) -> dict:
        """report.json's view: ops on the NPU / total, partitions, bytes, and what stays on the CPU."""
        by_op: dict[str, int] = {}
        by_module: dict[str, list[str]] = {}
        for o in self.cpu_ops:
            by_op[o["op"]] = by_op.get(o["op"], 0) + 1
            by_module.setdefault(o["module"] or ROOT_MODULE, []).append(o["op"])
        return {"soc": self.soc, "ops_on_npu": self.ops_on_npu, "ops_total": self.ops_total,
                "npu_ops_share": round(self.npu_share, 4), "partitions": len(self.partitions),
                "partition_bytes": {p.name: p.bytecode_size for p in self.partitions},
                "size_bytes": len(self.model), "compile_s": round(self.compile_s, 3),
                "cpu_ops": {"by_op": by_op, "by_module": by_module},
                **({"plugin_stats": self.plugin_stats} if self.plugin_stats else {})}


def _op_name(m: schema.ModelT, op: schema.OperatorT) -> str:
    code = m.operatorCodes[op.opcodeIndex]
    if code.customCode:
        return code.customCode.decode()
    return _BUILTIN_NAMES.get(max(code.builtinCode, code.deprecatedBuiltinCode), str(code.builtinCode))


def dequantized_steps(model: bytes) -> dict[str, float]:
    """{float output name: the int8 step it was computed in} for outputs a DEQUANTIZE makes (int8
    with float I/O): the unit to compare two runs of it in, as an int8 output's own scale is."""
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    sg = m.subgraphs[0]
    steps = {}
    for op in sg.operators or []:
        if _op_name(m, op) == "DEQUANTIZE" and op.outputs[0] in list(sg.outputs):
            q = sg.tensors[op.inputs[0]].quantization
            if q is not None and q.scale is not None and len(q.scale) == 1:
                steps[sg.tensors[op.outputs[0]].name.decode()] = float(q.scale[0])
    return steps


def count_ops(model: bytes) -> int:
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    return sum(len(sg.operators or []) for sg in m.subgraphs)


def read_compiled(model: bytes) -> tuple[schema.ModelT, list[Partition], list[dict]]:
    """(the flatbuffer, its NPU partitions, its CPU ops) of a compiled .tflite; a partition whose
    bytecode lies outside the file is a ConversionError (a truncated or damaged artifact)."""
    try:
        m = schema.ModelT.InitFromPackedBuf(model, 0)
    except Exception as e:  # noqa: BLE001 - flatbuffers raises anything on a damaged file
        raise ConversionError(f"the compiled model is not a readable .tflite ({type(e).__name__})") from None
    if len(m.subgraphs) != 1:
        raise ConversionError(f"the compiled model has {len(m.subgraphs)} subgraphs; the simulator check reads one")
    sg = m.subgraphs[0]
    parts, cpu = [], []
    for i, op in enumerate(sg.operators or []):
        name = _op_name(m, op)
        if name == DISPATCH_OP:
            opts = flexbuffers.Loads(bytes(op.customOptions))
            off, size = int(opts["bytecode_offset"]), int(opts["bytecode_size"])
            if off <= 0 or size <= 0 or off + size > len(model):
                raise ConversionError(f"NPU partition {opts.get('name', i)}: its bytecode ({size} bytes at {off}) "
                                      f"lies outside the {len(model)}-byte file")
            parts.append(Partition(name=str(opts["name"]), op_index=i, bytecode_offset=off, bytecode_size=size,
                                   inputs=[int(t) for t in op.inputs if t >= 0],
                                   outputs=[int(t) for t in op.outputs]))
        else:
            out = sg.tensors[op.outputs[0]].name.decode() if len(op.outputs) else ""
            cpu.append({"op": name, "module": module_path(out), "tensor": out})
    return m, parts, cpu


def soc_model_json(model_json: dict, soc: str, qnn_version: str, **fields) -> dict:
    """model.json of a model compiled for `soc` (DIR/android-npu/<SoC>/model.json): the target's own,
    which SoC and which QNN compiled it, and `fields` (its bytes and figures)."""
    return {**model_json, "soc": soc, "compiled_for": f"Qualcomm {soc} (LiteRT AOT, QNN {qnn_version})", **fields}


def compile_for(model: bytes, soc: str, libs: QnnLibs) -> Compiled:
    """One SoC's compiled model, through LiteRT's own AOT flow with the QNN libraries of `libs`;
    a compile that fails is a ConversionError with the plugin's last log lines."""
    from ai_edge_litert.aot import prepare_for_npu as aot
    from ai_edge_litert.aot.core import aot_types, apply_plugin, mlir_transforms
    from ai_edge_litert.aot.vendors.qualcomm import target as qnn

    class _ApplyPlugin(apply_plugin.ApplyPlugin):
        # LiteRT's Qualcomm backend passes sdk_libs_path from ai-edge-litert-sdk-qualcomm (an SDK
        # downloaded at install time) or None; this points the same argument at libs.lib_dir.
        def __call__(self, *args, sdk_libs_path=None, **kwargs):
            return super().__call__(*args, sdk_libs_path=str(libs.lib_dir), **kwargs)

    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-npu-") as work:
        src = Path(work) / "model.tflite"
        src.write_bytes(model)
        cfg = aot_types.CompilationConfig(target=qnn.Target(qnn.SocModel(soc))).to_dict()
        t0 = time.perf_counter()
        with quiet_native():  # LiteRT's progress bars and the plugin's log
            res = aot.prepare_for_npu(aot_types.Model.create_from_path(src), Path(work) / "out",
                                      aot.resolve_backend(cfg), cfg, transforms=mlir_transforms.MlirTransforms(),
                                      quantizer=None, plugin=_ApplyPlugin(experimental_capture_stderr=True),
                                      keep_going=True)
        compile_s = time.perf_counter() - t0
        if res.failed_backends or not res.models_with_backend:
            why = res.failed_backends[0][1] if res.failed_backends else "no model came back"
            raise ConversionError(f"LiteRT's Qualcomm compile for {soc} failed: {_log_tail(str(why))}")
        out = res.models_with_backend[0][1]
        compiled = Path(out.path).read_bytes()
        stats = out.partition_stats
    _, parts, cpu = read_compiled(compiled)
    plugin = None
    if stats is not None and stats.subgraph_stats:
        plugin = {"ops_offloaded": sum(s.num_ops_offloaded for s in stats.subgraph_stats),
                  "ops_total": sum(s.num_total_ops for s in stats.subgraph_stats),
                  "partitions": sum(s.num_partitions_offloaded for s in stats.subgraph_stats)}
    # the plugin's count is over the ops it saw (after LiteRT's MLIR transforms); without it, the
    # ops of the input model that did not stay on the CPU
    total = plugin["ops_total"] if plugin else count_ops(model)
    on_npu = plugin["ops_offloaded"] if plugin else max(total - len(cpu), 0)
    return Compiled(soc=soc, model=compiled, compile_s=compile_s, ops_total=total, ops_on_npu=on_npu,
                    partitions=parts, cpu_ops=cpu, plugin_stats=plugin)


def _log_tail(why: str) -> str:
    """The plugin writes its log to a temporary .error file and names it; its last error line says more."""
    path = why.rsplit("See ", 1)[-1].split(" for details")[0].strip() if "See " in why else ""
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return why
    errs = [ln for ln in lines if "error" in ln.lower() or "fail" in ln.lower()]
    return f"{(errs or lines or [why])[-1][:300]} (log: {path})"
