"""The bottom layer: what every other package shares and nothing here imports from them.

errors (the one-line user error), config (self-validating dataclasses from YAML), tree (draft-tree
shapes and the one tree-spec parser), sampling (warping and drawing), drafter (the Drafter and
TrainableDrafter protocols, Proposal), folders (atomic folder writes), run_folder (the layout of a
training run on disk), targets (where a target spec points, the embedded default included). See
ARCHITECTURE.md for the layer order.
"""
