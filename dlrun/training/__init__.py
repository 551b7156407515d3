"""Training: the trainer's loop, its one training step and what observes it (the first step's
checks, the non-finite guard), the training controls and the metric they monitor, and where a
run's state stands inside an epoch."""
