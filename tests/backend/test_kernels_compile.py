"""Every CUDA kernel dlrun declares compiles with NVRTC, without a GPU.

Block kernels (``backend.BlockKernel``, a complete ``__global__`` function) compile from their
own source for float32 and float64, as CuPy's RawKernel compiles them.

CuPy builds an ElementwiseKernel's CUDA source from its parameters and the argument types of
the call, then compiles it with NVRTC on first use. Here the same source comes from CuPy's own
code generator, for float32 and float64 and for the argument kinds the kernels are called
with (host scalars or device arrays; raw arrays of 1 or 4 dimensions, contiguous or not), and
NVRTC compiles it for the oldest and the newest architecture the installed NVRTC supports (it
says which: CUDA 12 goes back to sm_50, CUDA 13 to sm_75, Turing).
A typo or a type error in a kernel then fails here on a CPU-only machine, not on a user's GPU.

Needs CuPy and NVRTC (``pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12``), not a CUDA device;
skipped when either is missing. It uses CuPy internals (``cupy._core._kernel``): a CuPy without
them is a skip that names the version, not a failure.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import dlrun
from dlrun.backend import BLOCK_KERNELS, KERNELS
from kernel_emulation import import_all_modules

cupy = pytest.importorskip("cupy")
try:
    from cupy.cuda import nvrtc

    NVRTC = nvrtc.getVersion()
    ARCHS = sorted(nvrtc.getSupportedArchs())
except Exception as e:  # the NVRTC library is not installed or does not load
    pytest.skip(f"NVRTC is not available ({type(e).__name__}: {e})", allow_module_level=True)
try:
    from cupy._core import _carray, _kernel, _scalar
    from cupy._core import core as _core

    _HEADER = "".join(f"#include <{h}>\n" for h in _core._cupy_header_list)
    _OPTIONS = tuple(_core.assemble_cupy_compiler_options(()))
    _ARRAY, _INDEXER, _SCALAR = 1, 2, 3  # cupy._core._kernel._ArgKind
except (ImportError, AttributeError) as e:
    pytest.skip(f"CuPy {cupy.__version__} lacks the internals this test uses ({e})", allow_module_level=True)

pytestmark = pytest.mark.slow

import_all_modules()

FLOATS = (np.float32, np.float64)
OTHERS = (np.int32, np.int64, np.uint8, np.float32, np.float64)  # labels (Y), indices (X)
# (non-raw inputs as, non-raw ndim, raw ndim, contiguous, 32-bit indexing, arch)
OLDEST, NEWEST = f"compute_{ARCHS[0]}", f"compute_{ARCHS[-1]}"
VARIANTS = (("arrays", 1, 1, True, True, NEWEST), ("scalars", 2, 4, False, False, OLDEST))


def kernel_source(in_params, out_params, operation, name, types, variant):
    """CuPy's CUDA source for the kernel, with ``types`` giving each type letter's dtype."""
    kernel = cupy.ElementwiseKernel(in_params, out_params, operation, name)
    as_scalar, nd, raw_nd, contiguous, idx32, _ = variant
    as_scalar = as_scalar == "scalars"

    def dtype_of(p):
        return np.dtype(p.dtype if p.dtype is not None else types[p.ctype]).type

    in_types, out_types, type_map = _kernel._decide_params_type(
        kernel.in_params, kernel.out_params, tuple(dtype_of(p) for p in kernel.in_params),
        tuple(dtype_of(p) for p in kernel.out_params))
    infos = []
    for p, t in zip(kernel.in_params + kernel.out_params, in_types + out_types):
        t = np.dtype(t).type
        if p.raw:
            infos.append(_kernel._ArgInfo(_ARRAY, cupy.ndarray, t, raw_nd, contiguous, idx32))
        elif as_scalar and p.is_const:
            infos.append(_kernel._ArgInfo(_SCALAR, _scalar.CScalar, t, 0, True, True))
        else:
            infos.append(_kernel._ArgInfo(_ARRAY, cupy.ndarray, t, nd, contiguous, idx32))
    infos.append(_kernel._ArgInfo(_INDEXER, _carray.Indexer, None, nd, True, idx32))
    return _HEADER + _kernel._get_elementwise_kernel_code(
        tuple(infos), type_map, kernel.params, kernel.operation, kernel.name, kernel.preamble)


def nvrtc_compile(source, name, arch):
    """Compile with NVRTC as CuPy would; raise AssertionError with NVRTC's log on failure."""
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(_OPTIONS) + [f"-arch={arch}"])
        except nvrtc.NVRTCError as e:
            raise AssertionError(f"{name} ({arch}) does not compile: {e}\n{nvrtc.getProgramLog(prog)}") from None
        return nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)


def type_choices(kernel):
    """Each type letter the kernel uses: T (the model's float) and any other (Y labels, X indices)."""
    letters = sorted(set(re.findall(r"\b([A-Z])\s+\w+", kernel.in_params + ", " + kernel.out_params)))
    others = [c for c in letters if c != "T"]
    assert len(others) <= 1, f"{kernel.name}: extend type_choices for letters {others}"
    for t in FLOATS:
        for o in OTHERS if others else (None,):
            yield {"T": t, **({others[0]: o} if others else {})}


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_every_declared_kernel_compiles_for_both_floats_and_every_argument_kind(kernel):
    for types in type_choices(kernel):
        for variant in VARIANTS:
            source = kernel_source(kernel.in_params, kernel.out_params, kernel.operation, kernel.name,
                                   types, variant)
            assert kernel.operation.strip().splitlines()[-1].strip() in source
            assert nvrtc_compile(source, kernel.name, variant[-1])


@pytest.mark.parametrize("kernel", BLOCK_KERNELS, ids=lambda k: k.name)
def test_every_block_kernel_compiles_for_both_floats(kernel):
    for dtype in FLOATS:
        for arch in (OLDEST, NEWEST):
            assert nvrtc_compile(kernel.code(dtype), kernel.name, arch)


def test_the_check_fails_on_a_broken_kernel():
    source = kernel_source("T x", "T y", "y = x * undeclared;", "dlrun_broken", {"T": np.float32}, VARIANTS[0])
    with pytest.raises(AssertionError, match='identifier "undeclared" is undefined'):
        nvrtc_compile(source, "dlrun_broken", NEWEST)
    bad_type = kernel_source("T x", "T y", "y = min(x, 1LL);", "dlrun_bad_type", {"T": np.float32}, VARIANTS[0])
    with pytest.raises(AssertionError, match="dlrun_bad_type"):
        nvrtc_compile(bad_type, "dlrun_bad_type", NEWEST)


def test_every_kernel_in_the_source_is_declared_through_backend_kernel():
    """The compile test sees only Kernel declarations: no module builds a CuPy kernel itself."""
    root = Path(dlrun.__file__).parent
    declared = sum(len(re.findall(r"\bKernel\(\s*\"", p.read_text())) for p in root.rglob("*.py"))
    assert declared == len(KERNELS) >= 13
    blocks = sum(len(re.findall(r"\bBlockKernel\(", p.read_text())) for p in root.rglob("*.py")
                 if p != root / "backend" / "__init__.py")
    assert blocks == len(BLOCK_KERNELS) >= 2
    for path in root.rglob("*.py"):
        if path != root / "backend" / "__init__.py":
            assert not re.search(r"(Elementwise|Raw|Reduction)Kernel\b", path.read_text()), path
