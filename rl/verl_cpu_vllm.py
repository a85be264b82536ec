"""vLLM-CPU weight sync for VeRL (wrapper 3 of tpu_pipeline.rl.verl_cpu_platform).

vLLM's CPU GEMM repacks each linear layer's weight at load time and leaves
`layer.weight` empty, so VeRL's in-place `model.load_weights(...)` of the
trainer's new weights lands nowhere (the rollout keeps sampling the first
policy). vLLM's own layer-wise reload (`initialize_layerwise_reload` before,
`finalize_layerwise_reload` after, what vLLM's `reload_weights` does) restores
the checkpoint-format parameters, loads into them and repacks.

`CpuWorkerExtension` is VeRL's colocated vLLM worker extension with its
weight update wrapped that way; `--engine verl` on CPU names it with
rollout.engine_kwargs.vllm.worker_extension_cls. It is imported only in vLLM's
worker process (it imports vllm).
"""

from __future__ import annotations

from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from tpu_pipeline.rl.verl_cpu_platform import CALLED

QUALNAME = "tpu_pipeline.rl.verl_cpu_vllm.CpuWorkerExtension"


class CpuWorkerExtension(vLLMColocateWorkerExtension):
    """VeRL's vLLM worker extension; weight updates go through vLLM's layer-wise reload."""

    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        CALLED.add("wrap.update_weights_from_ipc")
        if peft_config and base_sync_done:  # LoRA adapters are added, not loaded into layers
            return super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
        runner = self.model_runner
        models = list(self._iter_all_models())
        for model in models:
            initialize_layerwise_reload(model)
        try:
            # VeRL's update loads every bucket, then runs process_weights_after_loading once
            # (which the layer-wise reload has made the repacking step of the new weights).
            return super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
        finally:
            for model in models:
                finalize_layerwise_reload(model, runner.model_config)

    def _update_weights(self, weights, peft_config: dict, base_sync_done: bool):
        # The layer-wise reload holds each tensor until its layer is complete (a tied lm_head never
        # is), and the received tensors are views of VeRL's shared-memory bucket, which VeRL closes
        # after the last bucket ("cannot close exported pointers exist"): hand it copies.
        return super()._update_weights([(n, t.clone()) for n, t in weights], peft_config, base_sync_done)
