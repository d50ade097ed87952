"""Measuring drafters: `draftheads eval` (evaluate.py: its settings in eval_config.py and presets.py, the target and
drafters read back in saved_runs.py), its rows and report (results.py, summary.py, report.py, plots.py,
report_folder.py), `draftheads profile` (profile_report.py), and drafters measured inside a serving engine
(engine_eval.py, engine_report.py)."""
