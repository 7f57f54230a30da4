"""Every kernel compiles with Triton for Hopper (sm_90) and Ampere (sm_80) on this CPU, and fits.

The kernels are lowered for an abstract NVIDIA GPU through the public functions
(``mode="triton"``), their Triton IR is compiled to PTX and a cubin by the ``triton`` package,
and each must compile and fit the device's shared memory and registers
(:mod:`pallas_kernels.triton_compile`). What this does not prove (speed, numerics, and XLA's
own bundled Triton agreeing) is said there. Skipped with the reason where ``triton`` is absent.
"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import pallas_kernels as pk
from pallas_kernels import triton_compile as tc
from pallas_kernels.triton_compile import compiler as tc_compiler

ROOT = Path(__file__).resolve().parent.parent
S, BF16 = jax.ShapeDtypeStruct, jnp.bfloat16
needs_triton = pytest.mark.skipif(tc.triton_problem() is not None, reason=str(tc.triton_problem()))


def _flash(causal):
    return lambda q, k, v: pk.flash_attention(q, k, v, causal=causal, mode="triton")


def _decode(q, k, v, n):
    return pk.decode_attention(q, k, v, n, mode="triton")


def _decode_int8(q, k, v, n, ks, vs):
    return pk.decode_attention(q, k, v, n, k_scales=ks, v_scales=vs, mode="triton")


def _paged(q, k, v, t, n):
    return pk.paged_decode_attention(q, k, v, t, n, mode="triton")


def _ragged(q, k, v, t, s, n):
    return pk.ragged_paged_attention(q, k, v, t, s, n, mode="triton")


def _matmul(a, b):
    return pk.matmul(a, b, mode="triton")


def _quantized(group_size=None, activations="float"):
    return lambda x, q, s: pk.quantized_matmul(x, q, s, group_size=group_size, activations=activations,
                                               mode="triton")


# Every kernel at a shape of each class it has: a prefill and a decode matmul, flash attention
# causal and not at head dims 64 and 128 (GQA 4:1), decode attention at 64 and 128.
CASES = {
    "matmul prefill 2048x2048x2048": (_matmul, (S((2048, 2048), BF16), S((2048, 2048), BF16))),
    "matmul decode M1 K4096 N4096": (_matmul, (S((1, 4096), BF16), S((4096, 4096), BF16))),
    **{f"flash {'causal' if c else 'full'} D{d}": (_flash(c), (S((1, 1024, 8, d), BF16),
                                                               S((1, 1024, 2, d), BF16), S((1, 1024, 2, d), BF16)))
       for d in (64, 128) for c in (True, False)},
    **{f"decode attention D{d}": (_decode, (S((4, 32, d), BF16), S((4, 2048, 8, d), BF16),
                                            S((4, 2048, 8, d), BF16), S((4,), jnp.int32)))
       for d in (64, 128)},
    **{f"paged decode attention D{d}": (_paged, (S((4, 32, d), BF16), S((513, 16, 8, d), BF16),
                                                  S((513, 16, 8, d), BF16), S((4, 128), jnp.int32), S((4,), jnp.int32)))
       for d in (64, 128)},
    **{f"ragged paged attention D{d}": (_ragged, (S((64, 32, d), BF16), S((513, 16, 8, d), BF16),
                                                  S((513, 16, 8, d), BF16), S((8, 64), jnp.int32), S((9,), jnp.int32),
                                                  S((8,), jnp.int32)))
       for d in (64, 128)},
    "decode attention over an int8 cache D128": (_decode_int8, (S((4, 32, 128), BF16), S((4, 2048, 8, 128), jnp.int8),
                                                             S((4, 2048, 8, 128), jnp.int8), S((4,), jnp.int32),
                                                             S((4, 2048, 8), jnp.float32), S((4, 2048, 8), jnp.float32))),
    "int8 matmul decode M1 K4096 N4096": (_quantized(), (S((1, 4096), BF16), S((4096, 4096), jnp.int8),
                                                          S((4096,), jnp.float32))),
    "int8 matmul prefill 2048x2048x2048": (_quantized(), (S((2048, 2048), BF16), S((2048, 2048), jnp.int8),
                                                           S((2048,), jnp.float32))),
    "int8 x int8 matmul decode M8 K4096 N4096": (_quantized(activations="int8"),
                                                 (S((8, 4096), BF16), S((4096, 4096), jnp.int8), S((4096,), jnp.float32))),
    **{f"int4 g{g} matmul decode M1 K4096 N4096": (_quantized(g), (S((1, 4096), BF16), S((2048, 4096), jnp.uint8),
                                                                   S((4096 // g, 4096), jnp.float32)))
       for g in (32, 128)},
    "int4 g64 matmul prefill 2048x2048x2048": (_quantized(64), (S((2048, 2048), BF16), S((1024, 2048), jnp.uint8),
                                                                S((32, 2048), jnp.float32))),
}


@needs_triton
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_compiles_and_fits(case, target):
    fn, args = CASES[case]
    (kernel,) = tc.capture_kernels(fn, *args, target=target, context=case)
    assert "tt.func" in kernel.ttir and kernel.programs >= 1
    c = tc.compile_kernel(kernel, target)   # raises CompileError if Triton or ptxas refuses
    assert c.ok, f"{case} cannot launch on {target}: {c.errors}"
    t = tc.TARGETS[target]
    assert c.ptx_target == ("sm_90a" if target == "sm_90" else "sm_80")
    assert 0 < c.shared <= t.shared_per_block and 0 < c.registers <= t.max_regs_per_thread
    assert c.blocks_per_sm >= 1


def test_capture_reads_launch_parameters():
    """Name, warps, stages and grid come from the custom call XLA would get (no triton needed)."""
    (k,) = tc.capture_kernels(_matmul, S((300, 512), BF16), S((512, 640), BF16), context="mm")
    assert (k.name, k.context) == ("matmul", "mm")
    assert k.num_warps in (1, 2, 4, 8, 16) and k.num_stages >= 1
    p = pk.matmul_plan(300, 512, 640, BF16, num_sms=132)   # the grid (tiles, K splits) it plans
    assert k.grid == p.grid + (1,) and k.programs == p.programs >= 1
    assert k.operands == ("300x512xbf16", "512x640xbf16")
    assert k.results == ((f"{p.grid[1]}x300x640xf32",) if p.grid[1] > 1 else ("300x640xbf16",))
    # Two calls of the same kernel at the same shapes are one unique kernel.
    ks = tc.capture_kernels(lambda a, b: _matmul(a, b) + _matmul(a, b), S((64, 256), BF16), S((256, 256), BF16))
    assert len(ks) == 2 and len(tc.unique(ks)) == 1
    # Outside abstract_gpu, "pallas" mode is refused again on this machine.
    if not pk.mode.pallas_supported():
        with pytest.raises(ValueError, match="cannot run here"):
            pk.matmul(jnp.ones((16, 16)), jnp.ones((16, 16)), mode="triton")


def _one_dot(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


@needs_triton
def test_limit_check_catches_a_kernel_that_cannot_launch():
    """A [64, 1024] @ [1024, 64] bf16 dot stages 256 KB of operands in shared memory: refused on sm_80."""
    def fn(a, b):
        return pl.pallas_call(_one_dot, out_shape=S((64, 64), BF16), grid=(1,),
                              compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1))(a, b)

    (k,) = tc.capture_kernels(fn, S((64, 1024), BF16), S((1024, 64), BF16))
    c = tc.compile_kernel(k, "sm_80")
    assert not c.ok and "shared memory" in c.errors[0] and c.shared > tc.TARGETS["sm_80"].shared_per_block
    assert "CANNOT LAUNCH" in tc.format_table([tc.Row(k, ("big",), 1, c)])


@needs_triton
def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    cases = lambda: [("small matmul", _matmul, (S((64, 256), BF16), S((256, 512), BF16)))]  # noqa: E731
    assert tc.main(["--target", "all", "--json", str(out), "--quiet"], cases=cases) == 0
    text = capsys.readouterr().out
    assert "small matmul" in text and "sm_80 (A100" in text and "XLA's bundled Triton" in text
    data = json.loads(out.read_text())
    assert set(data["targets"]) == {"sm_90", "sm_80"}
    row = data["targets"]["sm_90"][0]
    for key in ("programs", "num_warps", "num_stages", "shared_bytes", "registers", "spill_stores",
                "spill_loads", "ptx_version"):
        assert key in row
    assert data["versions"]["triton"] and data["warning"].startswith("WARNING")


def test_missing_triton_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)   # import triton -> ImportError
    assert "pip install triton==3.9.0" in tc.triton_problem()
    with pytest.raises(tc.TritonUnavailable, match=r"pip install triton==3\.9\.0"):
        tc.compile_kernel(tc.Kernel("k", "", 4, 3, (1, 1, 1), (), ()))
    assert tc.versions()["triton"] is None and tc.version_warning() is None
    assert tc.main(["--quiet"], cases=lambda: []) == 2


@needs_triton
def test_another_triton_version_is_named(monkeypatch):
    import triton

    monkeypatch.setattr(triton, "__version__", "3.6.0")   # e.g. torch's Triton on the GPU image
    assert "triton 3.6.0 is installed" in tc.triton_problem()


def test_pallas_kernels_imports_without_triton():
    code = ("import sys; sys.modules['triton'] = None; import pallas_kernels, "
            "pallas_kernels.triton_compile; print('ok')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.stdout.strip() == "ok", run.stderr[-2000:]


def test_limits_and_occupancy_arithmetic():
    k = tc.Kernel("k", "", 8, 3, (100, 1, 1), (), ())
    errors, notes, flags = tc_compiler._check_limits(k, tc.TARGETS["sm_90"], 220 * 1024, 255, 8, 8)
    assert not errors and set(flags) == {"smem near limit", "regs at limit", "SPILLS", "grid < SMs"}
    errors, *_ = tc_compiler._check_limits(k, tc.TARGETS["sm_80"], 170 * 1024, 255, 0, 0)
    assert errors and "163 KB" in errors[0]
    errors, *_ = tc_compiler._check_limits(tc.Kernel("k", "", 16, 3, (1, 1, 1), (), ()), tc.TARGETS["sm_90"], 0, 255, 0, 0)
    assert errors and "registers per SM" in errors[0]     # 255 x 512 threads > 64 K
    c = tc.Compiled(k, tc.TARGETS["sm_90"], shared=64 * 1024, registers=128, spill_stores=0, spill_loads=0,
                    stack=0, ptx_version="9.4", ptx_target="sm_90a", ptxas="", triton_version="",
                    errors=(), warnings=())
    # 128 regs x 256 threads = 32 K registers: 2 blocks by registers; 228 KB / 65 KB: 3 by shared memory.
    assert c.blocks_per_sm == 2 and c.waves == pytest.approx(100 / 264)


def test_versions_name_both_tritons():
    v = tc.versions()
    assert v["jaxlib"] in tc.XLA_TRITON, "name the Triton that this jaxlib's XLA bundles in XLA_TRITON"
    if v["triton"] is not None:
        assert v["triton"] in tc.version_warning() and v["xla_triton"] in tc.version_warning()


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("target", ["sm_90"])   # sm_80 too would double ~25 s; make triton-report has it
def test_base_model_kernels_compile(target):
    """Every kernel of the base model's prefill (T512) and decode at batch 64 compiles and fits.

    (Batch 1, the 8B shapes and sm_80: ``make triton-report``.)"""
    from inference_lab import triton_report

    cases = triton_report.model_cases(presets=("base",), shapes=((64, 512),), n_layers=1)
    result = tc.report(cases, [target])
    rows = result["targets"][target]
    assert {r.kernel.name for r in rows} == {"matmul", "flash_attention", "decode_attention", "ragged_paged_attention"}
    assert not tc.failures(result), tc.failures(result)
