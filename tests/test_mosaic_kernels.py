"""Tests of the Hopper tier (``pallas_kernels.mosaic``): Mosaic GPU matmul, flash and decode attention.

On a CPU the kernels run under GPU interpret mode (``plgpu.InterpretGPUParams``), which
simulates shared memory, the warpgroups as threads, barriers, TMA copies (zero fill past the
end of an array on loads, dropped elements on stores) and wgmma. Each result is compared with
float64 numpy on the same (dtype-rounded) inputs and with ``pallas_kernels.reference``.

Poisoning: GPU interpret mode allocates every kernel output (and every shared-memory buffer)
filled with NaN (``uninitialized_memory="nan"``, checked by ``test_interpret_mode_poisons_outputs``),
and every comparison requires finite values, so an output element a kernel forgets to write
fails. Compiled on a GPU there is no such guarantee; the edge rows and columns are part of every
comparison, and the padded-row slicing is checked there by the same cases.

Every interpreted case also runs GPU interpret mode's happens-before race detector and fails
on a race (the detector does catch, for example, a missing ``wait_smem_to_gmem`` before an
epilogue buffer is reused). Also here: ``plan()`` grids for
an H200 (132 SMs) and an A100-sized SM count (108); every decode-shaped projection of
Llama-3.2-1B and Llama-3-8B gives every SM weight to stream; and each kernel lowered for
CUDA sm_90 on this CPU (the whole Pallas -> Mosaic GPU lowering, which checks TMA tiling
rules, wgmma shapes and the 227 KiB shared-memory limit that the interpreter does not).
Tests marked ``gpu`` run the same cases compiled on an sm_90 GPU and are skipped elsewhere.
Test configs use few SMs and small tiles so the whole file runs in about 30 s on 2 CPU cores.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import mesh as mesh_lib
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import reference, testing
from pallas_kernels.mosaic import common
from pallas_kernels.mosaic import decode_attention as da
from pallas_kernels.mosaic import flash_attention as fa
from pallas_kernels.mosaic import matmul as mm
from pallas_kernels.mosaic import paged_decode_attention as pda

BF16, F16 = jnp.bfloat16, jnp.float16
HOPPER = pytest.mark.skipif(not common.hopper_available(), reason="needs an sm_90 (Hopper) GPU")
MODES = [
    pytest.param("interpret", id="interpret"),
    pytest.param("gpu", id="gpu", marks=[pytest.mark.gpu, HOPPER]),
]


def rand(rng, shape, dtype):
    """Random normal values rounded to ``dtype``, never zero (a zero could hide a skipped term)."""
    x = rng.standard_normal(shape)
    x = np.where(np.abs(x) < 1e-3, 1e-3, x)
    return jnp.asarray(x, dtype=dtype)


def f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), dtype=np.float64)


def assert_close(out, want, what, rel=1e-2):
    """bf16/f16 outputs: max error within ``rel`` of the largest magnitude (at least 1)."""
    out = f64(out)
    assert np.all(np.isfinite(out)), f"{what}: non-finite output (an element was not written?)"
    bound = rel * max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(out - want)))
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g}"


def interpret_flag(mode):
    """GPU interpret mode with the race detector on; ``False`` compiles for the GPU."""
    return plgpu.InterpretGPUParams(detect_races=True) if mode == "interpret" else False


def assert_no_races(mode, what):
    if mode == "interpret":
        from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as ipc

        assert not ipc.get_races().races_found, f"{what}: the interpreter's race detector fired"


# ------------------------------------------------------------------ float64 numpy twins
def np_attention(q, k, v, visible, sm_scale):
    """q [B,T,Hq,D], k/v [B,S,Hkv,D], visible [B,T,S] -> [B,T,Hq,D] (float64)."""
    hq, hkv = q.shape[2], k.shape[2]
    kr, vr = np.repeat(k, hq // hkv, axis=2), np.repeat(v, hq // hkv, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, kr) * sm_scale
    s = np.where(visible[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, vr)


def np_flash(q, k, v, causal, sm_scale):
    q, k, v = f64(q), f64(k), f64(v)
    b, t, s = q.shape[0], q.shape[1], k.shape[1]
    vis = np.ones((b, t, s), bool)
    if causal:
        vis &= (np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t))[None]
    return np_attention(q, k, v, vis, sm_scale)


def np_decode(q, kc, vc, lengths, sm_scale):
    q, kc, vc = f64(q), f64(kc), f64(vc)
    vis = (np.arange(kc.shape[1])[None, :] < np.asarray(lengths)[:, None])[:, None, :]
    return np_attention(q[:, None], kc, vc, vis, sm_scale)[:, 0]


# ------------------------------------------------------------------ interpret mode itself
def test_interpret_mode_poisons_outputs():
    """The premise of every finiteness check below: an unwritten output element is NaN."""
    def writes_half(x_ref, o_ref, smem, bar):
        plgpu.copy_gmem_to_smem(x_ref, smem, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem.at[pl.ds(0, 8)], o_ref.at[pl.ds(0, 8)])  # rows 8..15 never
        plgpu.wait_smem_to_gmem(0)

    x = jnp.ones((16, 64), jnp.float32)
    out = plgpu.kernel(writes_half, out_type=jax.ShapeDtypeStruct((16, 64), jnp.float32),
                       scratch_types=[plgpu.SMEM((16, 64), jnp.float32), plgpu.Barrier(num_barriers=1)],
                       interpret=plgpu.InterpretGPUParams())(x)
    out = np.asarray(out)
    assert np.all(out[:8] == 1) and np.all(np.isnan(out[8:]))


# ------------------------------------------------------------------ matmul
SMALL_DECODE = dataclasses.replace(mm.DECODE_CONFIG, stages=3)
MATMUL_CASES = [
    # (M, K, N, dtype, out_dtype, config): every ragged edge at least once
    # M = 1; N = 192 is 3 CTA tiles of 64 (one consumer); K = 320 is 5 steps split 2 ways (3 + 2,
    # the second split's 3rd step reads zeros past K); 6 units on 3 CTAs (2 per persistent CTA).
    (1, 320, 192, BF16, None, dataclasses.replace(SMALL_DECODE, consumers=1, k_splits=2, num_sms=3)),
    # M = 37 (padded to 40 rows, tile of 64); N = 320 ends mid-tile (128-wide CTA tiles); f32 out.
    (37, 192, 320, F16, jnp.float32, dataclasses.replace(SMALL_DECODE, k_splits=1, num_sms=2)),
    # Prefill-shaped: 3 x 2 tiles of 64 x 128 with ragged M and N; one wgmma kept in flight.
    (130, 256, 192, BF16, None, mm.MosaicMatmulConfig(tile_m=64, tile_n=64, tile_k=64, stages=2,
                                                      epi_n=32, delay_release=1, num_sms=4)),
    # Edges that are not tile multiples: K = 100 (the activation padded to 128 columns, the weight's
    # rows past K zero-filled... K % 8 = 4, so the weight is padded too) and N = 70 (the weight's
    # columns padded to 128, the output sliced); then K = 72 (a multiple of 8: only the activation is
    # padded, TMA zero-fills the weight's missing rows) with N = 136.
    (5, 100, 70, BF16, None, dataclasses.replace(SMALL_DECODE, consumers=1, num_sms=2)),
    (3, 72, 136, F16, None, dataclasses.replace(SMALL_DECODE, consumers=1, num_sms=2)),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,k,n,dtype,out_dtype,config", MATMUL_CASES)
def test_matmul_matches_float64(mode, m, k, n, dtype, out_dtype, config):
    rng = np.random.default_rng(m * 1000 + k + n)
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    out = mm.matmul(a, b, out_dtype=out_dtype, config=config, interpret=interpret_flag(mode))
    assert out.shape == (m, n) and out.dtype == jnp.dtype(out_dtype or dtype)
    what = f"matmul {m}x{k}x{n} {jnp.dtype(dtype).name}"
    assert_no_races(mode, what)
    assert_close(out, f64(a) @ f64(b), what)
    assert_close(out, f64(reference.matmul(a, b, out_dtype=out_dtype)), what + " vs reference")


def test_matmul_rejects_what_only_this_tier_rejects_and_pads_the_rest():
    a = jnp.ones((4, 64), jnp.float32)
    with pytest.raises(ValueError, match="float32"):
        mm.matmul(a, a.T)
    # an awkward weight is taken (padded in a copy) but not preferred where Triton masks it for free
    pad = mm.padding(4, 100, 70, mm.DECODE_CONFIG, BF16, BF16)
    assert (pad["m"], pad["k"], pad["n"], pad["weight"]) == (8, 128, 128, True)
    assert not mm.padding(1, 2048, 3072, mm.DECODE_CONFIG, BF16, BF16)["weight"]   # a real projection
    a, b = jnp.ones((4, 100), BF16), jnp.ones((100, 70), BF16)
    assert mm.unsupported(a, b) is None and "copy the weight" in mm.unsupported(a, b, allow_copies=False)


def test_matmul_plan_grid_for_h200_and_a100():
    for num_sms in (132, 108):
        # Prefill 4096^3: 32 x 16 tiles of 128 x 256, one persistent CTA per SM, no K split.
        p = mm.plan(4096, 4096, 4096, BF16, num_sms=num_sms)
        assert (p.m_tiles, p.n_tiles, p.k_splits) == (32, 16, 1)
        assert p.grid == (num_sms,) and p.units_per_cta == (512 // num_sms, -(-512 // num_sms))
        # Small prefill: fewer tiles than SMs -> one CTA per unit (K splits fill the rest).
        p = mm.plan(256, 512, 512, BF16, num_sms=num_sms, config=dataclasses.replace(mm.PREFILL_CONFIG, k_splits=1))
        assert p.units == 2 * 2 and p.grid == (4,)
        assert p.smem_bytes() <= common.HOPPER_SMEM_BYTES
    # Decode, 1B fused QKV at batch 1: 48 CTA tiles of 64 columns (one consumer), K split 8
    # ways on 132 SMs (384 units, 2.9 per SM) and 4 ways on 108 (192 units).
    p = mm.plan(1, 2048, 3072, BF16, num_sms=132)
    assert (p.config.consumers, p.n_tiles, p.k_splits, p.grid) == (1, 48, 8, (132,))
    p = mm.plan(1, 2048, 3072, BF16, num_sms=108)
    assert (p.config.consumers, p.n_tiles, p.k_splits, p.grid) == (1, 48, 4, (108,))


LLAMA_PROJECTIONS = {  # (K, N) of every decode-time weight matmul
    "1B qkv": (2048, 3072), "1B o": (2048, 2048), "1B gate/up": (2048, 16384),
    "1B down": (8192, 2048), "1B head": (2048, 128256),
    "8B qkv": (4096, 6144), "8B o": (4096, 4096), "8B gate/up": (4096, 28672),
    "8B down": (14336, 4096), "8B head": (4096, 128256),
}


@pytest.mark.parametrize("num_sms", [132, 108])
def test_matmul_decode_plans_give_every_sm_weight_to_stream(num_sms):
    """Why not "2 CTAs per SM": the grid is persistent (one CTA per SM, each looping over units;
    its ring of slabs fills the SM's shared memory, so a second CTA would not fit). The
    measures that matter: every SM gets at least one unit of weight, the busiest SM streams
    at most 1/0.75 of the average, each weight byte is read once, and the f32 partial sums
    of a K split stay below half the weight's bytes (below 7% at batch 1)."""
    for name, (k, n) in LLAMA_PROJECTIONS.items():
        for m in range(1, 65):
            p = mm.plan(m, k, n, BF16, num_sms=num_sms)
            what = f"{name} M={m} on {num_sms} SMs: {p}"
            assert p.grid == (num_sms,) and p.units >= num_sms, what
            assert p.units_per_cta[0] >= 1, what
            assert p.balance >= 0.75, what
            assert p.m_tiles == 1, what            # decode: the weight is streamed exactly once
            assert p.partial_bytes <= (0.5 if m > 1 else 0.07) * k * n * 2, what
            assert p.smem_bytes() <= common.HOPPER_SMEM_BYTES, what


# ------------------------------------------------------------------ flash attention
SMALL_FLASH = fa.MosaicFlashConfig(block_q=64, block_kv=64, stages=2)
FLASH_CASES = [
    # (B, T, S, Hq, Hkv, D, causal, dtype, sm_scale)
    (1, 1, 130, 4, 1, 64, False, F16, None),    # T = 1, S > T, GQA 4, not causal, ragged S (-> 136)
    (1, 37, 200, 8, 1, 128, True, BF16, None),  # GQA 8, D = 128, ragged T and S, causal offset 163
    (1, 130, 130, 1, 1, 64, True, BF16, 0.3),   # GQA 1, two query tiles; the lower warpgroup
]                                               # skips blocks past its diagonal


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,t,s,hq,hkv,d,causal,dtype,sm_scale", FLASH_CASES)
def test_flash_attention_matches_float64(mode, b, t, s, hq, hkv, d, causal, dtype, sm_scale):
    rng = np.random.default_rng(t * 100 + s + d)
    q = rand(rng, (b, t, hq, d), dtype)
    k, v = rand(rng, (b, s, hkv, d), dtype), rand(rng, (b, s, hkv, d), dtype)
    out = fa.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, config=SMALL_FLASH,
                             interpret=interpret_flag(mode))
    assert out.shape == q.shape and out.dtype == q.dtype
    what = f"flash B{b} T{t} S{s} H{hq}/{hkv} D{d} causal={causal}"
    assert_no_races(mode, what)
    assert_close(out, np_flash(q, k, v, causal, sm_scale or d ** -0.5), what)
    ref = reference.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    assert_close(out, f64(ref), what + " vs reference")


