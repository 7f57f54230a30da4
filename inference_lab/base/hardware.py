"""What a chip can do: peak FLOP/s per dtype, memory bandwidth, memory, interconnect.

``PRESETS`` holds datasheet figures (dense, i.e. without 2:4 sparsity), each with its source.
``measure_ceilings()`` measures the same two ceilings on this machine, because a datasheet
peak is a promise and the lessons compare against what this machine really reaches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from inference_lab.base import checks

# Both vocabularies are accepted: jnp dtype names and the short datasheet keys.
_DTYPE_KEYS = {
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "fp16": "fp16", "half": "fp16",
    "float32": "fp32", "fp32": "fp32",
    "tf32": "tf32",
    "float8": "fp8", "fp8": "fp8", "float8_e4m3fn": "fp8",
    "int8": "int8",
}
FLOP_KEYS = ("bf16", "fp16", "fp32", "tf32", "fp8", "int8")

TB = 1e12
GB = 1e9


def dtype_key(dtype) -> str:
    """``"bfloat16"``/``"bf16"``/``jnp.bfloat16`` -> ``"bf16"`` (the datasheet vocabulary)."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    key = _DTYPE_KEYS.get(str(name).lower())
    if key is None:
        raise ValueError(f"dtype={dtype!r} is not known; use one of {', '.join(sorted(_DTYPE_KEYS))}")
    return key


