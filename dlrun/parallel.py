"""The ranks of a data-parallel run: which process this is, and what passes between the processes.

``mpiexec -n K dlrun train CONFIG`` starts K processes, the *ranks*. Each holds the whole model
and data, computes a disjoint part of every global batch, and the ranks average their gradients
with one allreduce per optimizer step over the model's flat gradient buffer (MPI through mpi4py
on the CPU; NCCL through CuPy on GPUs, its id passed over MPI). :class:`World` is one process
(every collective the identity; nothing is imported); :func:`join` gives the process's world.

Collectives of a run, and who calls them:

* the start (:meth:`World.start`): every rank's digest of its initial weights and optimizer state
  (or the error it met while preparing), gathered once; ranks that differ, or one that failed,
  stop every rank before the first batch with one line;
* each optimizer step (:meth:`World.sum_gradients`, called by the training step alone): the flat
  gradient buffer summed over the ranks, with two spare elements that carry the SIGINT/SIGTERM
  flags, so that every rank stops after the same batch;
* each epoch (:meth:`World.sum_host`): the loss, correct-prediction and metric sums of training,
  then of validation; the running statistics of per-rank layers broadcast from rank 0; a model
  that draws random numbers (Dropout): every rank's generator states gathered on rank 0
  (:meth:`World.gather`), for its checkpoints, then also when training stops inside an epoch;
* a synchronised BatchNorm (``sync: true``): its batch statistics over the ranks.

A rank that raises once training is under way cannot tell the others, which wait inside a
collective: it names itself and the error in one line and aborts the whole run (MPI_Abort), as
ChainerMN's global exception hook does.

A rank that ends without a word (killed, crashed, exited) cannot say so. MPICH's ``mpiexec``
kills the other ranks itself at once (SIGKILL) and prints which process ended and how: always for
a rank ended by a signal, and for one that exited unless ``-disable-auto-cleanup`` is given. Where
the launcher leaves them running (with that option it sends them SIGUSR1, which MPICH catches
and nothing acts on; other launchers send nothing) the others would wait in their next
collective for ever: each rank *watches* the processes of the ranks on its machine (a daemon
thread, every quarter second), and once one has ended while this rank has waited in one
collective for two seconds, the lowest living rank of the machine reports it
(:attr:`World.on_lost`, a :class:`LostRank`) and aborts the run. A machine lost as a whole is
left to the launcher.
"""
from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import seeding
from .errors import DlrunError, UsageError

# set by launchers for every rank they start: MPICH and Intel MPI (PMI), Open MPI, MVAPICH
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK")

# the spare elements after the flat gradient buffer (dlrun.backend.arena): ranks holding a SIGINT, a SIGTERM
CONTROL = 2
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def launched() -> tuple[int, int, str | None]:
    """(this process's rank, the number of ranks, the variable that said so) from the launcher's
    environment; (0, 1, None) for a process that no launcher started."""
    for var in _SIZE_VARIABLES:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            rank = next((int(os.environ[r]) for r in _RANK_VARIABLES if os.environ.get(r, "").isdigit()), 0)
            return rank, int(value), var
    return 0, 1, None


# the watch: how often it looks at the other ranks' processes, and how long this rank must wait
# in one collective with a rank gone before it stops the run (a collective that can complete, does)
WATCH_SECONDS = 0.25
STUCK_SECONDS = 2.0


@dataclass
class LostRank:
    """A rank whose process ended while the others waited for it in a collective.

    Attributes:
        rank: the rank that ended, of ``size``.
        how: 'killed by SIGKILL, signal 9', 'exited with code 3', or 'its process is gone'.
        where: where training stood on the reporting rank ('epoch 2, after batch 14 of 20'), or None.
        run_dir: rank 0's run directory, or None before the ranks started training.
    """

    rank: int
    size: int
    how: str
    where: str | None
    run_dir: str | None


class RankError(DlrunError):
    """An error that another rank met; every rank raises it together, rank 0 reports it."""

    exit_code = 1


