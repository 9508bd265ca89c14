"""Everything about the weights: loading, checkpoints, the pointer head, tiny test models."""