@dataclasses.dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or this CPU): its ceilings and where each figure comes from."""

    name: str
    flops: dict  # dense FLOP/s keyed by FLOP_KEYS (a part may lack some keys)
    bandwidth: float  # memory bandwidth, bytes/s: the rate memory can be *read* (what decode does)
    memory_bytes: float | None = None
    interconnect_bandwidth: float | None = None  # bytes/s between chips, None if none
    sources: dict = dataclasses.field(default_factory=dict)  # figure -> where it comes from
    overhead_s: float | None = None  # fixed cost of one call (dispatch/launch), measured; None if unknown
    copy_bandwidth: float | None = None  # read + write bytes/s of an in-place copy, measured (not a ceiling)
    allreduce_latency_s: float | None = None  # fixed cost of one small all-reduce between chips; None if unknown

    def __post_init__(self):
        if not isinstance(self.flops, dict) or not self.flops:
            raise ValueError(f"HardwareSpec.flops for {self.name!r} must be a non-empty dict of FLOP/s by dtype")
        for key, value in self.flops.items():
            if key not in FLOP_KEYS:
                raise ValueError(f"HardwareSpec.flops key {key!r} for {self.name!r}: use one of {FLOP_KEYS}")
            if not checks.is_positive(value):
                raise ValueError(f"HardwareSpec.flops[{key!r}]={value!r} for {self.name!r} must be a finite "
                                 "positive number")
        if not checks.is_positive(self.bandwidth):
            raise ValueError(f"HardwareSpec.bandwidth={self.bandwidth!r} for {self.name!r} must be finite "
                             "positive bytes/s")
        for field in ("memory_bytes", "interconnect_bandwidth", "overhead_s", "copy_bandwidth", "allreduce_latency_s"):
            value = getattr(self, field)
            if value is not None and not checks.is_positive(value):
                raise ValueError(f"HardwareSpec.{field}={value!r} for {self.name!r} must be a finite positive "
                                 "number or None")

    def peak_flops(self, dtype="bf16") -> float:
        """Dense peak FLOP/s for a dtype (``"bfloat16"`` or ``"bf16"``; ``"float32"`` is fp32)."""
        key = dtype_key(dtype)
        if key not in self.flops:
            raise ValueError(
                f"{self.name} has no {key} figure; it has {', '.join(self.flops)}"
            )
        return self.flops[key]

    def ridge_point(self, dtype="bf16") -> float:
        """FLOP per byte at which compute time equals memory time."""
        return self.peak_flops(dtype) / self.bandwidth


_NVIDIA_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (SXM column, dense = half the sparsity figure)"
_NVIDIA_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (SXM column, dense = half the sparsity figure)"
_NVIDIA_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column, dense)"
_NVIDIA_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet (dense = half the sparsity figure)"
_NVIDIA_ADA_WP = "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (FP32 accumulate, dense)"
_GOOGLE_V5E = "Google Cloud TPU v5e documentation, system architecture (per chip)"
# A decode step's all-reduces carry a few KB each: at that size their fixed cost is what they cost.
_ALLREDUCE_H100 = ("sgl-project/sglang PR 2904: one 512 B-32 KB all-reduce on H100 NVLink, TP 2-8, 3.7-11.8 us "
                   "(custom all-reduce kernels, no CUDA graph); 8 us taken")

PRESETS: dict[str, HardwareSpec] = {
    "H100_SXM": HardwareSpec(
        name="H100 SXM",
        flops={"bf16": 989.4 * TB, "fp16": 989.4 * TB, "tf32": 494.7 * TB, "fp32": 66.9 * TB,
               "fp8": 1978.9 * TB, "int8": 1978.9 * TB},
        bandwidth=3.35 * TB, memory_bytes=80 * GB, interconnect_bandwidth=900 * GB, allreduce_latency_s=8e-6,
        sources={"flops": _NVIDIA_H100_DS, "bandwidth": _NVIDIA_H100_DS + ": 3.35 TB/s HBM3",
                 "memory_bytes": _NVIDIA_H100_DS + ": 80 GB",
                 "interconnect_bandwidth": _NVIDIA_H100_DS + ": NVLink 900 GB/s (total, both directions)",
                 "allreduce_latency_s": _ALLREDUCE_H100},
    ),
    "H200": HardwareSpec(
        name="H200 SXM",
        flops={"bf16": 989.4 * TB, "fp16": 989.4 * TB, "tf32": 494.7 * TB, "fp32": 66.9 * TB,
               "fp8": 1978.9 * TB, "int8": 1978.9 * TB},
        bandwidth=4.8 * TB, memory_bytes=141 * GB, interconnect_bandwidth=900 * GB, allreduce_latency_s=8e-6,
        sources={"flops": _NVIDIA_H200_DS, "bandwidth": _NVIDIA_H200_DS + ": 4.8 TB/s HBM3e",
                 "memory_bytes": _NVIDIA_H200_DS + ": 141 GB",
                 "interconnect_bandwidth": _NVIDIA_H200_DS + ": NVLink 900 GB/s (total, both directions)",
                 "allreduce_latency_s": _ALLREDUCE_H100},
    ),
    "A100_80GB": HardwareSpec(
        name="A100 80GB SXM",
        flops={"bf16": 312 * TB, "fp16": 312 * TB, "tf32": 156 * TB, "fp32": 19.5 * TB,
               "int8": 624 * TB},
        bandwidth=2.039 * TB, memory_bytes=80 * GB, interconnect_bandwidth=600 * GB,
        sources={"flops": _NVIDIA_A100_DS + " (no FP8 tensor cores)",
                 "bandwidth": _NVIDIA_A100_DS + ": 2,039 GB/s HBM2e",
                 "memory_bytes": _NVIDIA_A100_DS + ": 80 GB",
                 "interconnect_bandwidth": _NVIDIA_A100_DS + ": NVLink 600 GB/s (total)"},
    ),
    "L4": HardwareSpec(
        name="L4",
        flops={"bf16": 121 * TB, "fp16": 121 * TB, "tf32": 60 * TB, "fp32": 30.3 * TB,
               "fp8": 242.5 * TB, "int8": 242.5 * TB},
        bandwidth=300 * GB, memory_bytes=24 * GB, interconnect_bandwidth=64 * GB,
        sources={"flops": _NVIDIA_L4_DS, "bandwidth": _NVIDIA_L4_DS + ": 300 GB/s GDDR6",
                 "memory_bytes": _NVIDIA_L4_DS + ": 24 GB",
                 "interconnect_bandwidth": _NVIDIA_L4_DS + ": PCIe Gen4 x16, 64 GB/s (no NVLink)"},
    ),
    "RTX_4090": HardwareSpec(
        name="GeForce RTX 4090",
        flops={"bf16": 165.2 * TB, "fp16": 165.2 * TB, "tf32": 82.6 * TB, "fp32": 82.6 * TB,
               "fp8": 330.3 * TB, "int8": 660.6 * TB},
        bandwidth=1.008 * TB, memory_bytes=24 * GB, interconnect_bandwidth=64 * GB,
        sources={"flops": _NVIDIA_ADA_WP, "bandwidth": _NVIDIA_ADA_WP + ": 1,008 GB/s GDDR6X",
                 "memory_bytes": _NVIDIA_ADA_WP + ": 24 GB",
                 "interconnect_bandwidth": "PCIe Gen4 x16, 64 GB/s (the 4090 has no NVLink)"},
    ),
    "TPU_v5e": HardwareSpec(
        name="TPU v5e",
        flops={"bf16": 197 * TB, "int8": 394 * TB},
        bandwidth=819 * GB, memory_bytes=16 * GB, interconnect_bandwidth=200 * GB,
        sources={"flops": _GOOGLE_V5E + ": 197 TFLOP/s bf16, 394 TOP/s int8",
                 "bandwidth": _GOOGLE_V5E + ": 819 GB/s HBM2",
                 "memory_bytes": _GOOGLE_V5E + ": 16 GB",
                 "interconnect_bandwidth": _GOOGLE_V5E + ": ICI 1,600 Gbps = 200 GB/s"},
    ),
}


# ----------------------------------------------------------------------------- this machine
def processor_name() -> str:
    """The model string of the processor the lab runs on: the GPU's (``"NVIDIA H200"``) or,
    on a CPU, the CPU's (``"AMD Ryzen 7 5800X 8-Core Processor"``). Never a host or user name."""
    import jax

    dev = jax.devices()[0]
    name = dev.device_kind if dev.platform != "cpu" else _cpu_model()
    return " ".join("".join(c for c in str(name) if c.isprintable()).split())[:100] or "unknown"


