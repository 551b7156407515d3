import pytest

from dlrun import registry
from dlrun.errors import ConfigError, ConfigErrors
from dlrun.registry import Registry, RegistryError


def test_every_kind_is_populated():
    for kind, reg in registry.REGISTRIES.items():
        assert reg.names(), kind
    assert {"Linear", "ReLU", "LeakyReLU", "Sigmoid", "Tanh", "Softmax"} <= set(registry.layers.names())
    assert {"zeros", "constant", "uniform", "normal", "xavier_uniform", "xavier_normal",
            "he_uniform", "he_normal"} <= set(registry.initializers.names())
    assert {"SoftmaxCrossEntropy", "MSE"} <= set(registry.losses.names())
    assert {"L1", "L2"} <= set(registry.regularizers.names())
    assert {"SGD", "Adam"} <= set(registry.optimizers.names())
    assert {"spiral", "file"} <= set(registry.data.names())


def test_duplicate_name_is_rejected():
    r = Registry("thing", "things")

    @r.register("a")
    class A:
        pass

    with pytest.raises(RegistryError, match="already registered"):
        @r.register("a")
        class B:
            pass


def test_var_keyword_constructor_is_rejected():
    r = Registry("thing", "things")
    with pytest.raises(RegistryError, match="explicit keyword"):
        @r.register()
        class C:
            def __init__(self, **kwargs):
                pass


def test_an_option_without_a_type_hint_is_rejected_with_the_fix():
    """Unhinted, `times: 2.0` or `times: abc` reached the layer unchecked and failed in forward."""
    r = Registry("thing", "things")
    with pytest.raises(RegistryError, match="thing 'C': option 'times' has no type hint, so a config value could not "
                                            "be checked; write it as times: int = 2"):
        @r.register()
        class C:
            def __init__(self, times=2):
                pass
    with pytest.raises(RegistryError, match="write it as rate: float = 0.5"):
        @r.register()
        class D:
            def __init__(self, rate=0.5):
                pass


def test_unknown_name_suggests_and_lists():
    with pytest.raises(ConfigError) as e:
        registry.layers.build("Linaer", "model[0]")
    msg = str(e.value)
    assert "did you mean Linear?" in msg and "valid layers:" in msg and "model[0]" in msg


def test_option_errors_are_collected_with_paths():
    with pytest.raises(ConfigErrors) as e:
        registry.layers.build({"type": "Linear", "unit": 3, "use_bias": "yes"}, "model[1]")
    msgs = [str(x) for x in e.value.errors]
    assert any("model[1].unit" in m and "did you mean units?" in m for m in msgs)
    assert any("model[1].use_bias" in m and "expected true or false" in m for m in msgs)
    assert any("needs option 'units'" in m for m in msgs)


@pytest.mark.parametrize("units,expected", [("ten", "expected a positive integer, got 'ten'"),
                                            (0, "expected a positive integer, got 0"),
                                            (2.5, "expected a positive integer, got 2.5")])
def test_wrong_type_and_range(units, expected):
    with pytest.raises(ConfigError, match=expected):
        registry.layers.build({"type": "Linear", "units": units}, "model[2]")


def test_nested_component_options_are_checked():
    with pytest.raises(ConfigError, match=r"model\[0\]\.weight_initializer: unknown initializer 'he_normel' \(did you mean he_normal"):
        registry.layers.build({"type": "Linear", "units": 2, "weight_initializer": "he_normel"}, "model[0]")
    lin = registry.layers.build({"type": "Linear", "units": 2,
                                 "weight_initializer": {"type": "uniform", "low": -1, "high": 1}})
    assert lin.weight_initializer.low == -1.0


def test_constructor_value_error_becomes_config_error():
    with pytest.raises(ConfigError, match="nesterov: true needs momentum > 0"):
        registry.optimizers.build({"type": "SGD", "nesterov": True}, "optimizer")


def test_options_expose_types_defaults_and_docs():
    opts = {o.name: o for o in registry.layers.options("Linear")}
    assert opts["units"].required and opts["units"].type_name == "a positive integer"
    assert opts["use_bias"].default is True
    assert "output features" in opts["units"].doc


def test_list_option_types_read_as_plurals():
    # the plural goes on the noun, before the range: not "a list of 2 integer >= 0s"
    opts = {o.name: o for o in registry.layers.options("MaxPool2D")}
    assert opts["padding"].type_name == "an integer >= 0 or a list of 2 integers >= 0"
    assert opts["pool_size"].type_name == "a positive integer or a list of 2 positive integers"
    with pytest.raises(ConfigError, match=r"expected an integer >= 0 or a list of 2 integers >= 0, got -1"):
        registry.layers.build({"type": "MaxPool2D", "padding": -1}, "model[1]")


def test_repr_shows_options_as_the_component_received_them():
    layer = registry.layers.build({"type": "Linear", "units": 8.0})  # YAML's 8.0 is a whole number
    assert layer.units == 8 and repr(layer).startswith("Linear(units=8") and "8.0" not in repr(layer)


def test_an_unknown_name_nothing_resembles_suggests_naming_the_plugin_file():
    with pytest.raises(ConfigError) as e:
        registry.layers.get("Quantize")
    assert "unknown layer 'Quantize' (a layer of your own? name its file with --plugin FILE.py" in e.value.message
    with pytest.raises(ConfigError) as e:  # a near miss gets the did-you-mean alone
        registry.layers.get("Relu")
    assert "did you mean ReLU?" in e.value.message and "of your own" not in e.value.message
