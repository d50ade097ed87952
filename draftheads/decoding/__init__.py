"""Speculative decoding itself: the generation loop (generate.py, decoder.py), tree verification (verify.py),
the acceptance rules (accept.py), prompt lookup (lookup.py) and its combination with a learned drafter
(combined.py, gate.py), and the statistics every generation keeps (stats.py)."""