def _cpu_model() -> str:
    import platform
    import subprocess

    try:  # Linux
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=5)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return platform.processor() or platform.machine() or "cpu"


def cpu_caches(root: str = "/sys/devices/system/cpu") -> dict:
    """This CPU's data caches as the operating system reports them: ``{"L1d": (bytes per
    instance, instances), "L2": ..., "L3": ...}`` (Linux sysfs; on macOS ``sysctl``; ``{}``
    where neither answers). A cache shared by several cores is one instance. What a virtual
    machine reports may be the host's whole cache, not the share this machine gets."""
    import glob
    import os

    found: dict = {}
    for index in glob.glob(os.path.join(root, "cpu[0-9]*", "cache", "index[0-9]*")):
        try:
            with open(os.path.join(index, "level")) as fh:
                level = fh.read().strip()
            with open(os.path.join(index, "type")) as fh:
                kind = fh.read().strip()
            with open(os.path.join(index, "size")) as fh:
                size = _size_bytes(fh.read().strip())
            with open(os.path.join(index, "shared_cpu_list")) as fh:
                shared = fh.read().strip()
        except OSError:
            continue
        if kind == "Instruction" or size is None:
            continue
        name = f"L{level}" + ("d" if level == "1" else "")
        found.setdefault(name, {})[shared] = size
    if found:
        return {name: (max(per.values()), len(per)) for name, per in sorted(found.items())}
    return _sysctl_caches()


def _size_bytes(text: str) -> int | None:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().rstrip("B")
    try:
        return int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)
    except (ValueError, KeyError):
        return None


def _sysctl_caches() -> dict:
    import platform
    import subprocess

    if platform.system() != "Darwin":
        return {}
    out = {}
    for name, key in (("L1d", "hw.l1dcachesize"), ("L2", "hw.l2cachesize"), ("L3", "hw.l3cachesize")):
        try:
            value = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if value.isdigit() and int(value) > 0:
            out[name] = (int(value), 1)
    return out


def last_level_cache_bytes() -> int | None:
    """Bytes of this CPU's largest cache level, all its instances together (None: not reported)."""
    caches = cpu_caches()
    if not caches:
        return None
    size, count = caches[max(caches, key=lambda k: int(k[1]))]
    return size * count


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def processor_summary() -> str:
    """The processor, its cores and caches in one line, to print beside every CPU figure
    (``"AMD EPYC, 2 cores, L1d 2 x 32 KiB, L2 2 x 512 KiB, L3 32 MiB"``); a GPU's name on a GPU."""
    import os

    import jax

    if jax.devices()[0].platform != "cpu":
        return processor_name()
    parts = [processor_name(), f"{os.cpu_count()} cores"]
    for name, (size, count) in cpu_caches().items():
        parts.append(f"{name} {count} x {_mib(size)}" if count > 1 else f"{name} {_mib(size)}")
    return ", ".join(parts)


