"""dlrun: train, gradient-check and use hand-written layers from declarative YAML configs."""

__version__ = "0.1.0"
