"""Native fused kernels of the RL objective (``fused_rl.c``), built at first use with the system C compiler.

The packed-layout loss + closed-form gradient is memory-bound: eager PyTorch makes ~10 passes over the
tokens (sub, exp, two comparisons, clamp, gather of the per-response advantage, mul, dot), the C kernel
makes one, and the entropy's per-response sums one more. The library is compiled once per
(source, compiler, flags, CPU) into ``$SCIFOLIO_NATIVE_CACHE`` (default ``~/.cache/scifolio/native``),
like DeepSpeed's and PyTorch's JIT extensions, and loaded with ``ctypes``. It has no OpenMP runtime of
its own: work is split into contiguous response ranges of equal token count and run on Python threads
(``ctypes`` releases the GIL during the call), ``torch.get_num_threads()`` of them by default.

``available()`` says whether the kernels can be used here; ``NativeUnavailable`` carries the compiler's
message when they cannot. Callers in ``posttrain`` choose with ``backend="auto" | "native" | "torch"``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fused_rl.c")
CFLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared")
MIN_TOKENS_PER_THREAD = 1 << 16
"""Below this many tokens per thread the call runs on the calling thread (a thread hop costs more)."""


class NativeUnavailable(RuntimeError):
    """The C kernels could not be built or loaded here (no compiler, unsupported platform, ...)."""


def cache_dir() -> Path:
    return Path(os.environ.get("SCIFOLIO_NATIVE_CACHE") or Path.home() / ".cache" / "scifolio" / "native")


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise NativeUnavailable("no C compiler found (set CC, or install gcc)")
    return cc


def _cpu_signature() -> str:
    """-march=native code must not be reused on another CPU: key the build by the CPU's feature flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build_and_load() -> ctypes.CDLL:
    """Build (once per cache key) and load the kernels; raises ``NativeUnavailable`` with the reason."""
    cc = _compiler()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise NativeUnavailable(f"C compiler {cc!r} does not run: {e}") from e
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), version, " ".join(CFLAGS), platform.machine(), _cpu_signature()]).encode()
    ).hexdigest()[:16]
    target = cache_dir() / key / "libfused_rl.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Compile to a private name and rename: ranks starting together never load a half-written file.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        proc = subprocess.run([cc, *CFLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise NativeUnavailable(f"compiling {SOURCE.name} failed:\n{proc.stderr.strip()}")
        os.replace(tmp, target)
        log.info("built %s", target)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        raise NativeUnavailable(f"loading {target} failed: {e}") from e
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.sr_segment_sums.argtypes = [p, p, i64, i64, p]
    lib.sr_segment_sums.restype = None
    lib.sr_packed_loss_grad.argtypes = [p, p, p, p, p, i64, i64, f32, f32, f32, f32, p, p, p]
    lib.sr_packed_loss_grad.restype = None
    return lib


@functools.cache
def _loaded() -> ctypes.CDLL | NativeUnavailable:
    """One attempt per process, its failure remembered too: without a compiler, every loss call would
    otherwise run the compiler again."""
    try:
        return _build_and_load()
    except NativeUnavailable as e:
        log.debug("native RL kernels unavailable: %s", e)
        return e


def library() -> ctypes.CDLL:
    """The loaded kernels; raises ``NativeUnavailable`` with the reason when they cannot be built here."""
    lib = _loaded()
    if isinstance(lib, NativeUnavailable):
        raise NativeUnavailable(*lib.args)
    return lib


def available() -> bool:
    return not isinstance(_loaded(), NativeUnavailable)


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="scifolio-rl")


