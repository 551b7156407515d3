"""Runs: assembling a run from its config, training it into a run directory, its checkpoints,
and using a trained model again (predict, evaluate)."""