def _read_limit(path) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            text = fh.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None   # "max": no limit


def _cgroup_limits(root="/sys/fs/cgroup", self_cgroup="/proc/self/cgroup") -> list[int]:
    """Memory limits of this process's cgroup and its ancestors (cgroup v2), or of its v1
    memory controller: what a container or a batch scheduler lets it use."""
    from pathlib import Path

    root = Path(root)
    limits = []
    try:
        with open(self_cgroup, encoding="utf-8", errors="replace") as fh:
            lines = fh.read(65536).splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("0::"):  # v2: one unified hierarchy; walk up to the root
            here = root / line[3:].strip().lstrip("/")
            while True:
                limit = _read_limit(here / "memory.max")
                if limit:
                    limits.append(limit)
                if here == root or root not in here.parents:
                    break
                here = here.parent
    for v1 in (root / "memory" / "memory.limit_in_bytes", root / "memory.max"):
        limit = _read_limit(v1)
        if limit:
            limits.append(limit)
    return limits


def process_memory_limit() -> int | None:
    """Bytes this process may allocate on a CPU: the smallest of physical RAM, its cgroup's
    memory limit (a container's, a scheduler's) and its address-space and data limits
    (``ulimit -v``/``-d``). None where none of them can be read."""
    import os

    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    limits += _cgroup_limits()
    try:
        import resource

        for which in (resource.RLIMIT_AS, getattr(resource, "RLIMIT_DATA", None)):
            if which is not None:
                soft = resource.getrlimit(which)[0]
                if soft != resource.RLIM_INFINITY and soft > 0:
                    limits.append(soft)
    except (ImportError, ValueError, OSError):
        pass
    return min(limits) if limits else None


# ----------------------------------------------------------------------------- measured ceilings
_CEILINGS_PRINTED: set = set()


def ceiling_sizes(backend: str, key: str) -> tuple[int, int]:
    """(matmul n for n x n x n, streamed buffer bytes) per backend: big enough to reach the
    ceiling, small enough to finish in about a second (bf16 matmuls are slow on CPUs). On a CPU
    the buffer is at least four times the last-level cache the processor reports (256 MiB on a
    machine with a 32 MiB L3; 2 GiB beside a 260 MiB one), so the read comes from memory."""
    if backend == "cpu":
        llc = last_level_cache_bytes() or 0
        stream = 256 * 2**20
        while stream < 4 * llc and stream < 4 * 2**30:
            stream *= 2
        return (2048 if key == "fp32" else 1024), stream
    return (8192 if key in ("bf16", "fp16", "fp8", "int8") else 4096), 2**30


# What a measured ceiling can be on any machine the lab runs on, from a laptop core to the largest
# GPU (an H200 is ~1e15 FLOP/s and 4.8e12 B/s): a cache or a file outside these is damaged, not
# a machine. The probe schema's ceilings use the same bounds.
CEILING_BOUNDS = {"flops": (1e6, 1e18), "bandwidth": (1e6, 1e15), "copy_bandwidth": (1e6, 1e15),
                  "overhead_s": (1e-9, 10.0)}


def _out_of_bounds(field: str, value) -> str | None:
    low, high = CEILING_BOUNDS[field]
    if not checks.is_positive(value) or not low <= value <= high:
        return f"{field} is {value!r}, outside what any machine measures ({low:g}..{high:g})"
    return None


def _cache_problem(data, ident: dict, key: str) -> str | None:
    """Why a ceilings-cache file's contents cannot be used (None when they can)."""
    if not isinstance(data, dict):
        return f"it holds {type(data).__name__} {str(data)[:30]!r}, not an object"
    for field in ("ident", "name", "flops", "bandwidth", "sources"):
        if field not in data:
            return f"it lacks the field {field!r}"
    if data["ident"] != ident:
        return "it was measured for another device, jax version or method"
    if not isinstance(data["name"], str) or not data["name"] or len(data["name"]) > 200:
        return f"name {str(data['name'])[:30]!r} is not a device name"
    flops = data["flops"]
    if not isinstance(flops, dict) or not checks.is_positive(flops.get(key)):
        return f"flops[{key!r}] is {flops.get(key) if isinstance(flops, dict) else flops!r}, not a positive number"
    problem = _out_of_bounds("flops", flops[key]) or _out_of_bounds("bandwidth", data["bandwidth"])
    if problem:
        return problem
    memory = data.get("memory_bytes")
    if memory is not None and not checks.is_positive(memory):
        return f"memory_bytes is {memory!r}, not a positive number"
    sources = data["sources"]
    if not isinstance(sources, dict) or not all(isinstance(sources.get(k), str) for k in ("flops", "bandwidth")):
        return "sources lacks the methods of the two measurements"
    for field in ("overhead_s", "copy_bandwidth"):
        value = data.get(field)   # overhead_s: absent in files from before it was measured, added on read
        if value is not None and _out_of_bounds(field, value):
            return _out_of_bounds(field, value)
    return None


