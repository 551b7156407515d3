import numpy as np
import pytest

from conftest import write
from dlrun import registry
from dlrun.data import split
from dlrun.errors import ConfigError, DataError


def test_spiral_follows_the_cs231n_construction():
    ds = registry.data.build({"type": "spiral", "classes": 3, "points_per_class": 50, "noise": 0.0})
    assert ds.x.shape == (150, 2) and ds.num_classes == 3
    r = np.linspace(0, 1, 50)
    t = np.linspace(4, 8, 50)  # class 1, no noise
    np.testing.assert_allclose(ds.x[50:100], np.c_[r * np.sin(t), r * np.cos(t)])
    assert (ds.y == np.repeat([0, 1, 2], 50)).all()


def test_spiral_is_seeded():
    a = registry.data.build({"type": "spiral", "seed": 1}).x
    b = registry.data.build({"type": "spiral", "seed": 1}).x
    c = registry.data.build({"type": "spiral", "seed": 2}).x
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_split_is_seeded_stratified_and_complete():
    x = np.arange(100.0)[:, None]
    y = np.repeat([0, 1], [80, 20])
    xt, yt, xv, yv = split(x, y, 0.25, seed=0)
    assert len(xv) == 25 and np.bincount(yv).tolist() == [20, 5]
    assert sorted(np.r_[xt[:, 0], xv[:, 0]]) == list(range(100))
    assert np.array_equal(split(x, y, 0.25, seed=0)[2], xv)
    with pytest.raises(DataError, match="leaves no validation data"):
        split(x[:3], y[:3], 0.1, seed=0)


@pytest.mark.parametrize("fraction,held", [(0.2, 6), (0.1, 3), (0.5, 15), (0.9, 20)])
def test_a_stratified_split_holds_out_the_fraction_of_the_whole(fraction, held):
    """10 classes of 3: the shares (0.6 of a sample each at 0.2) are rounded as a whole (largest
    remainder, ties in seeded order), not class by class (which held out 10 at 0.2 and nothing
    at 0.1); at 0.9 every class keeps one training sample, so 20 of 27 go."""
    y = np.repeat(np.arange(10), 3)
    x = np.arange(30)[:, None]
    _, yt, _, yv = split(x, y, fraction, seed=3)
    per_class = np.bincount(yv, minlength=10)
    assert len(yv) == held and per_class.max() - per_class.min() <= 1 and np.bincount(yt, minlength=10).min() >= 1
    assert not np.array_equal(split(x, y, fraction, seed=4)[3], yv) or fraction == 0.9  # ties drawn by the seed


def test_what_tiny_classes_cannot_give_the_others_give():
    """Classes of 100, 2, 2, 2, 2, 2 at 0.9: the five small ones give 1 each (their last training
    sample stays), and the large one gives the rest of round(110 × 0.9) = 99 (it gave 91, 96 in all)."""
    y = np.repeat(np.arange(6), [100, 2, 2, 2, 2, 2])
    _, yt, _, yv = split(np.arange(110)[:, None], y, 0.9, seed=0)
    assert len(yv) == 99 and np.bincount(yv).tolist() == [94, 1, 1, 1, 1, 1] and np.bincount(yt).min() == 1


def test_a_split_that_would_take_a_class_s_last_sample_says_so():
    with pytest.raises(DataError, match="stratified, and no class gives up its last training sample"):
        split(np.arange(3.0)[:, None], np.array([0, 1, 2]), 0.5, seed=0)


def test_csv_with_and_without_header(tmp_path):
    a = write(tmp_path / "a.csv", "f1,f2,label\n1,2,0\n3,4,1\n")
    b = write(tmp_path / "b.csv", "1,2,0\n3,4,1\n")
    for p in (a, b):
        ds = registry.data.build({"type": "file", "path": str(p)})
        assert ds.x.tolist() == [[1, 2], [3, 4]] and ds.y.tolist() == [0, 1] and ds.y.dtype == np.int64
    first = registry.data.build({"type": "file", "path": str(b), "label_column": 0})
    assert first.y.tolist() == [1, 3]