class World:
    """One process: rank 0 of 1; every collective leaves its arrays as they are."""

    rank = 0
    size = 1
    local_rank = 0

    def __init__(self):
        self.pending = 0        # a signal this rank received, not yet passed to the others
        self.agreed = 0         # the signal the ranks agreed to stop on (0: none)
        self.started = False    # the start's collective has run: training collectives may follow
        self.seconds = 0.0      # spent in the gradients' allreduce (the scaling benchmark reads it)
        self.steps = 0
        self.run_dir: str | None = None  # rank 0's run directory, once the ranks started
        self.at = None          # () -> where training stands ('epoch 2, after batch 14 of 20'), for a report
        self.on_lost = None     # (LostRank) -> None: reports a rank that ended (the command line prints it)

    @property
    def writes(self) -> bool:
        """Whether this rank writes the run directory (rank 0 alone)."""
        return self.rank == 0

    def part(self, n: int) -> slice:
        """This rank's contiguous part of ``n`` samples (parts differ by at most one sample)."""
        return slice(n * self.rank // self.size, n * (self.rank + 1) // self.size)

    def start(self, digest: str = "", error: BaseException | None = None, run_dir: str | None = None):
        """The start of training (see the module docstring); returns rank 0's ``run_dir``."""
        self.started = True
        if error is not None:
            raise error
        return run_dir

    def failed(self, error: BaseException):
        """Report an error met while preparing to every rank (the start's collective), and raise it."""
        self.start(error=error)

    @contextmanager
    def preparing(self):
        """While a run is prepared (config, data, model, run directory): an error is passed to
        every rank at the start, and the ranks stop together with one report from rank 0; an
        error after the start is this rank's own, and raised as it is."""
        try:
            yield
        except Exception as e:
            self.failed(e)
            raise

    def sum_gradients(self, flat, loose=()) -> None:
        """Sum the gradients over the ranks in place (``flat``: the gradient buffer with its
        :data:`CONTROL` spare elements; ``loose``: gradients outside it)."""

    def fresh_seed(self) -> int:
        """A new run seed for a run that names none (:func:`dlrun.seeding.fresh_seed`), the same
        on every rank."""
        return seeding.fresh_seed()

    def flags(self) -> np.ndarray:
        """A buffer of the :data:`CONTROL` flags alone (a model whose every gradient is outside
        the flat buffer)."""
        return np.zeros(CONTROL)

    def sum_host(self, values: np.ndarray) -> np.ndarray:
        """A float64 host vector summed over the ranks."""
        return values

    def sum_device(self, a):
        """A device array summed over the ranks, in place (a synchronised layer's statistics)."""
        return a

    def broadcast(self, arrays) -> None:
        """Rank 0's values of these device arrays on every rank, in place."""

    def gather(self, value) -> list | None:
        """Every rank's ``value`` (small, JSON-like), in rank order, on rank 0; None on the others."""
        return [value]

    def first(self, found: tuple | None) -> tuple[int, str] | None:
        """(rank, text) of the first ``found`` (an (order, text) pair or None) over the ranks, by
        order, then rank; the same on every rank."""
        return None if found is None else (0, found[1])

    def abort(self, code: int) -> None:
        """Stop every rank of the run (only a rank's own error after the start calls it)."""

    def use_gpu(self, backend) -> None:
        """Put this rank on its GPU (one process: the current one)."""


def digest(arrays) -> str:
    """A digest of host or device arrays, in order: equal on two ranks when their values are."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a.get() if hasattr(a, "get") else a)
        h.update(f"{a.shape}{a.dtype.str}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


class MPIWorld(World):
    """A rank of a run that ``mpiexec`` started (mpi4py). GPU gradients go over NCCL when the
    backend offers it (``nccl``: CuPy's module), everything else over MPI."""

    def __init__(self, MPI):
        super().__init__()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)  # the ranks on this machine
        self.local_rank = node.Get_rank()
        # rank 0's fresh seed, sent while every rank is here (later a rank may be elsewhere)
        self._seed = self.comm.bcast(seeding.fresh_seed() if self.rank == 0 else None, root=0)
        self.nccl = None
        # the watch (see the module docstring): this machine's ranks and their processes
        mine = (self.rank, os.getpid(), _born(os.getpid()))
        # (those whose process this one cannot see, another process namespace, are left to the launcher)
        self._neighbours = [(r, pid, born) for r, pid, born in node.allgather(mine)
                            if r == self.rank or born is None or _born(pid) == born]
        node.Free()
        self._calls = 0         # collectives entered
        self._waiting = False   # inside one now
        self._watch()

    def use_gpu(self, backend) -> None:
        """Each rank on the GPU of its local rank, gradients over NCCL: rank 0 makes the
        communicator's id and broadcasts it over MPI (as ChainerMN does). Without NCCL the
        gradients go through the host over MPI (slower, still exact)."""
        backend.select_device(self.local_rank)
        nccl = backend.nccl()
        if nccl is None or self.nccl is not None:
            return
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = self.comm.bcast(uid, root=0)
        self.nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._stream = backend.xp.cuda.get_current_stream()
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64}
        self._sum = nccl.NCCL_SUM

    def start(self, digest: str = "", error: BaseException | None = None, run_dir: str | None = None):
        if self.started:  # an error after the start is this rank's own
            if error is not None:
                raise error
            return run_dir
        self.started = True
        said = None if error is None else (str(error).splitlines()[0] if str(error) else type(error).__name__,
                                           getattr(error, "exit_code", 1))
        with self._collective():
            every = self.comm.allgather((digest, said, run_dir))
        self.run_dir = every[0][2]
        failed = [(r, s) for r, (_, s, _) in enumerate(every) if s is not None]
        if failed:
            if error is not None:
                error.everywhere = True  # every rank knows: rank 0 reports it, nobody aborts
                raise error
            r, (text, code) = failed[0]
            e = RankError(f"rank {r}: {text}")
            e.exit_code, e.everywhere = code, True
            raise e
        differ = [r for r, (d, _, _) in enumerate(every) if d != every[0][0]]
        if differ:
            e = RankError(f"rank {differ[0]} starts from other weights, optimizer state or data than rank 0 "
                          f"(digest {every[differ[0]][0]} against {every[0][0]}): every rank must run the same "
                          f"dlrun, numpy and config, and read the same data files and checkpoint")
            e.everywhere = True
            raise e
        return every[0][2]

    @contextmanager
    def _collective(self):
        """While this rank waits in a collective (what the watch looks at)."""
        self._calls += 1
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False

    def _watch(self) -> None:
        """Start the watch (see the module docstring)."""
        if len(self._neighbours) < 2:
            return
        threading.Thread(target=self._watching, name="dlrun-watch", daemon=True).start()

    def _watching(self) -> None:
        seen = None  # (collectives entered, when) as this rank was first seen waiting with a rank gone
        while True:
            time.sleep(WATCH_SECONDS)
            ended = {r: how for r, pid, born in self._neighbours
                     if r != self.rank and (how := _ended(pid, born)) is not None}
            if not ended or not self._waiting:
                seen = None
                continue
            now = time.monotonic()
            if seen is None or seen[0] != self._calls:
                seen = (self._calls, now)
                continue
            if now - seen[1] < STUCK_SECONDS:
                continue
            reporter = min(r for r, _, _ in self._neighbours if r not in ended)
            if self.rank == reporter:
                if self.on_lost is not None:
                    lost = min(ended)
                    self.on_lost(LostRank(lost, self.size, ended[lost], self.at() if self.at is not None else None,
                                          self.run_dir))
            else:  # the reporting rank stops every rank; should it not, this one does
                time.sleep(5.0)
            self.abort(1)
            return

    def sum_gradients(self, flat, loose=()) -> None:
        self._calls += 1  # (what _collective does, without its cost: this runs every step)
        self._waiting = True
        try:
            self._sum_gradients(flat, loose)
        finally:
            self._waiting = False

    def _sum_gradients(self, flat, loose) -> None:
        t0 = time.perf_counter()
        if self.nccl is not None and not isinstance(flat, np.ndarray):
            # on GPUs NCCL sums the buffer; the flags travel on the host beside it, so that the
            # step reads nothing back from the device
            mine = np.array([self.pending == s for s in _SIGNALS], dtype=np.float64)
            request = self.comm.Iallreduce(self.MPI.IN_PLACE, mine, op=self.MPI.SUM)
            self._nccl_sum(flat)
            request.Wait()
            counts = mine.tolist()
        else:  # one collective: the gradients and the stop flags together
            flags = flat[-CONTROL:]
            for i, s in enumerate(_SIGNALS):
                flags[i] = self.pending == s
            self._sum_array(flat)
            counts = flags.tolist()
        for g in loose:  # a plugin's tensor outside the flat buffer (another dtype): one each
            self._sum_array(g)
        if not self.agreed:
            self.agreed = next((int(s) for s, c in zip(_SIGNALS, counts) if c), 0)
        self.seconds += time.perf_counter() - t0
        self.steps += 1

    def _nccl_sum(self, a) -> None:
        self.nccl.allReduce(a.data.ptr, a.data.ptr, a.size, self._types[a.dtype], self._sum, self._stream.ptr)

    def _sum_array(self, a) -> None:
        if self.nccl is not None and not isinstance(a, np.ndarray):
            self._nccl_sum(a)
        elif isinstance(a, np.ndarray):
            self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM)
        else:  # a device array without NCCL: through the host
            host = a.get()
            self.comm.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
            a.set(host)

    def sum_host(self, values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.float64)
        with self._collective():
            self.comm.Allreduce(self.MPI.IN_PLACE, values, op=self.MPI.SUM)
        return values

    def sum_device(self, a):
        with self._collective():
            self._sum_array(a)
        return a

    def broadcast(self, arrays) -> None:
        with self._collective():
            for a in arrays:
                if isinstance(a, np.ndarray):
                    self.comm.Bcast(a, root=0)
                elif self.nccl is not None:
                    self.nccl.bcast(a.data.ptr, a.size, self._types[a.dtype], 0, self._stream.ptr)
                else:
                    host = self.comm.bcast(a.get() if self.rank == 0 else None, root=0)
                    a.set(host)

    def fresh_seed(self) -> int:
        return self._seed

    def gather(self, value) -> list | None:
        with self._collective():
            return self.comm.gather(value, root=0)

    def first(self, found: tuple | None) -> tuple[int, str] | None:
        with self._collective():
            every = [(f[0], r, f[1]) for r, f in enumerate(self.comm.allgather(found)) if f is not None]
        return min(every)[1:] if every else None

    def abort(self, code: int) -> None:
        # the rank has said what happened: MPICH's own line about the abort would only repeat it
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        self.comm.Abort(code)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _born(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot; None without /proc): a process id
    used again by a new process is told apart by it."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _ended(pid: int, born: str | None) -> str | None:
    """How the process ``pid`` (started at ``born``) ended, or None while it runs."""
    if born is None:  # no /proc: only whether it is there
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "its process is gone"
        except OSError:
            pass
        return None
    fields = _stat(pid)
    if fields is None or len(fields) < 20 or fields[19] != born:
        return "its process is gone"
    if fields[0] not in "ZX":
        return None
    status = int(fields[49]) if len(fields) > 49 and fields[49].isdigit() else None  # as waitpid reports it
    if status is not None and os.WIFSIGNALED(status):
        n = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(n).name}, signal {n}"
        except ValueError:  # (a real-time signal)
            return f"killed by signal {n}"
    if status is not None and os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return "its process ended"


_WORLD: list[World] = []


def join() -> World:
    """This process's world: an :class:`MPIWorld` when a launcher started several ranks, else one
    process (mpi4py is then never imported). A UsageError when several ranks were launched and
    mpi4py is missing."""
    if _WORLD:
        return _WORLD[0]
    rank, size, var = launched()
    if size == 1:
        world = World()
    else:
        try:
            from mpi4py import MPI
        except ImportError as e:
            error = UsageError(f"this process is rank {rank} of {size} ({var}={size}: started by mpiexec), but "
                               f"mpi4py cannot be imported ({e}); install the mpi extra: pip install 'dlrun[mpi]'")
            error.everywhere = True  # every rank meets it: rank 0 reports it
            raise error from None
        world = MPIWorld(MPI)
    _WORLD.append(world)
    return world


def current() -> World:
    """The world :func:`join` gave (one process when nothing joined)."""
    return _WORLD[0] if _WORLD else _SINGLE


_SINGLE = World()
