"""Measuring drafters: `draftheads eval` (evaluate.py and the modules it is split into), the report (report.py,
plots.py), the machine's cost profile and the predictions made from it (profile.py, cost_model.py), automatic
trees, and drafters measured inside a serving engine (engine_eval.py)."""
