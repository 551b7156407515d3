"""Data generators (geometry in closed form with noise 0, noise level, seeding) and the seeded
stratified validation split of the shipped data sets."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.config import config_from_dict
from dlrun.data import split
from dlrun.data import load_data


def gen(name, **kw):
    return registry.data.get(name)(**kw)


def test_moons_geometry():
    ds = gen("moons", samples=101, noise=0.0)
    x, y = ds.x, ds.y
    assert x.shape == (101, 2) and y.dtype == np.int64 and np.bincount(y).tolist() == [50, 51]
    a, b = x[y == 0], x[y == 1]
    np.testing.assert_allclose((a ** 2).sum(1), 1.0)  # upper unit half circle
    assert (a[:, 1] >= -1e-12).all()
    np.testing.assert_allclose(((b - [1.0, 0.5]) ** 2).sum(1), 1.0)  # lower half circle around (1, 0.5)
    assert (b[:, 1] <= 0.5 + 1e-12).all()


def test_moons_noise_level():
    clean, noisy = gen("moons", samples=4000, noise=0.0), gen("moons", samples=4000, noise=0.1, seed=5)
    d = noisy.x - clean.x
    assert d.std() == pytest.approx(0.1, rel=0.05)


def test_circles_geometry():
    ds = gen("circles", samples=200, noise=0.0, factor=0.3)
    r = np.linalg.norm(ds.x, axis=1)
    np.testing.assert_allclose(r[ds.y == 0], 1.0)
    np.testing.assert_allclose(r[ds.y == 1], 0.3)
    assert np.bincount(ds.y).tolist() == [100, 100]


def test_blobs():
    ds = gen("blobs", samples=10, classes=3, features=4, std=0.0, box=2.0, seed=1)
    assert ds.x.shape == (10, 4) and np.bincount(ds.y).tolist() == [4, 3, 3]
    for k in range(3):  # std 0: every point sits on its centre
        pts = ds.x[ds.y == k]
        assert np.ptp(pts, axis=0).max() == 0 and np.abs(pts).max() <= 2.0
    wide = gen("blobs", samples=30000, classes=3, std=0.5, seed=2)
    centres = gen("blobs", samples=3, classes=3, std=0.0, seed=2).x  # same seed: same centres
    for k in range(3):
        pts = wide.x[wide.y == k]
        np.testing.assert_allclose(pts.mean(0), centres[k], atol=0.03)
        assert pts.std(0) == pytest.approx([0.5, 0.5], rel=0.05)


def test_xor():
    ds = gen("xor", samples=500, seed=4)
    assert ((ds.x[:, 0] * ds.x[:, 1] < 0) == (ds.y == 1)).all()
    assert np.abs(ds.x).max() <= 1.0 and 200 < ds.y.sum() < 300


def test_sine_is_regression():
    ds = gen("sine", samples=50, low=-1.0, high=2.0, amplitude=3.0, frequency=2.0, phase=0.5, noise=0.0)
    assert ds.x.shape == (50, 1) and ds.y.shape == (50, 1) and ds.y.dtype == np.float64
    assert ds.num_classes is None
    assert ds.x.min() >= -1.0 and ds.x.max() <= 2.0
    np.testing.assert_allclose(ds.y, 3.0 * np.sin(2.0 * ds.x + 0.5))
    noisy = gen("sine", samples=20000, noise=0.2, seed=1)
    assert (noisy.y - np.sin(noisy.x)).std() == pytest.approx(0.2, rel=0.05)


@pytest.mark.parametrize("name", ["moons", "circles", "blobs", "xor", "sine"])
def test_seeded_and_documented(name):
    a, b, c = gen(name, seed=3), gen(name, seed=3), gen(name, seed=4)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)
    assert a.x.dtype == np.float64
    assert all(o.doc for o in registry.data.options(name))


def test_split_is_a_seeded_stratified_partition():
    y = np.repeat(np.arange(3), [50, 30, 20])
    idx = np.arange(100)[:, None]
    xt, yt, xv, yv = split(idx, y, 0.2, seed=11)
    assert np.bincount(yv).tolist() == [10, 6, 4] and np.bincount(yt).tolist() == [40, 24, 16]
    assert sorted(np.concatenate([xt, xv]).ravel().tolist()) == list(range(100))
    again = split(idx, y, 0.2, seed=11)[2]
    other = split(idx, y, 0.2, seed=12)[2]
    assert np.array_equal(xv, again) and not np.array_equal(xv, other)


@pytest.mark.parametrize("data,n,val", [({"type": "iris"}, 150, 30), ({"type": "digits", "flatten": True}, 1797, 359)])
def test_shipped_sets_split_stratified_through_the_config(data, n, val):
    raw = {"data": data, "model": [{"type": "Linear", "units": 10}], "loss": "SoftmaxCrossEntropy",
           "optimizer": "SGD", "seed": 5, "train": {"validation_split": 0.2}}
    ds = load_data(config_from_dict(raw))
    full = registry.data.build(data)
    assert len(ds.x) + len(ds.x_val) == n and len(ds.x_val) == val
    counts = np.bincount(full.y)
    held = np.bincount(ds.y_val, minlength=len(counts))
    assert held.sum() == round(n * 0.2)  # the fraction of the whole, as asked
    assert np.all(held >= np.floor(counts * 0.2)) and np.all(held <= np.ceil(counts * 0.2))  # each class its share
    assert np.array_equal(load_data(config_from_dict(raw)).x_val, ds.x_val)
    raw["seed"] = 6
    assert not np.array_equal(load_data(config_from_dict(raw)).x_val, ds.x_val)
