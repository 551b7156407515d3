"""The block parsers of CSV files (pyarrow's reader, numpy.loadtxt) against the row-by-row scan
with Python's csv module: the same arrays and line numbers on every file the fast path takes,
the same one-line error on every file it does not."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import write
from dlrun.data import fastcsv
from dlrun.data.files import _read_fast, load_file, read_csv
from dlrun.errors import DataError
from dlrun.registry.options import OptionError

PARSERS = ["numpy"] + (["pyarrow"] if fastcsv.have_pyarrow() else [])


def outcome(path, parser, label_column=-1, header=None, delimiter=","):
    try:
        x, y, lines = read_csv(path, label_column, header, delimiter, parser)
    except DataError as e:
        return str(e)
    return x, y, lines


def assert_same(got, want):
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        if a.dtype.kind == "f":
            assert np.array_equal(np.signbit(a), np.signbit(b))  # -0.0 stays -0.0


NUMBER = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda v: f"{v:.6e}"),
    st.floats(-1e6, 1e6).map(lambda v: f"{v:+.3f}"),
    st.floats(-1e6, 1e6).map(lambda v: f"{v:g}".upper()),
    st.integers(-10 ** 20, 10 ** 20).map(str),
    st.integers(0, 9).map(str),
    st.sampled_from(["nan", "-inf", "Infinity", "1e400", "-1e-400", "-0", "+.5", "5.", "00012", "4.9e-324",
                     " 1", "2 ", "  3", " -4.5e+01 ", "NaN", "INF"]),
)
ODD = st.sampled_from(["", " ", "x", "1.5.2", '"3"', '" 4.5"', "1_000", "\u0661", "1e", "0x10", "1,5".replace(",", ";"),
                       "#1", "1\x0b"])


@st.composite
def csv_files(draw):
    """(bytes of a CSV file, whether the block parsers should take it)."""
    width = draw(st.integers(1, 5))
    n = draw(st.integers(1, 12))
    odd = draw(st.booleans()) and draw(st.integers(0, 4)) == 0  # about one file in ten has a flaw
    rows = [[draw(NUMBER) for _ in range(width)] for _ in range(n)]
    if odd:
        kind = draw(st.sampled_from(["cell", "ragged", "blank", "quoted", "cr"]))
        r = draw(st.integers(0, n - 1))
        if kind == "cell":
            rows[r][draw(st.integers(0, width - 1))] = draw(ODD)
        elif kind == "ragged":
            rows[r] = rows[r][:-1] if width > 1 else rows[r] + ["1"]
        elif kind == "blank":
            rows.insert(r, [""] if draw(st.booleans()) else [" "])
        elif kind == "quoted":
            rows[r][0] = f'"{rows[r][0].strip()}"'
    label = draw(st.integers(0, 9))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    delimiter = draw(st.sampled_from([",", ",", ";", "\t", "|"]))
    lines = [delimiter.join(r + [str(label)]) for r in rows]
    if odd and kind == "cr":
        eol = "\r"
    header = draw(st.booleans())
    if header:
        lines.insert(0, delimiter.join([f"f{j}" for j in range(width)] + ["label"]))
    text = eol.join(lines) + (eol if draw(st.booleans()) else "")
    raw = text.encode()
    if draw(st.booleans()):
        raw = b"\xef\xbb\xbf" + raw
    return raw, not odd, delimiter


@pytest.mark.parametrize("parser", PARSERS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=csv_files(), label_column=st.sampled_from([-1, 0, 1, None]))
def test_the_block_parsers_give_what_the_exact_scan_gives(tmp_path, parser, drawn, label_column):
    raw, plain, delimiter = drawn
    path = tmp_path / "d.csv"
    path.write_bytes(raw)
    want = outcome(path, "python", label_column, delimiter=delimiter)
    assert_same(outcome(path, parser, label_column, delimiter=delimiter), want)
    if plain and not isinstance(want, str):  # the fast path takes ordinary numeric files
        assert _read_fast(path, delimiter, None, parser) is not None, raw


def test_a_plain_file_never_reaches_the_exact_scan(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 7))
    y = rng.integers(0, 4, 3000)
    path = tmp_path / "big.csv"
    with open(path, "w") as f:
        f.write("a,b,c,d,e,f,g,label\r\n")
        np.savetxt(f, np.column_stack([x, y]), fmt=["%.17g"] * 7 + ["%d"], delimiter=",", newline="\r\n")
    monkeypatch.setattr(fastcsv, "BLOCK", 4096)  # many blocks, each cut inside a line
    monkeypatch.setattr("dlrun.data.files.read_rows", None)  # calling it would raise TypeError
    for parser in PARSERS:
        got_x, got_y, lines = read_csv(path, -1, None, ",", parser)
        assert np.array_equal(got_x, x) and np.array_equal(got_y, y)  # %.17g: every float64 round trips
        assert lines.tolist() == list(range(2, 3002))


def test_auto_is_numpy_without_pyarrow(tmp_path, monkeypatch):
    path = write(tmp_path / "d.csv", "1,2,0\n3,4,1\n")
    used = []
    monkeypatch.setattr(fastcsv, "have_pyarrow", lambda: False)
    monkeypatch.setattr(fastcsv, "_numpy_block", lambda *a, f=fastcsv._numpy_block: used.append(1) or f(*a))
    assert load_file(path).x.tolist() == [[1, 2], [3, 4]] and used


def test_pyarrow_asked_for_and_missing_says_how_to_install(tmp_path, monkeypatch):
    path = write(tmp_path / "d.csv", "1,2,0\n3,4,1\n")
    monkeypatch.setattr(fastcsv, "have_pyarrow", lambda: False)
    with pytest.raises(OptionError, match=r"pyarrow needs the pyarrow package \(pip install 'dlrun\[arrow\]'\)"):
        load_file(path, csv_parser="pyarrow")


LONG_CELL = "1,2,0\n" + "1" * 140_000 + ",2,1\n"


@pytest.mark.parametrize("name,content,message", [
    ("non_numeric", "1,2,0\n3,abc,1\n", "bad.csv:2: column 2: expected a number, got 'abc'"),
    ("ragged", "1,2,0\n3,4,1\n5,1\n", "bad.csv:3: expected 3 columns (as in line 1), got 2"),
    ("ragged_long", "1,2,0\n3,4,1,7\n", "bad.csv:2: expected 3 columns (as in line 1), got 4"),
    ("cell_too_long", LONG_CELL, "bad.csv:2: a cell longer than 131,072 characters; expected numbers separated by commas"),
    ("late_nul", "1,2,0\n" * 20_000 + "3,\x004,1\n", None),
    ("not_utf8", b"1,2,0\n" * 20_000 + b"3,\xff4,1\n", "bad.csv:20001: not UTF-8 text (byte 0xff at column 3)"),
    ("header_only", "a,b,label\n", "bad.csv: the file has a header row but no data rows"),
    ("one_column", "1\n2\n", "bad.csv:1: expected at least 2 columns (features and a label), got 1"),
    ("comment", "1,2,0\n#3,4,1\n", "bad.csv:2: column 1: expected a number, got '#3'"),
])
@pytest.mark.parametrize("parser", PARSERS)
def test_errors_are_the_exact_scan_s(tmp_path, name, content, message, parser):
    path = tmp_path / "bad.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    want = outcome(path, "python")
    assert isinstance(want, str)  # every file here is refused
    if message is not None:
        assert message in want, want
    assert outcome(path, parser) == want


@pytest.mark.parametrize("parser", PARSERS)
def test_blank_quoted_and_missing_cells_are_read_as_the_row_by_row_scan_reads_them(tmp_path, parser):
    path = write(tmp_path / "d.csv", 'a,b,label\n\n1,"2.5",0\n  \n3,4,1\n,,\n5,,1\n6,NA,0\n')
    got = outcome(path, parser)
    assert_same(got, outcome(path, "python"))
    assert got[2].tolist() == [3, 5, 7, 8]  # the file lines of the samples
    assert np.isnan(got[0][2:, 1]).all()  # missing cells