def _read_cache(path, ident: dict, key: str):
    """The cached measurement at ``path``, or None (missing, or damaged: said in one line)."""
    import json
    import sys

    if not path.exists():
        return None
    try:
        if not path.is_file():
            raise ValueError("it is not a regular file")
        with path.open("rb") as fh:
            raw = fh.read(1 << 20)
        data = json.loads(raw.decode("utf-8"))
        problem = _cache_problem(data, ident, key)
    except (OSError, ValueError, RecursionError) as err:   # UnicodeDecodeError is a ValueError
        problem = f"it is not readable JSON ({str(err).splitlines()[0][:80]})"
    if problem is None:
        return data
    print(f"inference_lab: ceilings cache {path} is damaged: {problem}; measuring again", file=sys.stderr)
    return None


def _cached(path, ident: dict, key: str, *, refresh: bool, max_age_s, asked: float):
    """The cached measurement :func:`measure_ceilings` may use, or None: ``refresh`` takes only one
    written after ``asked`` (by a process it waited for), ``max_age_s`` none older than that."""
    try:
        written = path.stat().st_mtime
    except OSError:
        return None
    if (refresh and written < asked) or (max_age_s is not None and time.time() - written > max_age_s):
        return None
    data = _read_cache(path, ident, key)
    return data if data is not None and "overhead_s" in data else None


def _measure(dev, backend: str, key: str, ident: dict, path) -> dict:
    """Measure the ceilings (:func:`measure_ceilings`) and cache them at ``path``."""
    import json

    import jax.numpy as jnp

    from pallas_kernels.ceilings import call_overhead, device_ceilings
    from pallas_kernels.files import atomic_write_text

    n, nbytes = ceiling_sizes(backend, key)
    jdt = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}[key]
    measured = device_ceilings(n=n, nbytes=nbytes, dtype=jdt, repeats=5 if backend == "cpu" else 10)
    stats = getattr(dev, "memory_stats", lambda: None)() or {}
    memory = stats.get("bytes_limit")
    if memory is None and backend == "cpu":
        memory = process_memory_limit()
    data = {
        "ident": ident, "name": dev.device_kind, "flops": {key: float(measured["matmul_flops"])},
        "bandwidth": float(measured["bandwidth"]), "copy_bandwidth": float(measured["copy_bandwidth"]),
        "memory_bytes": memory,
        "sources": {"flops": measured["matmul_method"], "bandwidth": measured["bandwidth_method"],
                    "copy_bandwidth": measured["copy_method"]},
    }
    overhead = call_overhead()
    data["overhead_s"] = overhead["seconds"]
    data["sources"]["overhead"] = overhead["method"]
    try:
        atomic_write_text(path, json.dumps(data, indent=1))
    except OSError:
        pass  # read-only cache: the numbers are still returned
    return data


