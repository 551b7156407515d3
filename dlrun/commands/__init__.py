"""The library side of ``dlrun check`` and ``dlrun time``: one observed training step on a
config's model, reported as data for the CLI to print."""
