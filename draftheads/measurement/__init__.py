"""What an evaluation and the cost model's calibration both run: the drafters under test (drafter_specs.py,
entries.py), the prompts as conversations (conversations.py) and the interleaved, timed generations (measure.py)."""
