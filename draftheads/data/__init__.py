"""What training data is made of, and the target that makes it: loading the frozen target (target.py,
hardware.py), chat templates (chat.py), prompt sources and task kinds (prompts.py, task_kinds.py), and
`draftheads data` (datagen.py, datastore.py) with its backends (batch_generate.py, openai_backend.py)."""
