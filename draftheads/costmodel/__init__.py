"""The cost model: the machine's cost profiles (profile.py, batch_profile.py), the speedup predicted from them
(cost_model.py, forecast.py, earlier_report.py: tau from an earlier evaluation), and what an evaluation fits on its
calibration prompts (calibration.py: automatic trees, auto_tree.py, and gate prices)."""
