"""XLA's own compile for an NVIDIA H200, on a machine without a GPU: the optimised program a GPU runs.

    python scripts/compile_for_h200.py            (in an environment with jax's CUDA plugin, see below)

Lowering for CUDA on a CPU (``tests/test_model_lowers_for_cuda.py``) shows what jax hands XLA; this
goes one step further and runs XLA:GPU's whole optimisation pipeline for an H200 (fusion, layout,
buffer assignment, in-place decisions), so what a GPU would copy or rewrite can be read on a laptop.
jax 0.11.2 can compile "deviceless" through its CUDA plugin: a compile-only topology made from a
``GpuTargetConfig`` (the device description XLA would otherwise query from the GPU), no driver.

Set-up (no GPU, ~4.5 GB; the pins of constraints.txt)::

    python3.12 -m venv /tmp/cuda-venv && /tmp/cuda-venv/bin/pip install -c constraints.txt "jax[cuda13]==0.11.2" flax
    PYTHONPATH=. /tmp/cuda-venv/bin/python scripts/compile_for_h200.py

Limits: no autotuning (XLA picks GEMM tiles by its heuristics, not by timing them on the device);
a Mosaic GPU kernel stays a custom call (jaxlib compiles it when the program first runs).

The checks it runs (exit code 1 if one fails; docs/benchmarks.md has the first run):
1. the kernel benchmark's timed loop (:class:`pallas_kernels.timing.InOneProgram`) around XLA's matmul
   at the decode shapes of ``base`` and ``llama3_8b`` (M = 1 and 64): it writes no weight-sized buffer
   that the matmul called alone does not (XLA alone computes some one-row products as a weight-sized
   elementwise product and a sum); the loop it replaced rewrote the whole weight every call;
2. the model's decode step (``base``, two layers, caches donated) on the Triton and Mosaic tiers: no
   cache-sized copy.
"""

from __future__ import annotations

import os
import sys
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # before jax starts a backend: the CUDA plugin's
                                                # start-up check needs a driver (no GPU: it is dropped)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

# The device XLA compiles for (what it would query from an H200): 132 SMs, 227 KiB of shared memory
# a block may opt into, a 50 MiB L2, 4.8 TB/s (the datasheet), compute capability 9.0.
H200 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 150754820096 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
runtime_version { major: 13 minor: 0 }
device_description_str: "NVIDIA H200"
"""


def h200_sharding() -> NamedSharding:
    """Where an abstract argument lives: the one device of a compile-only H200 topology."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="cuda", target_config=H200, topology="1x1x1")
    return NamedSharding(topologies.make_mesh(topology, (1,), ("x",)), PartitionSpec())


def compiled_text(jitted, *args) -> str:
    """The optimised HLO of ``jitted`` (a ``jax.jit`` object) for an H200, for arguments shaped like
    ``args`` (arrays or ShapeDtypeStructs, pytrees allowed). Pallas kernels lower for the H200 too
    (an abstract H200 mesh tells them the compute capability)."""
    from jax._src import mesh as mesh_lib   # AbstractDevice has no public export yet

    import pallas_kernels.mode as mode

    sharding = h200_sharding()
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
    device = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    mesh = mesh_lib.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)
    with mode.assume_gpu("NVIDIA H200", (9, 0)), jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # the Triton backend's deprecation
        return jitted.trace(*specs).lower().compile().as_text()


def _add_loop(fn, calls: int = 8):
    """The kernel benchmark's loop until 2026-12-04: ``0 * out`` *added* to element 0 of every argument."""
    def run(*args):
        def body(i, carry):
            xs, acc = carry
            out = fn(*xs).reshape(-1)[0].astype(jnp.float32)
            return [x.at[(0,) * x.ndim].add((out * 0).astype(x.dtype)) for x in xs], acc + out
        return lax.fori_loop(0, calls, body, (list(args), jnp.float32(0)))[1]
    return jax.jit(run)


def check_timed_loop() -> list[str]:
    """Check 1: weight-sized writes per call of XLA's matmul alone, in the timed loop and in the old one."""
    from inference_lab.runtime import hlo
    from pallas_kernels.bench import DECODE_PROJECTIONS, xla_matmul
    from pallas_kernels.timing import InOneProgram

    failures = []
    bf16 = jnp.bfloat16
    timed_loop = InOneProgram(xla_matmul, (jnp.ones((1, 16), bf16), jnp.ones((16, 16), bf16))).jitted
    for model, projections in DECODE_PROJECTIONS.items():
        for name, (k, n) in projections.items():
            for m in (1, 64):
                x, w = jax.ShapeDtypeStruct((m, k), bf16), jax.ShapeDtypeStruct((k, n), bf16)
                alone = hlo.count_cache_copies(compiled_text(jax.jit(xla_matmul), x, w), k * n)
                new = hlo.count_cache_copies(compiled_text(timed_loop, jax.ShapeDtypeStruct((), jnp.int32), x, w), k * n)
                old = hlo.count_cache_copies(compiled_text(_add_loop(xla_matmul), x, w), k * n)
                print(f"  {model} {name:<8} M{m:<3} K{k:<6} N{n:<7} weight-sized writes in the program: alone {alone}, "
                      f"timed loop {new}, the old loop {old}")
                if new > alone:
                    failures.append(f"the timed loop adds {new - alone} weight-sized writes to {model} {name} M{m}")
    return failures


def check_decode_step() -> list[str]:
    """Check 2: cache-sized copies in the model's decode step on both tiers (caches donated)."""
    from flax import nnx

    from inference_lab.base.config import ModelConfig
    from inference_lab.model import transformer
    from inference_lab.runtime import hlo

    failures = []
    cfg = ModelConfig.preset("base", n_layers=2)
    transformer._Initializer.HOST_MAX_PARAMS = 0   # weights drawn by jax, so eval_shape allocates nothing
    params = jax.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference").params())
    batch, context = 8, 4096
    cache = [jax.ShapeDtypeStruct((batch, context, cfg.n_kv_heads, cfg.head_dim), jnp.bfloat16)] * cfg.n_layers
    rows = jax.ShapeDtypeStruct((batch,), jnp.int32)
    for tier in ("triton", "pallas"):
        def decode(p, tokens, lengths, k, v, tier=tier):
            return transformer.decode_forward(p, tokens, lengths, k, v, cfg=cfg, mode=tier)

        text = compiled_text(jax.jit(decode, donate_argnums=(3, 4)), params, rows, rows, cache, cache)
        copies = hlo.count_cache_copies(text, batch * context * cfg.n_kv_heads * cfg.head_dim)
        print(f"  base decode step, 2 layers, batch {batch}, {context} cached, tier {tier}: cache-sized copies {copies}")
        if copies:
            failures.append(f"the {tier} decode step copies a cache {copies} times")
    return failures


def main() -> int:
    try:
        h200_sharding()
    except Exception as err:  # noqa: BLE001 - any failure here means: no CUDA plugin to compile with
        print(f"compile_for_h200: cannot compile for CUDA here ({type(err).__name__}: {str(err)[:200]}); "
              "install jax[cuda13] as the module docstring says", file=sys.stderr)
        return 2
    print(f"jax {jax.__version__}: compiling for an H200 (compute capability 9.0) on {jax.devices()[0].device_kind}")
    print("1. the kernel benchmark's timed loop around XLA's one-row matmul (bf16):")
    failures = check_timed_loop()
    print("2. the model's decode step:")
    failures += check_decode_step()
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