def _ranges(offsets: Tensor, threads: int | None) -> list[tuple[int, int]]:
    """Split segments [0, R) into ≤ ``threads`` contiguous ranges of about equal token count."""
    n_seg = offsets.numel() - 1
    total = int(offsets[-1])
    nt = max(1, min(threads or torch.get_num_threads(), total // MIN_TOKENS_PER_THREAD, n_seg))
    if nt == 1:
        return [(0, n_seg)]
    marks = torch.linspace(0, total, nt + 1, dtype=torch.float64)[1:-1].to(offsets.dtype)
    cuts = [0, *torch.searchsorted(offsets, marks).tolist(), n_seg]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _run(fn, ranges: list[tuple[int, int]]) -> list:  # noqa: ANN001
    if len(ranges) == 1:
        return [fn(*ranges[0])]
    return list(_pool(len(ranges)).map(lambda r: fn(*r), ranges))


def _check_packed(name: str, t: Tensor, n: int) -> None:
    if t.device.type != "cpu" or t.dtype != torch.float32 or t.dim() != 1 or t.numel() != n:
        raise ValueError(f"{name} must be a 1-D float32 CPU tensor of {n} elements, got {t.dtype} {tuple(t.shape)}")


def _check_offsets(offsets: Tensor, n: int) -> Tensor:
    if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError("offsets must be a 1-D int64 tensor [R + 1]")
    offsets = offsets.contiguous()
    if int(offsets[0]) != 0 or int(offsets[-1]) != n:
        raise ValueError(f"offsets must run from 0 to the number of tokens {n}")
    return offsets


def offsets_of(lengths: Tensor) -> Tensor:
    """``[R]`` segment lengths (any shape, flattened) → ``[R + 1]`` int64 offsets starting at 0."""
    flat = lengths.reshape(-1).to(torch.int64)
    out = torch.zeros(flat.numel() + 1, dtype=torch.int64)
    torch.cumsum(flat, 0, out=out[1:])
    return out


def segment_sums(values: Tensor, offsets: Tensor, threads: int | None = None) -> Tensor:
    """Per-segment sums (float64 ``[R]``) of the float32 packed ``values``; segment s is
    ``values[offsets[s]:offsets[s+1]]``."""
    values = values.contiguous()
    offsets = _check_offsets(offsets, values.numel())
    _check_packed("values", values, values.numel())
    lib = library()
    out = torch.empty(offsets.numel() - 1, dtype=torch.float64)
    ptrs = values.data_ptr(), offsets.data_ptr(), out.data_ptr()
    _run(lambda a, b: lib.sr_segment_sums(ptrs[0], ptrs[1], a, b, ptrs[2]), _ranges(offsets, threads))
    return out


def packed_loss_grad(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    offsets: Tensor,
    coef: Tensor,
    keep: Tensor | None,
    lo: float,
    hi: float,
    grad_out: Tensor | None = None,
    threads: int | None = None,
) -> tuple[float, int, Tensor]:
    """One pass over the packed tokens: ``g = m·clip(exp(lp − beh), lo, hi)·coef_s`` into ``grad_out``,
    ``loss = Σ g·lp`` (float64) and the number of kept tokens outside ``[lo, hi]``.

    logprobs, behaviour_logprobs: float32 ``[N]``; offsets: int64 ``[R + 1]``; coef: float32 ``[R]``
    (Ã/−Σ|y| per response); keep: bool/uint8 ``[N]`` or None. Returns ``(loss, n_clipped, grad)``.
    """
    n = logprobs.numel()
    logprobs, behaviour_logprobs = logprobs.contiguous(), behaviour_logprobs.contiguous()
    _check_packed("logprobs", logprobs, n)
    _check_packed("behaviour_logprobs", behaviour_logprobs, n)
    offsets = _check_offsets(offsets, n)
    coef = coef.reshape(-1).to(torch.float32).contiguous()
    if coef.numel() != offsets.numel() - 1:
        raise ValueError(f"coef has {coef.numel()} entries for {offsets.numel() - 1} segments")
    if keep is not None:
        if keep.numel() != n:
            raise ValueError(f"keep has {keep.numel()} entries for {n} tokens")
        keep = keep.reshape(-1).contiguous()
        keep = keep.view(torch.uint8) if keep.dtype == torch.bool else keep.to(torch.uint8)
    if not 0.0 <= lo <= hi:
        raise ValueError(f"clip bounds must satisfy 0 <= lo <= hi, got {lo}, {hi}")
    grad = torch.empty_like(logprobs) if grad_out is None else grad_out
    if grad.shape != logprobs.shape or grad.dtype != torch.float32 or not grad.is_contiguous():
        raise ValueError("grad_out must be a contiguous float32 tensor shaped like logprobs")
    lib = library()
    # The clip test runs in log space on float32 d, so compare against the float32 logs of the bounds.
    log_lo = math.log(lo) if lo > 0 else -math.inf
    log_hi = math.log(hi) if math.isfinite(hi) else math.inf
    keep_ptr = None if keep is None else keep.data_ptr()
    ptrs = (logprobs.data_ptr(), behaviour_logprobs.data_ptr(), offsets.data_ptr(), coef.data_ptr())

    def part(a: int, b: int) -> tuple[float, int]:
        loss, clipped = ctypes.c_double(), ctypes.c_int64()
        lib.sr_packed_loss_grad(
            *ptrs, keep_ptr, a, b, lo, hi, log_lo, log_hi, grad.data_ptr(), ctypes.byref(loss), ctypes.byref(clipped)
        )
        return loss.value, clipped.value

    parts = _run(part, _ranges(offsets, threads))
    return math.fsum(p[0] for p in parts), sum(p[1] for p in parts), grad


BACKENDS = ("auto", "native", "torch")


@functools.cache
def _warn_unavailable() -> None:
    log.warning("native RL kernels unavailable, using the PyTorch path (slower): %s", _loaded())


def use_native(backend: str, *tensors: Tensor) -> bool:
    """Whether a ``backend`` choice runs the C kernels on these tensors.

    ``"torch"``: never. ``"native"``: always; raises ``ValueError`` for tensors it cannot take (not
    float32 on the CPU) and ``NativeUnavailable`` if the library cannot be built. ``"auto"``: when the
    tensors are float32 on the CPU and the library builds; otherwise the PyTorch path (GPU tensors take
    it by design; an unbuildable library is logged once as a warning).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    eligible = all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    if backend == "native":
        if not eligible:
            raise ValueError("the native backend takes float32 CPU tensors; use backend='torch' or 'auto'")
        library()
        return True
    if eligible and not available():
        _warn_unavailable()
    return eligible and available()
