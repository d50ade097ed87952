# The README's two commands: `make demo` and `make test`. Both build .venv/ on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch 2.13.0 is pinned for the self-contained venv: on CPU-only machines of this project it is the CPU build.
TORCH  ?= torch==2.13.0

.PHONY: demo test test-fast venv speculators-venv llama-cpp clean

venv: $(VENV)/.installed

# A second environment with the speculators package, whose loader checks every EAGLE-3 export in the tests. It pins
# its own transformers and torch (CPU wheels here), so it cannot share .venv; nothing of draftheads is installed in it.
SPECULATORS_VENV := .venv-speculators
speculators-venv: $(SPECULATORS_VENV)/.installed

$(SPECULATORS_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(SPECULATORS_VENV)
	$(SPECULATORS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SPECULATORS_VENV)/bin/python -m pip install --quiet "$(TORCH)"
	# without --no-deps pip pulls a CUDA torch (6 GB) and torchvision/torchaudio, which loading a drafter never imports
	$(SPECULATORS_VENV)/bin/python -m pip install --quiet --no-deps "speculators==0.9.0" "hs-connectors==0.9.0"
	$(SPECULATORS_VENV)/bin/python -m pip install --quiet "transformers==5.19.0" "datasets>=4.0,<=5.1.0" "numpy>=2.0,<=2.5.4" \
		"tqdm>=4.66.3,<=4.70.1" "loguru>=0.7.2,<=0.7.3" safetensors huggingface-hub pydantic pydantic-settings rich typer \
		click httpx aiohttp openai protobuf psutil
	$(SPECULATORS_VENV)/bin/python -c "import speculators.models, torch; assert not torch.version.cuda"
	touch $@

# llama.cpp built from the llama-cpp-python sdist on PyPI (CMake, CPU backend), once: cached under the user cache folder
# ($$DRAFTHEADS_CACHE/engines/llama.cpp/), keyed by the sdist's sha256 and the CPU's features. The engine tests run it.
llama-cpp: venv
	$(BIN)/draftheads engine install llama.cpp

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	# deepspeed: the tests run ZeRO-2/3 on CPU processes (it compiles one op with g++ on first use, cached in ~/.cache)
	$(BIN)/python -m pip install --quiet -e '.[test,wandb,deepspeed]'
	touch $@

demo: venv
	$(BIN)/draftheads demo

# The tests marked `trains` assert figures that float accumulation order moves; other CPUs pick other kernels (AMX,
# AVX-512, AVX2, none), so they run again as an AVX2-only CPU and as one with no vector kernels (~20 s each).
KERNEL_SETS := "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41"

test: venv speculators-venv llama-cpp
	$(BIN)/python -m pytest -q
	for kernels in $(KERNEL_SETS); do env $$kernels $(BIN)/python -m pytest -q -p no:cacheprovider -m trains || exit 1; done

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) $(SPECULATORS_VENV) build dist *.egg-info