@contextlib.contextmanager
def _one_at_a_time(path):
    """Hold an exclusive lock beside ``path`` while inside: two processes that need the ceilings at
    once (two notebooks of a course run on two workers) measure them once, not side by side, where
    each would slow the other's matmul and read. No lock where the OS has none (then both measure)."""
    try:
        import fcntl
    except ImportError:       # Windows
        yield
        return
    try:
        handle = open(path.with_suffix(".lock"), "a")
    except OSError:           # a read-only cache folder: nothing to share either
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def measure_ceilings(dtype="bfloat16", refresh: bool = False, verbose: bool = True, *,
                     max_age_s: float | None = None) -> HardwareSpec:
    """This machine's two ceilings, measured: matmul FLOP/s in ``dtype`` and the rate it reads
    memory (``bandwidth``, what every MBU is against: decode reads), the floor under them
    (``overhead_s``, the fixed cost of one call), and beside them the rate it copies
    (``copy_bandwidth``, read + write counted; not a ceiling of decode).

    The measurement itself is :func:`pallas_kernels.ceilings.device_ceilings` (the same one the
    kernel benchmark uses): a large matmul in ``dtype`` (on a GPU XLA's best of three sizes), the
    fastest of four read-only kernels over a buffer several times the last-level cache (on a GPU
    never below the copy's rate), and an in-place copy of it, best of repeats, each timed over
    several calls in one program on a GPU (on a CPU the matmul and the read are the best of spells
    seconds apart); and :func:`pallas_kernels.ceilings.call_overhead`, the median time of a trivial
    jitted op (add 1 to a scalar), called and waited for.

    The result is cached as JSON under ``.cache/ceilings`` keyed by device, backend, jax and
    jaxlib versions and dtype (``refresh=True`` measures again; ``max_age_s``: measures again if
    the cached one is older). One process measures at a time: one that waited for another's
    measurement reads it, a ``refresh`` included (measured after it asked). A cache file that cannot be
    used (not JSON, not an object, a missing field, a bandwidth that is not a finite positive
    number...) is measured again, with one line naming the file. A process compiling without
    XLA's optimizations (``jax_disable_most_optimizations``: the unit tests) reads these ceilings
    but keeps what it measures in a file of its own. The method is printed once per process when
    ``verbose``.
    """
    import hashlib
    import json
    import os
    import platform

    import jax
    import jaxlib

    from inference_lab.base.disk_cache import cache_dir

    key = dtype_key(dtype)
    if key not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype={dtype!r}: measure_ceilings measures bfloat16, float16 or float32 matmuls")
    dev = jax.devices()[0]
    backend = jax.default_backend()
    # A CPU's device_kind is just "cpu": add the host and its processor (model, cores, caches), so
    # machines sharing one home folder (a JupyterHub image, say) do not share one machine's
    # ceilings, and a virtual machine moved to another kind of host measures its new one.
    ident = {"device": dev.device_kind, "backend": backend, "jax": jax.__version__,
             "jaxlib": jaxlib.__version__, "dtype": key, "host": platform.node(),
             "processor": processor_summary(), "cpus": os.cpu_count(),
             "method": "best-of, timed in one program; bandwidth = fastest read-only kernel (on a GPU never "
                       "below the copy); on a CPU matmul and read the best of spells seconds apart; copy beside it"}  # a new method: new files

    def cache_path(ident):
        digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]
        return cache_dir("ceilings") / f"{backend}-{key}-{digest}.json"

    path = cache_path(ident)
    asked = time.time()
    data = None
    if jax.config.read("jax_disable_most_optimizations"):
        # Programs compiled without XLA's optimizations (the unit tests: tests/conftest.py) read
        # the lessons' ceilings when there are some, but what they measure (slower reads) goes to
        # a file of its own: never the ceilings a lesson reads.
        with _one_at_a_time(path):
            data = _cached(path, ident, key, refresh=refresh, max_age_s=max_age_s, asked=asked)
        ident = dict(ident, xla_optimized=False)
        path = cache_path(ident)
    if data is None:
        with _one_at_a_time(path):
            data = _cached(path, ident, key, refresh=refresh, max_age_s=max_age_s, asked=asked)
            if data is None:
                data = _measure(dev, backend, key, ident, path)
    spec = HardwareSpec(name=data["name"], flops={key: float(data["flops"][key])}, bandwidth=float(data["bandwidth"]),
                        memory_bytes=data.get("memory_bytes"), sources=dict(data["sources"]),
                        overhead_s=data.get("overhead_s"), copy_bandwidth=data.get("copy_bandwidth"))
    if verbose and str(path) not in _CEILINGS_PRINTED:
        _CEILINGS_PRINTED.add(str(path))
        print(f"ceilings of {spec.name} ({backend}): matmul {spec.flops[key] / 1e9:,.1f} GFLOP/s "
              f"[{spec.sources['flops']}]; bandwidth {spec.bandwidth / 1e9:,.1f} GB/s "
              f"[{spec.sources['bandwidth']}]; overhead {spec.overhead_s * 1e6:,.1f} us per call "
              f"[{spec.sources.get('overhead', '?')}] (cached in {path})")
    return spec
