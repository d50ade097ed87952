"""Drafter folders on disk: our native format and the layouts serving engines load.

native.py (ours: save, load, a saved drafter as data), load.py (load any folder: ours, an engine's,
a public reference layout), export.py (write an engine's layout; export_config.py: its settings; model_card.py: the
README.md it writes; hub_upload.py: --push-to-hub), and
one module per engine or layout: vllm.py, sglang.py, tgi.py, speculators.py, deepseek_mtp.py,
eagle_layout.py (the public EAGLE names the engines share), each with what its loader expects
(layout.py), its traps, its writer and its reader.
"""
