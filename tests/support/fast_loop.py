"""`make test-fast`: the unit tests that start no child process, browser, export or VeRL launch.

A pytest plugin (`-p tpu_pipeline.testing.fast_loop`). With it, pytest leaves out:
- tests marked `slow`, `gpu` or `tpu` (the Makefile's `-m`);
- the files and tests in SLOW_PATHS: each starts a child process (a TFLM or GPU worker,
  Chromium, torchrun, Ray, the CLI as a console script), or exports a model with litert-torch
  (seconds to tens of seconds each), measured as the reason beside each.
While a kept test sets up and runs, starting a child process fails it, naming the command and
where to list the test, so the fast loop stays fast as tests are added.

`make test`, the full gate, runs everything with `--fast-loop=guard`: nothing is left out, but a
test the fast loop would keep still fails if it starts a child, so the quick loop cannot go red
while the full gate stays green.
"""

from __future__ import annotations

import os
import subprocess

import _posixsubprocess
import pytest

# Paths (a file, or file::test) left out of the fast loop, with why. From a run of every test not
# marked slow with this plugin on (2026-12-02): the tests it failed, and the files that took longest.
SLOW_PATHS = {
    # convert: litert-torch exports, ai-edge-quantizer, runtimes in child processes
    "tests/convert/test_api_on_cpu.py": "exports",
    "tests/convert/test_app_outputs.py": "exports; compiles model_data.cc with g++",
    "tests/convert/test_browser.py": "Chromium",
    "tests/convert/test_child_errors_on_cpu.py": "TFLM / GPU worker children",
    "tests/convert/test_float16_bound_on_cpu.py": "exports",
    "tests/convert/test_fuzz_on_cpu.py": "runs the CLI as a console script",
    "tests/convert/test_global_pool_on_cpu.py": "exports",
    "tests/convert/test_gpu_accelerator_on_cpu.py": "the GPU worker",
    "tests/convert/test_int8_ranges_on_cpu.py": "exports",
    "tests/convert/test_iot_text_on_cpu.py": "exports; TFLM child",
    "tests/convert/test_kinds_on_cpu.py": "exports",
    "tests/convert/test_litertlm_on_cpu.py": ".litertlm export child",
    "tests/convert/test_lm_export.py": "exports",
    "tests/convert/test_lm_families_on_cpu.py": ".litertlm export child",
    "tests/convert/test_localize_on_cpu.py": "exports",
    "tests/convert/test_mcu_ops_on_cpu.py": "exports; TFLM child",
    "tests/convert/test_mlperf_tiny_on_cpu.py": "exports; TFLM child",
    "tests/convert/test_npu_compile_on_cpu.py": "exports; LiteRT's AOT compiler (apply_plugin) in a child",
    "tests/convert/test_npu_target_on_cpu.py": "exports; LiteRT's AOT compiler in a child; the CLI in a child",
    "tests/convert/test_never_crash_on_cpu.py": "exports; the CLI as a console script",
    "tests/convert/test_overlap_on_cpu.py": "child processes",
    "tests/convert/test_page_server_on_cpu.py": "Chromium",
    "tests/convert/test_pipeline_on_cpu.py": "exports",
    "tests/convert/test_recurrent_on_cpu.py": "exports; TFLM child",
    "tests/convert/test_task_score_on_cpu.py": "exports",
    "tests/convert/test_tool_output_on_cpu.py": "exports",
    "tests/convert/test_trained_verdicts_on_cpu.py": "trains, exports",
    "tests/convert/test_zoo_on_cpu.py": "exports",
    # train and rl: torchrun, Ray, VeRL, the CLI in a child
    "tests/rl/test_verl_launch_on_cpu.py": "VeRL launches (Ray, vLLM)",
    "tests/rl/test_verl_cpu_platform_on_cpu.py": "VeRL's Ray trainer",
    "tests/train/test_ddp_on_cpu.py": "torchrun",
    "tests/convert/test_convert_under_load_on_cpu.py": "spinning child processes, a real convert",
    "tests/convert/test_loaders_on_cpu.py": "exports .pt2 archives; the CLI in a child",
    "tests/convert/test_output_kinds_on_cpu.py::test_kind_from_the_api_from_the_graph_and_in_the_report": "exports",
    # kernels: Pallas in interpret mode and lowering to TPU/GPU IR take seconds a case (259 s for numerics alone)
    "tests/kernels/test_numerics_on_cpu.py": "Pallas interpret mode, gradcheck",
    "tests/kernels/test_models_on_cpu.py": "Llama steps with the kernels in interpret mode",
    "tests/kernels/test_bridge_on_cpu.py": "torch.compile; the bench script in a child",
    "tests/kernels/test_lowering_on_cpu.py": "jax.export to TPU and GPU lowering",
    "tests/kernels/test_triton_lowering_on_cpu.py": "lowers every kernel to Triton IR",
    # train and rl: runs of a few steps (training, rollouts, VeRL's config composition)
    "tests/train/test_arith_lm_on_cpu.py": "trains",
    "tests/train/test_digits_on_cpu.py": "trains",
    "tests/train/test_resume_on_cpu.py": "trains, SIGKILLs a child",
    "tests/train/test_compile_on_cpu.py": "torch.compile",
    "tests/train/test_tasks_layer_on_cpu.py::test_importing_train_stays_cheap": "a fresh interpreter",
    "tests/rl/test_verl_engine_on_cpu.py": "VeRL's hydra composition, Ray job submit",
    "tests/rl/test_gsm8k_on_cpu.py": "rl runs on a tiny chat model",
    "tests/rl/test_lora_on_cpu.py": "rl runs with adapters",
    "tests/rl/test_engine_on_cpu.py": "rl runs",
    "tests/rl/test_dapo_on_cpu.py": "rl runs",
    "tests/rl/test_countdown_on_cpu.py": "trains, rl runs",
    "tests/rl/test_warm_start_on_cpu.py": "trains the warm start",
    "tests/rl/test_resume_on_cpu.py": "rl runs, SIGKILLs a child",
    "tests/rl/test_accel_on_cpu.py": "rl steps with the kernels",
    # core: the console script, the installed layout, lint-imports, device probes in children
    "tests/core/test_packaging.py": "builds and installs a wheel",
    "tests/core/test_layers.py": "runs lint-imports",
    "tests/core/test_device.py": "probes torch-tpu in a child; torch.compile",
    "tests/core/test_tpu_contract_on_cpu.py": "torch-tpu in .venv-tpu's interpreter, a child",
    "tests/core/test_cli.py::test_console_script_in_subprocess": "the console script",
    "tests/core/test_cli.py::test_debug_shows_the_tools_own_debug_lines": "a fresh interpreter",
    "tests/core/test_cpu_load.py::test_a_spinning_child_is_one_busy_core": "a spinning child",
    "tests/core/test_quiet_terminal.py::test_convert_prints_only_its_own_lines_and_debug_shows_the_rest": "a real convert",
    "tests/docs/test_examples.py::test_a_broken_block_fails": "runs bash and python children",
}


