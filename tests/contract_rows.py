"""One row per registered layer: extra options for the contract test (beyond its input_spec).

Every layer in the registry must have a row (test_contract.py's guard fails otherwise). Add a
row when you add a layer: ``"MyLayer": {}`` or ``"MyLayer": {"option": value}``.
"""

ROWS: dict[str, dict] = {
    # core
    "Linear": {},
    "ReLU": {},
    "LeakyReLU": {"slope": 0.1},
    "Sigmoid": {},
    "Tanh": {},
    "Softmax": {},
    # seeds (issue #3)
    "LargeMarginFC": {"k": 0.3},
    "LSoftmax": {"margin": 4, "beta": 1.0},
    "ReQU": {},
    "MultiplyByTwo": {},
    "MinMaxNormalization": {},
    "NormalizedDense": {"scales": [-1.5]},
    # catalogue (issue #5); options beyond these come from each layer's input_spec
    "Conv2D": {"filters": 2, "kernel_size": 3, "stride": 2, "padding": 1, "dilation": 1},
    "MaxPool2D": {"pool_size": 2, "stride": 1},
    "AvgPool2D": {"pool_size": 2, "stride": 1},
    "GlobalAvgPool2D": {},
    "Flatten": {},
    "Reshape": {"target_shape": [-1]},
    "BatchNorm": {},
    "LayerNorm": {"axes": 2},
    "Dropout": {"rate": 0.5},
    "ELU": {"alpha": 1.0},
    "GELU": {},
    "Softplus": {"beta": 2.0},
    "LogSoftmax": {},
    "Embedding": {},
    # recurrent
    "SimpleRNN": {"return_sequences": True},
    "LSTM": {},
    "GRU": {"return_sequences": True},
    # attention and sequences
    "MultiHeadAttention": {"causal": True, "dropout": 0.25},
    "PositionalEmbedding": {},
    "SequencePool": {},
    # several inputs (checked with their values side by side as one input)
    "Add": {},
    "Multiply": {},
    "Concatenate": {"axis": 0},
    "Slice": {"start": 1, "stop": -1, "axis": -1},
}
