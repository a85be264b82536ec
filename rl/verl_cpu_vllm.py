"""vLLM-CPU weight sync for VeRL (wrapper 3 of tpu_pipeline.rl.verl_cpu_platform).

vLLM's CPU GEMM prepares each linear layer's weight for the CPU at load time
(`dispatch_cpu_unquantized_gemm`: sgl-kernel packing on AMX for 16-bit
weights, a oneDNN handle on AVX-512/AVX2, zentorch on AMD where installed) and
leaves `layer.weight` an empty 1-D placeholder. VeRL's update loads the
trainer's weights with `model.load_weights(...)`, then runs vLLM's
`process_weights_after_loading` over the whole model once more. Both break on
a CPU:
- the weights land in the placeholders, not in the prepared kernels: the
  rollout keeps sampling the first policy;
- processing a prepared layer a second time reaches the placeholder: on a CPU
  with AMX its branch for weights with `ndim != 2` calls `.view(size(0),
  size(2))` on it (IndexError); elsewhere the branch returns and the layer
  keeps its old kernel.

So the update runs as vLLM's own `reload_weights` does: the layer-wise reload
(`initialize_layerwise_reload`) restores each layer's checkpoint-format
parameters, loads into them and prepares each layer afresh once it is
complete; `finalize_layerwise_reload` takes VeRL's whole-model step's place.
One thing vLLM's reload misses: a module whose parameter is another's (a tied
`lm_head`) receives no weights of its own, so the reload puts it back with the
kernel prepared at start-up. Its data is the new embedding's, its prepared
copy is not: those modules are prepared again from their (new) weights
(tests/rl/test_verl_weight_sync_on_cpu.py, on every GEMM path above).

`CpuWorkerExtension` is VeRL's colocated vLLM worker extension with its
weight update wrapped that way; `--engine verl` on CPU names it with
rollout.engine_kwargs.vllm.worker_extension_cls. It is imported only in vLLM's
worker process (it imports vllm).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import vllm.model_executor.model_loader.utils as vllm_loader_utils
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from tpu_pipeline.rl.verl_cpu_platform import CALLED, private_ipc

QUALNAME = "tpu_pipeline.rl.verl_cpu_vllm.CpuWorkerExtension"


def aliased_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules with a quantization method (vLLM prepares their weights) holding a parameter that
    another module holds too: a tied lm_head and the embedding it shares."""
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        if isinstance(getattr(module, "quant_method", None), QuantizeMethodBase):
            for p in module.parameters(recurse=False):
                owners.setdefault(id(p), []).append(module)
    out: list[torch.nn.Module] = []
    for group in owners.values():
        if len(group) > 1:
            out.extend(m for m in group if all(m is not o for o in out))
    return out


def finish_reload(model: torch.nn.Module, model_config) -> None:
    """vLLM's end of a layer-wise reload, then the aliased modules prepared from their new weights."""
    finalize_layerwise_reload(model, model_config)
    for module in aliased_modules(model):
        module.quant_method.process_weights_after_loading(module)


@contextlib.contextmanager
def layerwise_reload(models: list[tuple[torch.nn.Module, object]]) -> Iterator[None]:
    """Weights loaded inside the block reach vLLM's prepared kernels. VeRL's whole-model
    `process_weights_after_loading` (its last step, looked up at call time) becomes `finish_reload`;
    if the block ends before it, the reload is finished on the way out all the same."""
    pending = {id(model): (model, config) for model, config in models}
    for model, _ in models:
        initialize_layerwise_reload(model)

    def instead_of_processing(model, model_config, target_device):
        CALLED.add("wrap.process_weights_after_loading")
        if pending.pop(id(model), None) is not None:
            finish_reload(model, model_config)

    original = vllm_loader_utils.process_weights_after_loading
    vllm_loader_utils.process_weights_after_loading = instead_of_processing
    try:
        yield
    finally:
        vllm_loader_utils.process_weights_after_loading = original
        for model, config in pending.values():
            finish_reload(model, config)


class CpuWorkerExtension(vLLMColocateWorkerExtension):
    """VeRL's vLLM worker extension; weight updates go through vLLM's layer-wise reload."""

    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        CALLED.add("wrap.update_weights_from_ipc")
        if peft_config and base_sync_done:  # LoRA adapters are added, not loaded into layers
            return super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
        with layerwise_reload(list(self._iter_all_models_with_config())):
            return super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)

    def _get_zmq_handle(self) -> str:
        return private_ipc(super()._get_zmq_handle())  # wrapper 4, the receiving end

    def _update_weights(self, weights, peft_config: dict, base_sync_done: bool):
        # The layer-wise reload holds each tensor until its layer is complete (a tied lm_head never
        # is), and the received tensors are views of VeRL's shared-memory bucket, which VeRL closes
        # after the last bucket ("cannot close exported pointers exist"): hand it copies.
        return super()._update_weights([(n, t.clone()) for n, t in weights], peft_config, base_sync_done)


class CpuServerAdapter(ServerAdapter):
    """VeRL's vLLM rollout as the trainer's worker holds it, sending weights over a socket in the
    run's own temporary folder (wrapper 4, the sending end)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        CALLED.add("wrap.ServerAdapter")
        self.zmq_handle = private_ipc(self.zmq_handle)