def test_npy_and_npz(tmp_path):
    np.save(tmp_path / "d.npy", np.array([[1.0, 2.0, 1.0], [3.0, 4.0, 0.0]]))
    np.savez(tmp_path / "d.npz", x=np.ones((4, 3)), y=np.array([0, 1, 1, 0]))
    assert registry.data.build({"type": "file", "path": str(tmp_path / "d.npy")}).y.tolist() == [1, 0]
    assert registry.data.build({"type": "file", "path": str(tmp_path / "d.npz")}).x.shape == (4, 3)
    reg = registry.data.build({"type": "file", "path": str(tmp_path / "d.npy"), "task": "regression"})
    assert reg.y.dtype == np.float64


@pytest.mark.parametrize("text,message", [
    ("1,2,0\n3,x,1\n", r"x.csv:2: column 2: expected a number, got 'x'"),
    ("1,2,0\n3,1\n", r"x.csv:2: expected 3 columns \(as in line 1\), got 2"),
    ("1,2,0.5\n", r"x.csv:1: class labels must be integers from 0 to 2147483647, got 0.5"),
])
def test_bad_csv_files_name_the_row(tmp_path, text, message):
    p = write(tmp_path / "x.csv", text)
    with pytest.raises(DataError, match=message):
        registry.data.build({"type": "file", "path": str(p)})


def test_missing_file():
    with pytest.raises(DataError, match="data file not found: nowhere.csv"):
        registry.data.build({"type": "file", "path": "nowhere.csv"})


def test_shipped_iris_and_digits():
    iris = registry.data.build("iris")
    assert iris.x.shape == (150, 4) and np.bincount(iris.y).tolist() == [50, 50, 50]
    d = registry.data.build("digits")
    assert d.x.shape == (1797, 1, 8, 8) and d.x.max() == 1.0 and d.num_classes == 10
    assert registry.data.build({"type": "digits", "flatten": True}).x.shape == (1797, 64)


def test_a_data_path_that_is_not_a_regular_file_says_so(tmp_path):
    from dlrun.data.files import load_file
    from dlrun.errors import DataError

    with pytest.raises(DataError, match=r"data file not found: /dev/null \(not a regular file\)"):
        load_file("/dev/null")


def test_a_csv_that_is_not_utf8_names_its_line(tmp_path):
    # it said "cannot read the file: 'utf-8' codec can't decode byte 0xff in position 18"
    from dlrun.data.files import load_file

    path = tmp_path / "latin1.csv"
    path.write_bytes(b"a,b,label\n1,2,0\n3,\xff4,1\n")
    with pytest.raises(DataError, match=r"latin1.csv:3: not UTF-8 text \(byte 0xff at column 3\)"):
        load_file(path)


def test_a_csv_with_a_byte_order_mark_reads_like_one_without(tmp_path):
    from dlrun.data.files import load_file

    (tmp_path / "plain.csv").write_bytes(b"1,2,0\n3,4,1\n")
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf1,2,0\n3,4,1\n")  # as spreadsheets save "CSV UTF-8"
    plain, bom = load_file(tmp_path / "plain.csv"), load_file(tmp_path / "bom.csv")
    assert np.array_equal(plain.x, bom.x) and np.array_equal(plain.y, bom.y)


def test_split_seed_fixes_the_validation_set_across_run_seeds():
    from dlrun.config import config_from_dict
    from dlrun.data import load_data

    def val(seed, split_seed=None):
        train = {"validation_split": 0.2, **({} if split_seed is None else {"split_seed": split_seed})}
        raw = {"data": {"type": "iris"}, "model": [{"type": "Linear", "units": 3}], "loss": "SoftmaxCrossEntropy",
               "optimizer": "SGD", "seed": seed, "train": train}
        return load_data(config_from_dict(raw)).x_val

    assert not np.array_equal(val(1), val(2))  # by default the run seed draws the split
    assert np.array_equal(val(1, 7), val(2, 7))
    assert np.array_equal(val(7), val(3, 7))  # split_seed: 7 is the split seed 7 would draw
    with pytest.raises(ConfigError, match="train.split_seed"):
        val(1, -1)
