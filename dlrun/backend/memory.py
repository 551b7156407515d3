"""How much memory is left, and refusing sizes that would not fit before they are allocated."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

try:
    import resource  # POSIX: the address-space limit (ulimit -v)
except ImportError:  # Windows
    resource = None

if TYPE_CHECKING:
    from .backend import Backend


def host_memory_available() -> int | None:
    """Bytes of host memory this process can still get, or None where nothing says: the least of
    what the OS can still give (Linux's MemAvailable, else free pages), what the process's
    control group may still use (a container's limit), and what its address-space limit
    (``ulimit -v``) leaves. Used to refuse, with a message, sizes that would get the process
    killed (Linux overcommits: a 15 GiB numpy allocation succeeds, touching it does not)."""
    found = [v for v in (_os_available(), _cgroup_available(), _rlimit_available()) if v is not None]
    return min(found) if found else None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _os_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """A cgroup v2 (memory.max − memory.current) or v1 (limit − usage) limit, else None."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 2**60:  # v1 writes "no limit" as a huge number
            return max(cap - used, 0)
    return None


def _rlimit_available() -> int | None:
    """What RLIMIT_AS (``ulimit -v``) leaves above the process's address space (VmSize), else None."""
    if resource is None:
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return max(soft - size, 0)


def ensure_fits(need: float, what: str, backend: Backend | None = None) -> None:
    """MemoryError ("x of shape (…) needs about 3.6 TiB …, more than the 20.1 GiB of memory
    available") when ``need`` bytes exceed what ``backend`` (the host by default) can still
    give, before any of it is allocated or touched."""
    free = backend.memory_available() if backend is not None else host_memory_available()
    if free is not None and need > free:
        where = "memory" if backend is None or backend.name == "cpu" else "GPU memory"
        raise MemoryError(f"{what} needs about {format_bytes(need)}, more than the {format_bytes(free)} of {where} "
                          f"available")


def format_bytes(n: float) -> str:
    """``n`` bytes for people: 512 B, 7.4 KiB, 152.6 MiB, 37.3 GiB, 3.6 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n):,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
