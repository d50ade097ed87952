"""Target loading, target-generated data, the Accelerate training loop, losses, checkpoints."""
