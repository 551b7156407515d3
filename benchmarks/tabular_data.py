"""Write the tabular files of the data-loading benchmark (docs/performance.md, "Reading data").

    python benchmarks/tabular_data.py DIR [--rows 20000,200000,2000000] [--features 49]

For each row count N it writes DIR/tabular-N.csv (49 float features printed with 5 decimals,
then an integer label 0-9 in the last column: 200,000 rows are 85 MB), and the same numbers as
DIR/tabular-N.npy (one float64 array, the label in the last column) and DIR/tabular-N.npz
(x float64, y int64), plus a config DIR/tabular-N-{csv,npy,npz,mmap}.yaml for each that trains
softmax regression (one Linear layer) for one epoch.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CONFIG = """\
data: {{type: file, path: {path}{extra}}}
model:
  - {{type: Linear, units: 10}}
loss: SoftmaxCrossEntropy
optimizer: {{type: Adam, learning_rate: 0.001}}
train: {{epochs: 1, batch_size: 512, validation_split: 0.1}}
seed: 0
"""


def write(directory: Path, rows: int, features: int, chunk: int = 100_000) -> None:
    rng = np.random.default_rng(rows)
    csv_path, npy_path, npz_path = (directory / f"tabular-{rows}{s}" for s in (".csv", ".npy", ".npz"))
    whole = np.lib.format.open_memmap(npy_path, mode="w+", dtype=np.float64, shape=(rows, features + 1))
    with open(csv_path, "w") as f:
        for s in range(0, rows, chunk):
            n = min(chunk, rows - s)
            x = np.round(rng.standard_normal((n, features)), 5)
            y = rng.integers(0, 10, n)
            whole[s:s + n, :features], whole[s:s + n, features] = x, y
            np.savetxt(f, np.column_stack([x, y]), fmt=["%.5f"] * features + ["%d"], delimiter=",")
    whole.flush()
    np.savez(npz_path, x=np.asarray(whole[:, :features]), y=np.asarray(whole[:, features]).astype(np.int64))
    del whole
    for kind, path, extra in (("csv", csv_path, ""), ("npy", npy_path, ""), ("npz", npz_path, ""),
                              ("mmap", npy_path, ", memory_map: true")):
        (directory / f"tabular-{rows}-{kind}.yaml").write_text(CONFIG.format(path=path.name, extra=extra))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--rows", default="20000,200000,2000000")
    ap.add_argument("--features", type=int, default=49)
    a = ap.parse_args()
    a.directory.mkdir(parents=True, exist_ok=True)
    for rows in (int(r) for r in a.rows.split(",")):
        write(a.directory, rows, a.features)


if __name__ == "__main__":
    main()