def test_flash_attention_plan_and_rejections():
    for num_sms in (132, 108):
        p = fa.plan(4, 4096, 4096, 32, 8, 128, BF16, num_sms=num_sms)
        assert p.grid == (4096 // 128, 32, 4) and p.num_ctas == 4096
        assert p.waves == 4096 / num_sms
    assert fa.plan(1, 1, 9, 8, 1, 64).grid == (1, 8, 1)
    with pytest.raises(ValueError, match="head dim D=32"):
        fa.plan(1, 8, 8, 2, 2, 32)
    q = jnp.ones((1, 8, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="q has dtype float32"):
        fa.flash_attention(q, q, q)


# ------------------------------------------------------------------ decode attention
DECODE_CASES = [
    # (B, Hq, Hkv, D, S_max, lengths, dtype, splits): lengths 1 and S_max in one batch
    (3, 4, 1, 64, 200, [1, 200, 77], BF16, 2),   # GQA 4; chunks of 128: rows 0, 2 skip split 1
    (2, 8, 1, 128, 136, [136, 1], F16, None),    # GQA 8, D = 128; S_max = 136 is ragged in 64s
    (2, 4, 2, 64, 101, [101, 37], BF16, None),   # S_max = 101, not a multiple of 8: the caches padded
]   # (GQA 1 takes the same path as any group below 8 rows; flash attention tests it)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,hq,hkv,d,s_max,lengths,dtype,splits", DECODE_CASES)
def test_decode_attention_matches_float64(mode, b, hq, hkv, d, s_max, lengths, dtype, splits):
    rng = np.random.default_rng(s_max + d + hq)
    q = rand(rng, (b, hq, d), dtype)
    kc, vc = rand(rng, (b, s_max, hkv, d), dtype), rand(rng, (b, s_max, hkv, d), dtype)
    lengths = jnp.asarray(lengths, jnp.int32)
    config = da.MosaicDecodeConfig(block_k=64, stages=2, splits=splits, num_sms=4)
    out = da.decode_attention(q, kc, vc, lengths, config=config, interpret=interpret_flag(mode))
    assert out.shape == q.shape and out.dtype == q.dtype
    what = f"decode B{b} H{hq}/{hkv} D{d} S_max{s_max} lengths {list(np.asarray(lengths))}"
    assert_no_races(mode, what)
    assert_close(out, np_decode(q, kc, vc, lengths, d ** -0.5), what)
    assert_close(out, f64(reference.decode_attention(q, kc, vc, lengths)), what + " vs reference")


def test_decode_attention_plan_and_rejections():
    # Batch 1, 32k cache, 8 KV heads: split so that 8 * splits covers the SMs.
    for num_sms in (132, 108):
        p = da.plan(1, 32768, 32, 8, 128, num_sms=num_sms)
        assert p.num_ctas >= num_sms and p.chunk % p.config.block_k == 0
        assert p.grid == (p.splits, 8, 1) and (p.splits - 1) * p.chunk < 32768 <= p.splits * p.chunk
    assert da.plan(64, 4096, 32, 8, 128, num_sms=132).grid == (1, 8, 64)   # enough CTAs already
    assert da.plan(1, 300, 32, 8, 64, num_sms=132).splits == 2             # chunks >= 256 keys
    q, kc = jnp.ones((1, 4, 64), BF16), jnp.ones((1, 100, 1, 64), BF16)
    assert da.unsupported(q, kc) is None                                   # taken (the caches padded)...
    assert "copy the caches" in da.unsupported(q, kc, allow_copies=False)  # ...but not preferred in "pallas"


# ------------------------------------------------------------------ paged decode attention
PAGED_CASES = [
    # (B, Hq, Hkv, D, pool blocks, pages per row, lengths, dtype, splits): blocks of 64, tables drawn
    # from the pool at random (shared, out of order), lengths that are not block multiples
    (2, 4, 1, 64, 7, 5, [137, 300], BF16, 2),
    (2, 8, 2, 128, 5, 3, [1, 165], F16, None),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,hq,hkv,d,n_blocks,pages,lengths,dtype,splits", PAGED_CASES)
def test_paged_decode_attention_matches_float64(mode, b, hq, hkv, d, n_blocks, pages, lengths, dtype, splits):
    rng = np.random.default_rng(n_blocks + d)
    q = rand(rng, (b, hq, d), dtype)
    kp, vp = rand(rng, (n_blocks, 64, hkv, d), dtype), rand(rng, (n_blocks, 64, hkv, d), dtype)
    tables = jnp.asarray(rng.integers(0, n_blocks, (b, pages)), jnp.int32)
    lengths = jnp.asarray(lengths, jnp.int32)
    config = pda.MosaicPagedDecodeConfig(splits=splits, num_sms=4)
    out = pda.paged_decode_attention(q, kp, vp, tables, lengths, config=config, interpret=interpret_flag(mode))
    assert out.shape == q.shape and out.dtype == q.dtype
    what = f"paged decode B{b} H{hq}/{hkv} D{d} lengths {list(np.asarray(lengths))}"
    assert_no_races(mode, what)
    assert_close(out, testing.paged_decode_attention_f64(q, kp, vp, tables, lengths), what)
    moved = pda.paged_decode_attention(q, kp, vp, (tables + 1) % n_blocks, lengths, config=config,
                                       interpret=interpret_flag(mode))
    assert float(np.max(np.abs(f64(moved) - f64(out)))) > 0.05, "another table must give another answer"


@pytest.mark.parametrize("d,block", [(64, 64), (128, 64), (128, 128)])
def test_paged_decode_attention_lowers_for_sm90(d, block):
    pool = S((4 * 16 + 1, block, 8, d), BF16)
    text = _lower_for_h200(lambda q, k, v, t, n: pda.paged_decode_attention(q, k, v, t, n),
                           S((4, 32, d), BF16), pool, pool, S((4, 16), jnp.int32), S((4,), jnp.int32))
    assert "mosaic_gpu" in text


def test_paged_decode_attention_declines_small_blocks():
    """Blocks of 16 (the engine's default) do not lower on this tier (Mosaic GPU infers no layout for
    their P tile, jax 0.11.2); the public function runs them on the Triton tier in "pallas" mode and
    names the reason in "mosaic" mode."""
    q, pool = jnp.ones((1, 4, 64), BF16), jnp.ones((3, 16, 1, 64), BF16)
    assert "blocks of 16" in pda.unsupported(q, pool) and pda.unsupported(q, jnp.ones((3, 64, 1, 64), BF16)) is None
    with pytest.raises(ValueError, match="blocks of 64 or more"):
        import pallas_kernels as pk
        pk.paged_decode_attention(q, pool, pool, jnp.ones((1, 2), jnp.int32), jnp.asarray([20], jnp.int32),
                                  mode="mosaic_interpret")



# ------------------------------------------------------------------ lowering for sm_90 on a CPU
def _lower_for_h200(fn, *args):
    """Lower ``fn`` for CUDA with an abstract H200 standing in for the missing device: the whole
    Pallas -> Mosaic GPU lowering runs (TMA tiling rules, wgmma shapes, the shared-memory
    limit), short of the PTX compile."""
    device = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    mesh = mesh_lib.AbstractMesh((1,), ("x",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


S = jax.ShapeDtypeStruct


@pytest.mark.parametrize("m,k,n", [(1, 2048, 3072), (37, 4096, 14336), (4096, 4096, 4096), (5, 100, 70)])
def test_matmul_lowers_for_sm90(m, k, n):
    text = _lower_for_h200(lambda a, b: mm.matmul(a, b), S((m, k), BF16), S((k, n), BF16))
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("d,causal,p_in_registers", [(64, True, False), (128, True, False),
                                                     (128, False, True)])
def test_flash_attention_lowers_for_sm90(d, causal, p_in_registers):
    cfg = dataclasses.replace(fa.DEFAULT_CONFIGS[d], p_in_registers=p_in_registers)
    text = _lower_for_h200(lambda q, k, v: fa.flash_attention(q, k, v, causal=causal, config=cfg),
                           S((2, 1000, 32, d), BF16), S((2, 1003, 8, d), BF16), S((2, 1003, 8, d), BF16))
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("d,s_max", [(64, 4096), (128, 4096), (64, 4093)])
def test_decode_attention_lowers_for_sm90(d, s_max):
    text = _lower_for_h200(lambda q, k, v, n: da.decode_attention(q, k, v, n),
                           S((4, 32, d), BF16), S((4, s_max, 8, d), BF16), S((4, s_max, 8, d), BF16),
                           S((4,), jnp.int32))
    assert "mosaic_gpu" in text


# ---------------------------------------------------------------- the public API picks the tier
def test_public_kernels_run_the_mosaic_tier_in_mosaic_interpret_mode():
    """pk.matmul / flash_attention / decode_attention with mode="mosaic_interpret" run the
    Hopper kernels (one small case each), including the decode step's in-place K/V write."""
    import pallas_kernels as pk

    rng = np.random.default_rng(7)
    r = lambda *shape: jnp.asarray(rng.standard_normal(shape), BF16)  # noqa: E731
    a, b = r(3, 128), r(128, 64)
    np.testing.assert_allclose(testing.f64(pk.matmul(a, b, mode="mosaic_interpret")), testing.matmul_f64(a, b),
                               rtol=2e-2, atol=2e-2 * 12)
    q, k, v = r(1, 16, 4, 64), r(1, 24, 1, 64), r(1, 24, 1, 64)
    out = pk.flash_attention(q, k, v, mode="mosaic_interpret")
    assert testing.rel_err(out, testing.flash_attention_f64(q, k, v)) < 2e-2
    q, kc, vc = r(2, 4, 64), r(2, 16, 1, 64), r(2, 16, 1, 64)
    k_new, v_new = r(2, 1, 64), r(2, 1, 64)
    lengths = jnp.asarray([1, 16], jnp.int32)
    out, k2, v2 = pk.decode_attention(q, kc, vc, lengths, k_new=k_new, v_new=v_new, mode="mosaic_interpret")
    want_k = np.asarray(kc).copy()
    want_k[[0, 1], [0, 15]] = np.asarray(k_new)
    np.testing.assert_array_equal(np.asarray(k2), want_k)
    assert testing.rel_err(out, testing.decode_attention_f64(q, k2, v2, lengths)) < 2e-2


def test_mode_and_config_errors_name_the_tier():
    import pallas_kernels as pk

    a = jnp.ones((4, 64), jnp.float32)
    with pytest.raises(ValueError, match="mode='mosaic_interpret' cannot run this call: a has dtype float32"):
        pk.matmul(a, a.T, mode="mosaic_interpret")
    with pytest.raises(ValueError, match="config is a MosaicMatmulConfig but mode='interpret'"):
        pk.matmul(a, a.T, mode="interpret", config=mm.PREFILL_CONFIG)
    with pytest.raises(ValueError, match="config is a MatmulConfig but mode='mosaic_interpret'"):
        pk.matmul(a.astype(BF16), a.T.astype(BF16), mode="mosaic_interpret", config=pk.MatmulConfig(16, 16, 16))
    if not pk.mode.mosaic_supported():
        with pytest.raises(ValueError, match="mode='mosaic' cannot run here"):
            pk.mode.resolve_mode("mosaic")
    # mode "pallas" on a Hopper GPU: an awkward weight runs on the Triton tier (no copy), a regular one on Mosaic
    with pk.mode.assume_gpu("NVIDIA H200", (9, 0)):
        seen = pk.mode.choose_tier("pallas", None, triton_config=pk.MatmulConfig, mosaic=("matmul", "MosaicMatmulConfig"),
                                   mosaic_problem=lambda m, copies: m.unsupported(
                                       jnp.ones((4, 100), BF16), jnp.ones((100, 70), BF16), allow_copies=copies))
        assert seen.name == "triton"
        seen = pk.mode.choose_tier("pallas", None, triton_config=pk.MatmulConfig, mosaic=("matmul", "MosaicMatmulConfig"),
                                   mosaic_problem=lambda m, copies: m.unsupported(
                                       jnp.ones((4, 128), BF16), jnp.ones((128, 64), BF16), allow_copies=copies))
        assert seen.name == "mosaic" and not seen.interpret
    assert pk.mode.tier("mosaic_interpret") == "mosaic" and pk.mode.tier("interpret") == "triton"
