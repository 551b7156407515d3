#!/usr/bin/env bash
# Everything dlrun checks on a CUDA machine, in one go:
#   bash benchmarks/gpu_session.sh [OUTDIR] [STAGES]
# STAGES (default "tests configs startup memory time bench"): tests = the whole suite, GPU tests
# included; configs = every shipped config trained on cpu and on gpu, final metrics and wall time
# side by side; startup = where a short run's time goes (imports, CUDA context, kernel compilation
# with an empty and a filled CuPy cache, per-step time; benchmarks/gpu_startup.py); memory = live
# GPU memory at the peak by allocating line, against torch (benchmarks/gpu_memory.py); time =
# `dlrun time` on gpu and the recurrent layers' time per batch; bench = benchmarks/run.py
# --device gpu against PyTorch CUDA.
# Logs go to OUTDIR (default /tmp/dlrun-gpu); see docs/performance.md.
set -u
OUT=${1:-/tmp/dlrun-gpu}
STAGES=${2:-tests configs startup memory time bench}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1
# wall times as an installed package sees them: with a bytecode cache (an image that sets
# PYTHONDONTWRITEBYTECODE compiles every module from source in every process, 0.4-0.7 s)
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$WORK/pycache"
$PY -c "import dlrun.runs.run, dlrun.cli, cupy, cupyx" 2>/dev/null
has() { [[ " $STAGES " == *" $1 "* ]]; }
nvidia-smi -L
$PY - <<'PY'
import numpy, cupy, sys
print("python", sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "cuda runtime", cupy.cuda.runtime.runtimeGetVersion(), "device", cupy.cuda.runtime.getDeviceProperties(0)["name"])
try:
    import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)
except Exception as e:
    print("torch: not importable", e)
PY
if has tests; then
  echo "== test suite (GPU tests included)"
  # pytest-xdist is in the dev extra; without it the suite runs serially rather than not at all
  workers=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
  $PY -m pytest -q -p no:cacheprovider $workers tests >"$OUT/tests.log" 2>&1
  grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
fi
if has configs; then
  echo "== shipped configs, cpu vs gpu"
  for c in configs/*.yaml; do
    for d in cpu gpu; do
      name=$(basename "$c" .yaml)
      t0=$(date +%s%N)
      $PY -m dlrun train "$c" --device "$d" --runs-dir "$WORK/runs-$d" >"$WORK/$name-$d.log" 2>&1
      rc=$?
      t1=$(date +%s%N)
      last=$(ls -td "$WORK/runs-$d"/*/ 2>/dev/null | head -1)
      summ=$($PY -c "import json,sys; s=json.load(open(sys.argv[1]+'summary.json')); print(' '.join(f'{k}={v:.4g}' for k,v in s.items() if isinstance(v,float) and k.split('_')[0] in ('train','val')))" "$last" 2>/dev/null)
      printf '%-16s %-3s rc=%s %7d ms %s\n' "$name" "$d" "$rc" "$(( (t1 - t0) / 1000000 ))" "$summ"
      [ $rc -ne 0 ] && tail -3 "$WORK/$name-$d.log"
    done
  done
fi
if has startup; then
  echo "== start-up against per-step time (cold and warm kernel cache, and the CPU)"
  $PY benchmarks/gpu_startup.py configs/spiral.yaml configs/adding_lstm.yaml configs/digits_cnn.yaml 2>&1
fi
if has memory; then
  echo "== GPU memory of mlp_gpu by allocating line, against torch"
  $PY benchmarks/gpu_memory.py --workload mlp_gpu 2>&1
fi
if has time; then
  echo "== dlrun time (gpu): digits_cnn and the GPU-sized benchmark networks; a whole step with and without its CUDA graph"
  $PY -m dlrun time configs/spiral.yaml --device gpu 2>&1 | tail -14
  $PY -m dlrun time configs/digits_cnn.yaml --device gpu 2>&1 | tail -20
  $PY - "$WORK" <<'PY'
import sys, numpy as np
w = sys.argv[1]
rng = np.random.default_rng(0)
np.savez(f"{w}/mlp.npz", x=rng.random((4096, 784), dtype=np.float32), y=rng.integers(0, 10, 4096))
np.savez(f"{w}/cnn.npz", x=rng.standard_normal((2048, 3, 32, 32), dtype=np.float32), y=rng.integers(0, 10, 2048))
common = "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.01, momentum: 0.9}\n"
open(f"{w}/mlp.yaml", "w").write("data: {type: file, path: mlp.npz}\nmodel: [{type: Linear, units: 4096}, ReLU, "
    "{type: Linear, units: 4096}, ReLU, {type: Linear, units: 10}]\n" + common + "train: {batch_size: 1024}\n")
open(f"{w}/cnn.yaml", "w").write("data: {type: file, path: cnn.npz}\nmodel: [{type: Conv2D, filters: 64, kernel_size: 3}, "
    "ReLU, {type: MaxPool2D, pool_size: 2}, Flatten, {type: Linear, units: 10}]\n" + common + "train: {batch_size: 256}\n")
PY
  $PY -m dlrun time "$WORK/mlp.yaml" --device gpu 2>&1 | tail -12
  $PY -m dlrun time "$WORK/cnn.yaml" --device gpu 2>&1 | tail -12
  echo "== recurrent layers per batch: as dlrun runs them, per-step cells, unfused, and the CPU"
  $PY benchmarks/recurrent_gpu.py 2>&1
fi
if has bench; then
  echo "== benchmarks against PyTorch CUDA"
  $PY benchmarks/run.py --device gpu --rounds "${ROUNDS:-2}" --repeats "${REPEATS:-3}" --out "$OUT" 2>&1 | grep -v "^round"
fi
