"""A stand-in for `ray` on the GPU bench machine only (bench/rl_gpu_check.sh puts
this folder on PYTHONPATH when ray is not installed there).

verl imports ray at module level (verl.protocol: `ray.ObjectRef` in annotations;
verl.single_controller.base.worker) although the local engine never starts Ray;
ray's wheel (~70 MB) does not fit the device machine's 64 MiB transfer. Any call
into it fails loudly."""


class ObjectRef:  # only named in verl's type annotations and isinstance checks
    pass


def _unavailable(*args, **kwargs):
    raise RuntimeError("ray is a stub on this machine (bench/gpu_stubs): --engine verl needs the real ray")


get = get_runtime_context = remote = init = _unavailable


class util:  # noqa: N801 - mirrors the ray.util module name
    get_node_ip_address = staticmethod(_unavailable)
