"""Speculative decoding itself: the generation loop (generate.py, decoder.py) and its settings (settings.py:
DecodeSettings), tree verification (verify.py, tree_tensors.py), the acceptance rules (accept.py), prompt lookup
(lookup.py) and its combination with a learned drafter (combined.py, gate.py), and the statistics every generation
keeps (stats.py)."""
