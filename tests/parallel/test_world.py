"""The pieces of a data-parallel run that need no second process: the launcher's environment,
each rank's part of a batch, per-rank random streams, one process left exactly as it was; and,
on a CUDA machine, NCCL's sum through CuPy under a real mpiexec."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlrun import parallel, seeding
from dlrun.backend import get_backend, gpu_available
from conftest import ROOT, _environment


def test_launched_reads_the_launchers_variables(monkeypatch):
    for var in parallel._SIZE_VARIABLES + parallel._RANK_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    assert parallel.launched() == (0, 1, None)
    monkeypatch.setenv("PMI_SIZE", "1")  # mpiexec -n 1: one process, as without mpiexec
    assert parallel.launched() == (0, 1, None)
    monkeypatch.delenv("PMI_SIZE")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    assert parallel.launched() == (3, 4, "OMPI_COMM_WORLD_SIZE")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_the_watch_tells_how_a_process_ended():
    """What a rank's watch says of another rank's process: nothing while it runs; how it ended
    while the launcher has not collected it; gone after, or when its id names a newer process."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        born = parallel._born(child.pid)
        assert born is not None and parallel._ended(child.pid, born) is None
        assert parallel._ended(child.pid, str(int(born) + 1)) == "its process is gone"  # the id used again
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet collected
        assert parallel._ended(child.pid, born) == "killed by SIGKILL, signal 9"
    finally:
        child.kill()
        child.wait()
    assert parallel._ended(child.pid, born) == "its process is gone"
    child = subprocess.Popen([sys.executable, "-c", "import os, sys; sys.stdin.read(); os._exit(3)"],
                             stdin=subprocess.PIPE)
    born = parallel._born(child.pid)
    child.stdin.close()  # it exits now
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert parallel._ended(child.pid, born) == "exited with code 3"
    child.wait()


@pytest.mark.parametrize("n,size", [(7, 2), (25, 3), (2, 2), (128, 8)])
def test_the_ranks_parts_cover_a_batch_once(n, size):
    parts = []
    for rank in range(size):
        w = parallel.World()
        w.rank, w.size = rank, size
        parts.append(w.part(n))
    covered = np.concatenate([np.arange(n)[p] for p in parts])
    assert covered.tolist() == list(range(n))
    lengths = [p.stop - p.start for p in parts]
    assert max(lengths) - min(lengths) <= 1 and min(lengths) >= 1


def test_rank_0_draws_one_process_streams_and_the_others_their_own():
    one = seeding.layer_streams(5, 3)
    assert [s.generate_state(2).tolist() for s in seeding.layer_streams(5, 3, rank=0)] == \
           [s.generate_state(2).tolist() for s in one]
    states = {r: [s.generate_state(2).tolist() for s in seeding.layer_streams(5, 3, rank=r)] for r in range(4)}
    firsts = [tuple(states[r][0]) for r in range(4)]
    assert len(set(firsts)) == 4  # every rank its own masks
    assert states[2] == [s.generate_state(2).tolist() for s in seeding.layer_streams(5, 3, rank=2)]  # reproducible
    assert seeding.resumed_layer_streams(5, 10, 2)[0].generate_state(1).tolist() != \
           seeding.resumed_layer_streams(5, 10, 2, rank=1)[0].generate_state(1).tolist()


def test_one_process_is_left_as_it_was():
    """Without a launcher: no mpi4py, a world whose collectives change nothing, no spare
    elements after the gradients, and a training step without a sum."""
    code = ("import sys, numpy as np; from dlrun import parallel; w = parallel.join(); "
            "from dlrun.config import load_config; from dlrun.runs.assembly import assemble; "
            "run = assemble(load_config('configs/spiral.yaml')); a = run.model.arena; "
            "print(type(w).__name__, w.size, 'mpi4py' in sys.modules, a.reduced is a.grad, "
            "run.trainer.training_step.world)")
    env = {k: v for k, v in _environment(None).items() if k not in parallel._SIZE_VARIABLES}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["World", "1", "False", "True", "None"]


MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")

NCCL_SCRIPT = """
import numpy as np
from mpi4py import MPI
from dlrun import parallel
from dlrun.backend import get_backend

b = get_backend("gpu")
w = parallel.MPIWorld(MPI)
w.use_gpu(b)
assert w.nccl is not None, "NCCL not in use"
flat = b.xp.arange(10, dtype=np.float32)
flat[-parallel.CONTROL:] = 0
w.pending = 15
w.sum_gradients(flat)
k = w.size
assert np.allclose(b.to_host(flat[:-parallel.CONTROL]), k * np.arange(8)), flat
assert w.agreed == 15
stats = b.xp.ones(4)
w.sum_device(stats)
assert np.allclose(b.to_host(stats), k)
print("nccl ok", k, b.xp.cuda.Device().id)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec: install the mpi extra")
def test_nccl_sums_gradients_on_the_gpu():
    """The NCCL path of one rank (of two when two GPUs answer), under a real mpiexec."""
    if get_backend("gpu").nccl() is None:
        pytest.skip("CuPy finds no NCCL library (pip install nvidia-nccl-cu12)")
    ranks = min(2, get_backend("gpu").xp.cuda.runtime.getDeviceCount())
    p = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-c", NCCL_SCRIPT], cwd=ROOT,
                       env=_environment({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("nccl ok") == ranks
