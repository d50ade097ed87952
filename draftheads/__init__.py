"""draftheads: train speculative-decoding drafters (Medusa, Medusa-2, EAGLE, EAGLE-3, MTP, DFlash, P-EAGLE) on a
frozen target.

Public API:
    load_target(spec, **opts) -> (model, tokenizer)
    build_drafter(head_type, target, **cfg)
    load_drafter(path, target)
    speculative_generate(target, drafter, input_ids, ...)

The package's layers and the direction they import in are written down in ARCHITECTURE.md.
"""

from draftheads.core.errors import DraftheadsError
from draftheads.core.version import __version__

API = ("load_target", "build_drafter", "load_drafter", "speculative_generate")
__all__ = [*API, "DraftheadsError", "__version__"]


def __getattr__(name: str):
    # The API imports torch and transformers (seconds); `import draftheads` and `draftheads --help` stay instant.
    if name in API:
        from draftheads import api

        return getattr(api, name)
    raise AttributeError(f"module 'draftheads' has no attribute {name!r}")
