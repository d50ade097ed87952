"""The settings of `draftheads export` beyond what and where (ExportConfig), checked here. Plain Python, no torch: the
CLI builds their flags from these fields."""

from __future__ import annotations

import re
from dataclasses import dataclass

from draftheads.core.config import check, doc

# a hub repository id: owner/name, letters, digits, '-', '_' and '.', no '--' or '..' (the hub's rules)
HUB_REPO = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


@dataclass
class ExportConfig:
    """What an export writes beside the weights, and where it is published (`draftheads export`'s setting flags)."""

    speculative_tokens: int | None = doc(None, "draft length written where the engine's config takes one (None: the "
                                               "length the drafter was trained for)", flag="--speculative-tokens")
    eval_report: str | None = doc(None, "the draftheads eval report (its folder or report.json) whose tau the model "
                                        "card gives (None: the newest eval-* report in the drafter's run folder that "
                                        "measured it)", flag="--eval-report", metavar="PATH")
    push_to_hub: str | None = doc(None, "upload the export folder to this Hugging Face model repository, created if "
                                        "new (needs a token: HF_TOKEN or `hf auth login`)", flag="--push-to-hub",
                                  metavar="OWNER/NAME")
    private: bool = doc(False, "make the repository --push-to-hub creates private", flag="--private")

    def __post_init__(self):
        check(self.speculative_tokens is None or self.speculative_tokens >= 1,
              f"--speculative-tokens must be a whole number >= 1, got {self.speculative_tokens}; leave it out for the "
              "length the drafter was trained for")
        check(self.push_to_hub is None or HUB_REPO.fullmatch(self.push_to_hub) is not None,
              f"--push-to-hub '{self.push_to_hub}' is not a hub repository id; give OWNER/NAME (letters, digits, '-', "
              "'_', '.'), e.g. you/eagle3-llama3.1-8b")
        check(not self.private or self.push_to_hub is not None,
              "--private applies to the repository --push-to-hub creates; add --push-to-hub OWNER/NAME or leave "
              "--private out")
