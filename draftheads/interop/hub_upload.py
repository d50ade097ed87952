"""`draftheads export ... --push-to-hub OWNER/NAME`: the export folder uploaded as a Hugging Face model repository by
huggingface_hub's own `create_repo` and `upload_folder` (large files go through the hub's own transfer).

Checked before any work is done: the network allowed (HF_HUB_OFFLINE unset) and a token (HF_TOKEN, or the one
`hf auth login` stored). An upload that fails leaves the export folder as written and says how to upload it again.
"""

from __future__ import annotations

import os
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError

from draftheads.core.errors import DraftheadsError

# what a failed hub request raises: the bases of the hub's HTTP error (httpx's HTTPError, connection failures
# included, since huggingface_hub 1.0; requests' OSError before), and ValueError for a name the hub refuses
FAILURES = (OSError, ValueError, *HfHubHTTPError.__bases__)
TRUE = ("1", "ON", "YES", "TRUE")


def check_can_push(repo: str) -> None:
    """Refuse --push-to-hub before any work when nothing could be uploaded: offline, or no token."""
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in TRUE:
        raise DraftheadsError(f"--push-to-hub {repo}: HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it, "
                              "or export without --push-to-hub")
    if not huggingface_hub.get_token():
        raise DraftheadsError(f"--push-to-hub {repo}: no Hugging Face token; set HF_TOKEN or run `hf auth login` "
                              "(a token with write access)")


def push_folder(folder: Path, repo: str, private: bool, message: str) -> str:
    """Create `repo` (kept as it is if it exists; `private`: a new one is private) and upload `folder` into it as one
    commit. Returns the repository's address."""
    api = huggingface_hub.HfApi()
    try:
        api.create_repo(repo, private=True if private else None, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message=message)
    except FAILURES as e:
        problem = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DraftheadsError(f"uploading {folder} to the hub repository {repo} failed ({problem}); the export is "
                              f"written: check the token's write access and the name, then run `hf upload {repo} "
                              f"{folder}`") from None
    return f"{constants.ENDPOINT}/{repo}"
