"""A target update's effect on a drafter: the update itself (target_update.py: `draftheads update-target`), how far
the target moved (target_shift.py), the drafter measured on both (drift.py: `draftheads drift`) and the served
acceptance watched (acceptance_monitor.py: the retrain rule, `draftheads monitor`); the settings of drift and
update-target (drift_config.py)."""
