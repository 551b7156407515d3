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
}
