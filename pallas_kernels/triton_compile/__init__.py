"""Compile this repository's Pallas kernels for real NVIDIA GPUs on a machine without one.

    python -m pallas_kernels.triton_compile [--target sm_90|sm_80|all] [--json PATH] [--markdown]

(the kernel benchmark's GPU shapes; every kernel the model launches: ``make triton-report``,
i.e. ``python -m inference_lab.triton_report``, which builds on this module).

On an NVIDIA GPU, ``pallas_call`` lowers to Triton IR (TTIR) that XLA hands to its own copy
of Triton. Here the same TTIR is produced on a CPU and given to the ``triton`` package
(``pip install triton``: the compiler needs no GPU), which takes it through its NVIDIA
pipeline to PTX and a cubin. That reports what only a compile can: the shared memory each
program needs, its registers and spills, and whether it fits the device at all.

How (each step is public jax/Triton behaviour, except the two private jax names marked below):

1. **Capture** (:func:`capture_kernels`). ``fn`` is traced and lowered for CUDA,
   ``jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))``, under an *abstract*
   GPU (an ``AbstractMesh`` over an ``AbstractDevice``; ``jax._src.mesh``, private: there is
   no public export yet) with the kernels' ``"pallas"`` mode allowed. Nothing runs and
   nothing is allocated, so ``jax.ShapeDtypeStruct`` arguments are enough. Every Pallas
   kernel becomes a ``stablehlo.custom_call @__gpu$xla.gpu.triton`` whose backend config
   carries the kernel's name, ``num_warps``, ``num_stages``, the grid (``grid_x/y/z``) and
   the TTIR module as MLIR bytecode (``ir``): exactly what XLA compiles on a GPU. The
   bytecode is parsed with jaxlib's Triton dialect (``jax._src.lib.triton``, private) and
   printed as TTIR text.
2. **Compile** (:func:`compile_kernel`). ``triton.compile(path.ttir, target=GPUTarget("cuda",
   90 or 80, 32), options={"num_warps", "num_stages"})`` runs Triton's passes (layouts,
   software pipelining over ``num_stages`` shared-memory buffers) and writes PTX and a cubin;
   ``metadata.shared`` is the dynamic shared memory a program needs. Registers and spills
   come from running the ``ptxas`` that Triton itself uses for that architecture, with
   Triton's flags and ``-v``, on the PTX (about 1 s per kernel in all).
3. **Check** against the device: shared memory per block and registers per block (limits in
   :data:`TARGETS`, with sources), spills, and an estimate of resident programs per SM.

What this proves and what it does not: a kernel that compiles here with Triton 3.9 for
``sm_90a``/``sm_80`` is valid TTIR that a current Triton takes through the full NVIDIA
pipeline, and its resource use is what that Triton produces. XLA compiles the same TTIR with
*its own bundled Triton* (:func:`versions` names both) and its own ``ptxas``, so figures can
differ a little and a version gap is reported as a warning. Speed and numerics still need a GPU.

``triton`` is imported lazily: ``pallas_kernels`` imports fine without it, and the functions
that need it raise :class:`TritonUnavailable` with what to install.
"""

from pallas_kernels.triton_compile.capture import (CUSTOM_CALL_TARGET, TARGETS, TRITON_PIN, Kernel, Target,
                                                   abstract_gpu, capture_kernels, get_target, kernels_in_module,
                                                   unique)
from pallas_kernels.triton_compile.compiler import (XLA_TRITON, Compiled, CompileError, TritonUnavailable, compile_kernel,
                                                    triton_problem, version_warning, versions)
from pallas_kernels.triton_compile.report import (Row, benchmark_cases, compile_all, failures, format_table, main,
                                                  print_report, report, write_json)

__all__ = ["CUSTOM_CALL_TARGET", "TARGETS", "TRITON_PIN", "Kernel", "Target", "abstract_gpu", "capture_kernels",
           "get_target", "kernels_in_module", "unique", "Compiled", "CompileError", "TritonUnavailable",
           "compile_kernel", "XLA_TRITON", "triton_problem", "version_warning", "versions", "Row", "benchmark_cases",
           "compile_all", "failures", "format_table", "main", "print_report", "report", "write_json"]
