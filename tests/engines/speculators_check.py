"""Load speculators-format folders with the speculators package itself; run by the second virtual environment.

    .venv-speculators/bin/python tests/engines/speculators_check.py FOLDER [FOLDER ...]

speculators pins its own transformers and torch, so it cannot share the main environment; this script imports nothing
of draftheads. For each folder it loads the model class of its speculators_model_type (eagle3: Eagle3DraftModel,
peagle: PEagleDraftModel, dflash: DFlashDraftModel, dspark: DSparkDraftModel, mtp: MTPDraftModel) with
`from_pretrained` (which fills every weight it did not find with NaN), then checks that every floating-point parameter
is finite and every tensor of the
folder's model.safetensors equals the loaded model's. It prints one JSON object per folder: {"folder", "ok",
"problems"}.
"""

import json
import sys

import torch
from safetensors.torch import load_file


def check(folder: str) -> dict:
    from speculators.models import DFlashDraftModel, Eagle3DraftModel, PEagleDraftModel
    from speculators.models.dspark import DSparkDraftModel
    from speculators.models.mtp import MTPDraftModel

    with open(f"{folder}/config.json") as f:
        kind = json.load(f)["speculators_model_type"]
    problems = []
    try:
        model_class = {"eagle3": Eagle3DraftModel, "peagle": PEagleDraftModel, "dflash": DFlashDraftModel,
                       "dspark": DSparkDraftModel, "mtp": MTPDraftModel}[kind]
        model = model_class.from_pretrained(folder)
    except Exception as e:  # noqa: BLE001 - whatever the loader raises is the finding
        return {"folder": folder, "ok": False, "problems": [f"from_pretrained raised {type(e).__name__}: {e}"]}
    loaded = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, tensor in loaded.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            problems.append(f"{name} is not finite (not loaded)")
    for key, value in load_file(f"{folder}/model.safetensors").items():
        if key not in loaded:
            problems.append(f"{key} of the folder is not a tensor of the model")
        elif not torch.equal(loaded[key].to(value.dtype), value):
            problems.append(f"{key} differs from the folder's")
    return {"folder": folder, "ok": not problems, "problems": problems,
            "layer_class": type(model.layers[0]).__name__ if hasattr(model, "layers") else None}


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(json.dumps(check(path)), flush=True)
