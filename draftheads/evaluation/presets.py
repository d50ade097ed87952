"""The field's reporting settings as named presets (`draftheads eval --preset NAME`, `eval.preset`), so that a row of
our table means what a row of theirs means: the same draft shape, greedy, temperature 0, one sequence at a time.

    tree = PRESETS["specbundle-4"].tree    # 'chain:3'

Their token counts include the token the target verifies anyway (SGLang's --speculative-num-draft-tokens, EAGLE's
total_token); our trees count drafted nodes only, so 4 tokens are a chain of 3 drafts. tau is the same quantity in
all three: tokens per target forward, the bonus token included (SGLang's avg_spec_accept_length, EAGLE's accept
length + 1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    tree: str
    what: str   # where the setting comes from, as its authors write it


PRESETS = {
    "specbundle-4": Preset("chain:3", "SpecForge's SpecBundle tables and model cards: --speculative-num-steps 3 "
                                      "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"),
    "specbundle-8": Preset("chain:7", "SpecForge's SpecBundle, the longer chain: --speculative-num-steps 7 "
                                      "--speculative-eagle-topk 1 --speculative-num-draft-tokens 8"),
    # EAGLE's topK_genrate drafts one level of top_k, then `depth` more, and keeps total_token - 1 drafted nodes
    "eagle": Preset("dynamic:10,6,59", "EAGLE-2/EAGLE-3's evaluation scripts (gen_ea_answer_*.py): --total-token 60 "
                                       "--depth 5 --top-k 10, temperature 0"),
}
PRESET_ACCEPT = ["greedy"]
PRESET_TEMPERATURES = [0.0]
PRESET_BATCH_SIZES = [1]
