"""draftheads: train speculative-decoding draft heads (Medusa, EAGLE, MTP) on a frozen target.

Public API:
    load_target(spec, **opts) -> (model, tokenizer)
    build_drafter(head_type, target, **cfg)
    load_drafter(path, target)
    speculative_generate(target, drafter, input_ids, ...)
"""

from draftheads.api import build_drafter, load_drafter, load_target, speculative_generate
from draftheads.errors import DraftheadsError

__version__ = "0.1.0"
__all__ = ["load_target", "build_drafter", "load_drafter", "speculative_generate", "DraftheadsError", "__version__"]
