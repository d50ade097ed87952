"""The Accelerate training loop (setup.py, loop.py), batches and cached features (batches.py, features.py),
checkpoints (checkpoint.py), metrics and trackers."""
