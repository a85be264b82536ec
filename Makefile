PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WEB := convert/web
WEB_STAMP := $(WEB)/node_modules/.installed

.PHONY: demo test lint install browser clean

# Reinstall only when the dependency spec changed.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -c constraints.txt -e '.[test]'
	touch $(STAMP)

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

install: $(STAMP) browser

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

# Import layers (pyproject [tool.importlinter]); a violation fails `make test`.
lint: $(STAMP)
	$(BIN)/python -m tpu_pipeline.testing.layers

test: install lint
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) dist build *.egg-info $(WEB)/node_modules