def _left_out(nodeid: str) -> str | None:
    path = nodeid.split("::", 1)[0]
    for key in (nodeid.split("[", 1)[0], path):
        if key in SLOW_PATHS:
            return SLOW_PATHS[key]
    return None


FAST_MARKERS_LEFT_OUT = ("slow", "gpu", "tpu")  # the Makefile's `-m "not slow and not gpu and not tpu"`


def pytest_addoption(parser):
    parser.addoption("--fast-loop", choices=("select", "guard"), default="select",
                     help="select: leave out the slow tests and guard the rest (make test-fast); guard: run every "
                          "test, guarding those the fast loop keeps (make test)")


def _selecting(config) -> bool:
    return config.getoption("--fast-loop") == "select"


def _kept(item) -> bool:
    return _left_out(item.nodeid) is None and not any(item.get_closest_marker(m) for m in FAST_MARKERS_LEFT_OUT)


def pytest_ignore_collect(collection_path, config):
    if not _selecting(config):
        return None
    # a whole file left out is not even imported: collecting the convert and kernels files imports
    # litert-torch, JAX and transformers, a minute of the loop on a loaded box
    try:
        rel = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    return True if rel in SLOW_PATHS else None


def pytest_collection_modifyitems(config, items):
    if not _selecting(config):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if _left_out(item.nodeid) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


class ChildProcessInFastLoop(pytest.fail.Exception):
    pass


def _refuse(what: str):
    def refuse(*args, **kwargs):
        shown = args[0] if args else what
        raise ChildProcessInFastLoop(
            f"make test-fast runs no child process, and this test started one ({what}: {shown!r:.200}): "
            "mark the test `slow` or add it to SLOW_PATHS in tests/support/fast_loop.py with the reason",
            pytrace=False)
    return refuse


_GUARDED = (
    (subprocess, "_fork_exec", "subprocess"),  # subprocess.Popen (its own reference to fork_exec)
    (_posixsubprocess, "fork_exec", "multiprocessing"),  # multiprocessing's spawn and forkserver
    (os, "fork", "os.fork"),  # multiprocessing's fork
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_children(_kept(item)):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_children(_kept(item)):
        yield


class _no_children:
    def __init__(self, guarded: bool):
        self.guarded = guarded

    def __enter__(self):
        self.saved = []
        if not self.guarded:
            return
        self.saved = [(mod, name, getattr(mod, name)) for mod, name, _ in _GUARDED if hasattr(mod, name)]
        for mod, name, what in _GUARDED:
            if hasattr(mod, name):
                setattr(mod, name, _refuse(what))
        # Popen takes os.posix_spawn instead of fork_exec for some calls: make it take fork_exec
        self.spawn_flag = subprocess._USE_POSIX_SPAWN
        subprocess._USE_POSIX_SPAWN = False

    def __exit__(self, *exc):
        if not self.guarded:
            return False
        for mod, name, fn in self.saved:
            setattr(mod, name, fn)
        subprocess._USE_POSIX_SPAWN = self.spawn_flag
        return False
