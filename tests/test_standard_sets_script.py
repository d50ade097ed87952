"""benchmarks/standard_sets.py's plan: which drafters run at which preset, checked before the first run."""

import draftheads
from benchmarks import standard_sets
from draftheads.interop.native import save_drafter


def test_a_drafter_too_shallow_for_a_preset_is_left_out_of_it_with_the_reason():
    drafters = ["lookup", "runs/eagle3", "runs/dflash-b4", "runs/dflash-b4+lookup-switch"]
    limits = {"lookup": None, "runs/eagle3": 16, "runs/dflash-b4": 3, "runs/dflash-b4+lookup-switch": 3}
    assert standard_sets.fitting(drafters, limits, "specbundle-4") == (drafters, {})
    kept, skipped = standard_sets.fitting(drafters, limits, "specbundle-8")
    assert kept == ["lookup", "runs/eagle3"]
    assert skipped == {"runs/dflash-b4": "drafts at most 3 levels, specbundle-8 is 7 deep",
                       "runs/dflash-b4+lookup-switch": "drafts at most 3 levels, specbundle-8 is 7 deep"}


def test_draft_limits_read_our_folders_without_loading_the_target(tmp_path, llama_target, monkeypatch):
    save_drafter(draftheads.build_drafter("dflash", llama_target, block_size=4), tmp_path / "b4", llama_target)
    save_drafter(draftheads.build_drafter("medusa", llama_target, num_heads=2), tmp_path / "m2", llama_target)

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded to read a native drafter's depth")

    monkeypatch.setattr(standard_sets, "load_eval_target", no_target)
    specs = ["lookup", str(tmp_path / "b4"), f"{tmp_path / 'm2'}+lookup-switch"]
    assert standard_sets.draft_limits(specs) == {"lookup": None, specs[1]: 3, specs[2]: 2}
