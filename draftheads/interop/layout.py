"""What a serving engine's loader expects from a draft-head folder, written down as data.

Each engine module (vllm.py, sglang.py, tgi.py, speculators.py, deepseek_mtp.py) lists its
`LAYOUTS`: read from the loaders' source (not copied), late 2026, each naming the files and
commits it was read from (`read_from`) and the ways that loader fails *silently* (`traps`), which
the module's writer must avoid. A drafter that reads the target's hidden states at chosen layers
(EAGLE-3, P-EAGLE, DFlash) is served only where the engine's model class for the target hands them
out: such layouts list those target model_types (`targets`). Shapes use symbols: H hidden size,
V target vocabulary, Vd draft vocabulary, I MLP width, Q = heads * head_dim, KV = kv_heads *
head_dim, D = head_dim; "2H" = 2 * H. Key patterns use {h} (Medusa head), {l} (layer inside a
head), {k} (MTP module, counted from the target's last layer). A tensor with `when` is present
only if that feature is on (see `FEATURES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FEATURES = {
    "qkv_bias": "the draft layer's q/k/v projections carry biases (Qwen2 family)",
    "o_bias": "the draft layer's o_proj carries a bias",
    "qk_norm": "per-head RMSNorm on q and k (Qwen3 family)",
    "own_lm_head": "each Medusa head has its own lm head (else the target's is shared)",
}

VLLM = "vllm-project/vllm"
SGLANG = "sgl-project/sglang"
TGI = "huggingface/text-generation-inference"
SPECULATORS = "vllm-project/speculators"
# each head kind as people write it
LABELS = {"eagle3": "EAGLE-3", "eagle": "EAGLE", "medusa": "Medusa", "medusa2": "Medusa-2", "mtp": "MTP",
          "dflash": "DFlash", "dspark": "DSpark", "peagle": "P-EAGLE", "native": "native MTP",
          "assistant": "Gemma 4 assistant"}


@dataclass(frozen=True)
class Tensor:
    key: str
    shape: tuple[str, ...]
    dtype: str = "float"  # "float" (the export dtype), "int64" or "bool"
    when: str | None = None


@dataclass(frozen=True)
class LoaderFile:
    """A loader source file a layout was read from: repository, path, commit (or package version)."""

    repo: str
    path: str
    version: str


@dataclass(frozen=True)
class Layout:
    """One head kind as one engine loads it."""

    format: str  # our --format name
    kind: str  # medusa | medusa-own | eagle | eagle3 | mtp
    engine: str
    weights_file: str
    architectures: tuple[str, ...] | None  # None: config.json must NOT carry "architectures"
    config: dict  # config.json field -> what it must hold
    tensors: tuple[Tensor, ...]
    read_from: tuple[LoaderFile, ...]
    families: tuple[str, ...] = ()  # target model_types the layer can express; () = any
    # target model_types whose engine model class hands out the hidden states the drafter reads; () = any
    targets: tuple[str, ...] = ()
    traps: tuple[str, ...] = field(default=())
