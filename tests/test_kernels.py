"""Tests of the Pallas kernels: matmul, flash attention, decode attention.

On CPU the kernels run under the Pallas interpreter (``mode="interpret"``); the same cases
marked ``gpu`` run compiled (``mode="pallas"``) where an NVIDIA GPU is present. Each result
is compared with float64 numpy on the same (dtype-rounded) inputs and with the plain-jnp
reference. Outputs are poisoned with NaN before every kernel runs
(``pallas_kernels.testing.poisoned_outputs``), so
an element a kernel forgets to write fails the comparison. A last group lowers each kernel for
CUDA on this CPU-only machine, which catches Triton-only errors (non-power-of-two blocks,
unsupported ops) without a GPU.
"""

from __future__ import annotations

import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import testing
from pallas_kernels.triton import common
from pallas_kernels.mode import pallas_supported

# The package exports the functions under the modules' names, so fetch the modules explicitly.
mm_mod = importlib.import_module("pallas_kernels.triton.matmul")
fa_mod = importlib.import_module("pallas_kernels.triton.flash_attention")
da_mod = importlib.import_module("pallas_kernels.triton.decode_attention")
pda_mod = importlib.import_module("pallas_kernels.triton.paged_decode_attention")

GPU = pytest.mark.skipif(not pallas_supported(), reason="needs an NVIDIA GPU (compute capability >= 8.0)")
MODES = [
    pytest.param("interpret", id="interpret"),
    pytest.param("pallas", id="pallas", marks=[pytest.mark.gpu, GPU]),
]
F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16


@pytest.fixture(autouse=True)
def poison():
    """Every kernel output starts as NaN, so unwritten elements fail the comparisons."""
    with testing.poisoned_outputs():
        yield


def rand(rng, shape, dtype):
    """Random normal values (never zeros), rounded to ``dtype``."""
    return jnp.asarray(rng.standard_normal(shape), dtype=dtype)


def f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), dtype=np.float64)


def tol(dtype, mode):
    if dtype == F32:
        return 1e-5 if mode == "interpret" else 1e-4
    return 2e-2  # bf16 / f16: output rounding (2^-8) plus probabilities cast to the input dtype


def assert_close(out, want, dtype, mode, what):
    out = f64(out)
    assert np.all(np.isfinite(out)), f"{what}: non-finite output (an element was not written?)"
    t = tol(dtype, mode)
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(out - want)))
    assert err <= t * scale, f"{what}: max abs error {err:.3g} > {t * scale:.3g}"


# ---------------------------------------------------------------- float64 numpy twins
np_flash = testing.flash_attention_f64
np_decode = testing.decode_attention_f64


# ---------------------------------------------------------------- matmul
MATMUL_CASES = [
    # (M, K, N, dtype, out_dtype): awkward edges, M = 1, each shape class of the table
    (1, 70, 45, F32, None),
    (37, 70, 45, F32, None),
    (16, 64, 32, F32, None),          # exact block multiples: the mask-free path
    (130, 33, 300, F32, None),        # medium-batch tiles
    (300, 20, 40, F32, None),         # prefill tiles
    (5, 40, 100, BF16, None),
    (70, 20, 17, F16, None),
    (9, 48, 33, BF16, F32),           # out_dtype differs from the inputs
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,k,n,dtype,out_dtype", MATMUL_CASES)
def test_matmul_matches_float64(mode, m, k, n, dtype, out_dtype):
    rng = np.random.default_rng(m * 1000 + k + n)
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    out = pk.matmul(a, b, out_dtype=out_dtype, mode=mode)
    assert out.shape == (m, n)
    assert out.dtype == (out_dtype or dtype)
    want = f64(a) @ f64(b)
    check_dtype = dtype if out_dtype is None else out_dtype
    assert_close(out, want, check_dtype, mode, f"matmul {m}x{k}x{n} {jnp.dtype(dtype).name}")
    assert_close(out, f64(pk.reference.matmul(a, b, out_dtype=out_dtype)), check_dtype, mode, "vs reference")


@pytest.mark.parametrize("mode", MODES)
def test_matmul_small_blocks_many_programs(mode):
    """Small forced blocks: 10 tile-rows (more than one L2 group), 4 tile-columns, 3 K steps."""
    rng = np.random.default_rng(1)
    a, b = rand(rng, (150, 40), F32), rand(rng, (40, 50), F32)
    out = pk.matmul(a, b, mode=mode, config=pk.MatmulConfig(16, 16, 16, num_warps=4, num_stages=2))
    assert_close(out, f64(a) @ f64(b), F32, mode, "matmul with 16^3 blocks")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,k,split", [(1, 100, 3), (20, 64, 4), (5, 33, 2)])
def test_matmul_split_k(mode, m, k, split):
    """K cut into chunks, one program each, partial sums added: ragged last chunk, M = 1."""
    rng = np.random.default_rng(k + split)
    a, b = rand(rng, (m, k), F32), rand(rng, (k, 40), F32)
    config = pk.MatmulConfig(16, 16, 16, split_k=split, num_warps=4, num_stages=2)
    assert mm_mod.plan(m, k, 40, F32, config=config).grid[1] == min(split, -(-k // 16))
    out = pk.matmul(a, b, mode=mode, config=config)
    assert_close(out, f64(a) @ f64(b), F32, mode, f"matmul split_k={split}")


def test_matmul_plan_by_shape():
    # Decode-shaped: one tile row of 16 (Triton's minimum), narrow N tiles, deep K.
    c = mm_mod.plan(1, 8192, 8192, BF16, num_sms=132).config
    assert (c.block_m, c.block_n) == (16, 64) and c.block_k >= 128
    assert mm_mod.plan(64, 8192, 8192, BF16, num_sms=132).config.block_m == 64
    # Prefill-shaped: the 128x256x64 tiles (729 TFLOP/s for bf16 8192^3 on an H200, docs/architecture.md).
    p = mm_mod.plan(8192, 8192, 8192, BF16, num_sms=132)
    assert (p.config.block_m, p.config.block_n, p.config.block_k) == (128, 256, 64) and p.grid == (64 * 32, 1)
    for shape in [(1, 1, 1), (3, 5, 7), (100, 1000, 10), (8192, 8192, 8192)]:
        for dtype in (BF16, F32):
            c = mm_mod.plan(*shape, dtype, num_sms=132).config
            for blk in (c.block_m, c.block_n, c.block_k):
                assert blk >= 16 and blk & (blk - 1) == 0, (shape, blk)
            itemsize = jnp.dtype(dtype).itemsize
            assert (c.block_m * c.block_k + c.block_k * c.block_n) * itemsize * c.num_stages <= mm_mod.SMEM_BUDGET


def test_config_classes_reject_bad_blocks():
    for bad in (dict(block_m=24, block_n=64, block_k=64), dict(block_m=16, block_n=8, block_k=64)):
        with pytest.raises(ValueError, match="power of two"):
            pk.MatmulConfig(**bad)
    with pytest.raises(ValueError, match="split_k"):
        pk.MatmulConfig(16, 16, 16, split_k=0)
    with pytest.raises(ValueError, match="config must be a MatmulConfig"):
        pk.matmul(jnp.ones((2, 2)), jnp.ones((2, 2)), config=(16, 16, 16))


# ---------------------------------------------------------------- flash attention
FLASH_CASES = [
    # (B, T, S, Hq, Hkv, D, causal, dtype)
    (2, 19, 40, 4, 2, 32, True, F32),     # S > T, ragged T and S, GQA 2
    (2, 19, 40, 4, 2, 32, False, F32),
    (1, 1, 37, 8, 1, 32, True, F32),      # T = 1, GQA 8
    (1, 33, 33, 4, 4, 64, True, BF16),    # T = S, GQA 1
    (1, 17, 50, 4, 1, 128, True, F16),    # D = 128, GQA 4
    (1, 21, 29, 12, 4, 64, True, F32),    # GQA 3 (the small preset's 12/4 heads): a group not a power of two
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,t,s,hq,hkv,d,causal,dtype", FLASH_CASES)
def test_flash_attention_matches_float64(mode, b, t, s, hq, hkv, d, causal, dtype):
    rng = np.random.default_rng(t * 100 + s + d)
    q, k, v = rand(rng, (b, t, hq, d), dtype), rand(rng, (b, s, hkv, d), dtype), rand(rng, (b, s, hkv, d), dtype)
    out = pk.flash_attention(q, k, v, causal=causal, mode=mode)
    assert out.shape == q.shape and out.dtype == q.dtype
    what = f"flash B{b} T{t} S{s} H{hq}/{hkv} D{d} causal={causal}"
    assert_close(out, np_flash(q, k, v, causal), dtype, mode, what)
    ref = pk.reference.flash_attention(q, k, v, causal=causal)
    assert_close(out, f64(ref), dtype, mode, what + " vs reference")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_small_blocks(mode, causal):
    """16x16 blocks: several query blocks, unmasked full key blocks and masked diagonal ones."""
    rng = np.random.default_rng(7)
    q, k, v = rand(rng, (1, 50, 2, 32), F32), rand(rng, (1, 70, 1, 32), F32), rand(rng, (1, 70, 1, 32), F32)
    out = pk.flash_attention(q, k, v, causal=causal, sm_scale=0.3, mode=mode,
                             config=pk.FlashAttentionConfig(16, 16, num_warps=4, num_stages=2))
    assert_close(out, np_flash(q, k, v, causal, sm_scale=0.3), F32, mode, "flash 16x16 blocks")


# (B, T, S, Hq, Hkv, D, block, q_offsets, dtype): pieces of prompts placed inside their rows (chunked
# prefill): at 0, ragged starts, a piece past the last key (it sees them all), blocks cut at odd places
OFFSET_CASES = [
    (3, 16, 64, 6, 2, 64, None, [0, 23, 48], F32),
    (2, 19, 40, 4, 2, 32, (16, 16), [5, 30], F32),
    (4, 16, 37, 8, 1, 32, (16, 16), [0, 1, 21, 36], BF16),
    (1, 33, 50, 4, 4, 64, None, [17], F16),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,t,s,hq,hkv,d,block,offsets,dtype", OFFSET_CASES)
def test_flash_attention_with_q_offsets_matches_float64(mode, b, t, s, hq, hkv, d, block, offsets, dtype):
    rng = np.random.default_rng(t * 7 + s + sum(offsets))
    q, k, v = rand(rng, (b, t, hq, d), dtype), rand(rng, (b, s, hkv, d), dtype), rand(rng, (b, s, hkv, d), dtype)
    config = None if block is None else pk.FlashAttentionConfig(*block, num_warps=4, num_stages=2)
    at = jnp.asarray(offsets, jnp.int32)
    out = pk.flash_attention(q, k, v, mode=mode, config=config, q_offsets=at)
    what = f"flash B{b} T{t} S{s} q_offsets={offsets}"
    assert_close(out, np_flash(q, k, v, q_offsets=offsets), dtype, mode, what)
    assert_close(out, f64(pk.reference.flash_attention(q, k, v, q_offsets=at)), dtype, mode, what + " vs reference")
    # a row whose piece sits at the end of the keys is plain causal attention aligned to the end
    if offsets[-1] == s - t:
        assert_close(out[-1:], np_flash(q[-1:], k[-1:], v[-1:], True), dtype, mode, what + " at the end")


def test_flash_attention_sm_scale_and_reference_mode():
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, (1, 5, 2, 16), F32), rand(rng, (1, 9, 2, 16), F32), rand(rng, (1, 9, 2, 16), F32)
    want = np_flash(q, k, v, True, sm_scale=0.7)
    assert_close(pk.flash_attention(q, k, v, sm_scale=0.7, mode="reference"), want, F32, "interpret", "reference")
    assert_close(pk.flash_attention(q, k, v, sm_scale=0.7, mode="interpret"), want, F32, "interpret", "kernel")


# ---------------------------------------------------------------- decode attention
DECODE_CASES = [
    # (B, Hq, Hkv, D, S_max, lengths, dtype): lengths 1 and S_max in the same batch
    (3, 8, 2, 32, 50, [1, 50, 23], F32),   # GQA 4
    (2, 2, 2, 32, 40, [40, 1], F32),       # GQA 1
    (2, 8, 1, 64, 33, [17, 33], BF16),     # GQA 8
    (2, 4, 2, 128, 20, [1, 20], F16),      # GQA 2, D = 128
    (2, 12, 4, 64, 45, [45, 7], F32),      # GQA 3 (the small preset's 12/4 heads)
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,hq,hkv,d,s_max,lengths,dtype", DECODE_CASES)
def test_decode_attention_matches_float64(mode, b, hq, hkv, d, s_max, lengths, dtype):
    rng = np.random.default_rng(s_max * 10 + d)
    q = rand(rng, (b, hq, d), dtype)
    kc, vc = rand(rng, (b, s_max, hkv, d), dtype), rand(rng, (b, s_max, hkv, d), dtype)
    lengths = jnp.asarray(lengths, jnp.int32)
    out = pk.decode_attention(q, kc, vc, lengths, mode=mode)
    assert out.shape == q.shape and out.dtype == q.dtype
    what = f"decode B{b} H{hq}/{hkv} D{d} S_max{s_max}"
    assert_close(out, np_decode(q, kc, vc, lengths), dtype, mode, what)
    assert_close(out, f64(pk.reference.decode_attention(q, kc, vc, lengths)), dtype, mode, what + " vs reference")


@pytest.mark.parametrize("mode", MODES)
def test_decode_attention_splits(mode):
    """Four splits of 16 keys: rows whose later splits start past their length (no work),
    a row ending inside a split, a row using the whole cache; garbage past each length."""
    rng = np.random.default_rng(11)
    b, hq, hkv, d, s_max = 3, 4, 2, 32, 64
    q = rand(rng, (b, hq, d), F32)
    kc, vc = rand(rng, (b, s_max, hkv, d), F32), rand(rng, (b, s_max, hkv, d), F32)
    lengths = jnp.asarray([1, 64, 21], jnp.int32)
    want = np_decode(q, kc, vc, lengths)
    # Keys past each row's length must not matter: fill them with huge values.
    junk = jnp.arange(s_max)[None, :, None, None] >= lengths[:, None, None, None]
    kc, vc = jnp.where(junk, 1e4, kc), jnp.where(junk, -1e4, vc)
    config = pk.DecodeAttentionConfig(block_k=16, num_splits=4, num_warps=4, num_stages=2)
    assert da_mod.plan(b, s_max, hkv, d, config=config).num_splits == 4
    out = pk.decode_attention(q, kc, vc, lengths, mode=mode, config=config)
    assert_close(out, want, F32, mode, "decode with 4 splits")


FUSED_SPLITS = [pytest.param(None, id="planned"), pytest.param(4, id="4-splits"), pytest.param(1, id="1-split")]


@pytest.mark.parametrize("mode", ["reference"] + MODES)
@pytest.mark.parametrize("splits", FUSED_SPLITS)
def test_decode_attention_writes_new_kv_in_place(mode, splits):
    """With k_new/v_new the kernel writes this step's K/V at lengths-1 and attends to them:
    the same answer as writing them first, every other cache element unchanged."""
    rng = np.random.default_rng(21)
    b, hq, hkv, d, s_max = 3, 8, 2, 32, 64
    q = rand(rng, (b, hq, d), F32)
    kc, vc = rand(rng, (b, s_max, hkv, d), F32), rand(rng, (b, s_max, hkv, d), F32)
    k_new, v_new = rand(rng, (b, hkv, d), F32), rand(rng, (b, hkv, d), F32)
    lengths = jnp.asarray([1, 64, 30], jnp.int32)          # new key alone, at the end, in the middle
    rows = np.arange(b)
    want_k, want_v = np.asarray(kc).copy(), np.asarray(vc).copy()
    want_k[rows, np.asarray(lengths) - 1] = np.asarray(k_new)
    want_v[rows, np.asarray(lengths) - 1] = np.asarray(v_new)
    config = None if splits is None else pk.DecodeAttentionConfig(block_k=16, num_splits=splits)
    out, k2, v2 = pk.decode_attention(q, kc, vc, lengths, k_new=k_new, v_new=v_new, mode=mode, config=config)
    np.testing.assert_array_equal(np.asarray(k2), want_k)
    np.testing.assert_array_equal(np.asarray(v2), want_v)
    assert_close(out, np_decode(q, want_k, want_v, lengths), F32, "pallas" if mode == "pallas" else "interpret",
                 f"fused decode write, splits={splits}")


def test_decode_attention_new_kv_argument_errors():
    q, kc = jnp.ones((2, 4, 16)), jnp.ones((2, 8, 2, 16))
    n = jnp.asarray([3, 8], jnp.int32)
    _err(lambda: pk.decode_attention(q, kc, kc, n, k_new=jnp.ones((2, 2, 16))), "k_new", "v_new")
    _err(lambda: pk.decode_attention(q, kc, kc, n, k_new=jnp.ones((2, 16)), v_new=jnp.ones((2, 16))),
         "k_new", "[B, Hkv, D]")
    _err(lambda: pk.decode_attention(q, kc, kc, n, k_new=jnp.ones((2, 2, 16), F16), v_new=jnp.ones((2, 2, 16))),
         "k_new", "dtype")


def test_decode_attention_under_jit_skips_value_checks():
    rng = np.random.default_rng(5)
    q, kc, vc = rand(rng, (2, 2, 16), F32), rand(rng, (2, 8, 1, 16), F32), rand(rng, (2, 8, 1, 16), F32)
    lengths = jnp.asarray([3, 8], jnp.int32)
    f = jax.jit(lambda q, k, v, n: pk.decode_attention(q, k, v, n, mode="interpret"))
    assert_close(f(q, kc, vc, lengths), np_decode(q, kc, vc, lengths), F32, "interpret", "jit")


def test_decode_split_choice():
    # B64 x 8 KV heads already gives 512 programs: a few splits at most.
    p = da_mod.plan(64, 4096, 8, 128, num_sms=132)
    assert 1 <= p.num_splits <= 4 and p.config.block_k & (p.config.block_k - 1) == 0
    # One long sequence: split the cache so it still fills the GPU.
    assert da_mod.plan(1, 32768, 8, 128, num_sms=132).num_splits >= 64
    # Short caches are not split below MIN_SPLIT_KEYS keys.
    assert da_mod.plan(1, 100, 1, 32, num_sms=132).num_splits == 1
    # Fewer SMs, fewer splits.
    assert da_mod.plan(1, 32768, 8, 128, num_sms=108).num_splits < da_mod.plan(1, 32768, 8, 128, num_sms=132).num_splits


# ---------------------------------------------------------------- GPU only: realistic shapes
@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("m", [1, 7, 64, 1000])
def test_matmul_gpu_model_shapes(m):
    """Compiled matmul at model-like sizes (decode batches and a prefill), bf16 and f32."""
    rng = np.random.default_rng(m)
    for dtype in (BF16, F32):
        a, b = rand(rng, (m, 2048), dtype), rand(rng, (2048, 3000), dtype)
        out = pk.matmul(a, b, mode="pallas")
        assert_close(out, f64(a) @ f64(b), dtype, "pallas", f"gpu matmul M{m} {jnp.dtype(dtype).name}")


@pytest.mark.gpu
@GPU
def test_attention_gpu_model_shapes():
    """Compiled flash and decode attention at model-like sizes with ragged ends."""
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, (2, 1000, 8, 128), BF16), rand(rng, (2, 1300, 2, 128), BF16), rand(rng, (2, 1300, 2, 128), BF16)
    out = pk.flash_attention(q, k, v, mode="pallas")
    assert_close(out, f64(pk.reference.flash_attention(q.astype(F32), k.astype(F32), v.astype(F32))),
                 BF16, "pallas", "gpu flash")
    q = rand(rng, (5, 32, 128), BF16)
    kc, vc = rand(rng, (5, 3000, 8, 128), BF16), rand(rng, (5, 3000, 8, 128), BF16)
    lengths = jnp.asarray([1, 3000, 1234, 2049, 64], jnp.int32)
    out = pk.decode_attention(q, kc, vc, lengths, mode="pallas")
    assert_close(out, np_decode(q, kc, vc, lengths), BF16, "pallas", "gpu decode")


# ---------------------------------------------------------------- the poison hook itself
def test_poison_hook_exposes_unwritten_outputs():
    def writes_nothing(x_ref, o_ref):
        pass

    out = common.call(writes_nothing, out_shape=jax.ShapeDtypeStruct((16,), F32), grid=(1,),
                       args=(jnp.ones(16, F32),), interpret=True, num_warps=4, num_stages=1, name="writes_nothing")
    assert np.all(np.isnan(np.asarray(out)))


def test_poison_hook_restores_the_plain_call():
    before = common.pallas_call
    with testing.poisoned_outputs():
        assert common.pallas_call is not before
    assert common.pallas_call is before


# ---------------------------------------------------------------- errors
def _err(fn, *words):
    with pytest.raises(ValueError) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in error message {msg!r}"
    assert "\n" not in msg


def test_matmul_errors():
    a, b = jnp.ones((4, 8), F32), jnp.ones((8, 3), F32)
    _err(lambda: pk.matmul(jnp.ones((2, 4, 8)), b), "a", "[M, K]")
    _err(lambda: pk.matmul(a, jnp.ones(8)), "b", "[K, N]")
    _err(lambda: pk.matmul(a, jnp.ones((7, 3))), "b", "K = a.shape[1]")
    _err(lambda: pk.matmul(a.astype(jnp.int32), b.astype(jnp.int32)), "a", "int32")
    _err(lambda: pk.matmul(a, b.astype(BF16)), "b", "bfloat16")
    _err(lambda: pk.matmul(a, b, out_dtype=jnp.int8), "out_dtype")
    _err(lambda: pk.matmul(jnp.ones((0, 8)), b), "a", "empty")
    _err(lambda: pk.matmul(a, b, mode="fast"), "mode")
    # Shape errors fire at trace time, inside jit.
    _err(lambda: jax.jit(lambda x, y: pk.matmul(x, y, mode="interpret"))(a, jnp.ones((7, 3))), "b")


def test_flash_attention_errors():
    q, k = jnp.ones((1, 4, 4, 32), F32), jnp.ones((1, 6, 2, 32), F32)
    fa_ = pk.flash_attention
    _err(lambda: fa_(q[0], k, k), "q", "[B, T, Hq, D]")
    _err(lambda: fa_(q, k[0], k), "k", "[B, S, Hkv, D]")
    _err(lambda: fa_(q, k, jnp.ones((1, 6, 2, 16))), "v", "match")
    _err(lambda: fa_(q, jnp.ones((2, 6, 2, 32)), jnp.ones((2, 6, 2, 32))), "batch")
    _err(lambda: fa_(q, jnp.ones((1, 6, 2, 16)), jnp.ones((1, 6, 2, 16))), "head dim")
    _err(lambda: fa_(jnp.ones((1, 4, 4, 48)), jnp.ones((1, 6, 2, 48)), jnp.ones((1, 6, 2, 48))), "q", "48")
    _err(lambda: fa_(jnp.ones((1, 4, 4, 32)), jnp.ones((1, 6, 3, 32)), jnp.ones((1, 6, 3, 32))), "multiple")
    _err(lambda: fa_(jnp.ones((1, 8, 4, 32)), k, k), "S >= T")
    _err(lambda: fa_(q, k.astype(BF16), k.astype(BF16)), "k", "dtype")
    _err(lambda: fa_(q.astype(jnp.int32), k.astype(jnp.int32), k.astype(jnp.int32)), "q", "int32")
    _err(lambda: fa_(q, k, k, sm_scale=-1.0), "sm_scale")
    _err(lambda: fa_(q, k, k, sm_scale="big"), "sm_scale")
    _err(lambda: fa_(q, k, k, q_offsets=jnp.asarray([1, 2])), "q_offsets", "[B]")
    _err(lambda: fa_(q, k, k, q_offsets=jnp.asarray([1.5])), "q_offsets", "integers")
    _err(lambda: fa_(q, k, k, q_offsets=jnp.asarray([-1])), "q_offsets", ">= 0")
    _err(lambda: fa_(q, k, k, causal=False, q_offsets=jnp.asarray([0])), "q_offsets", "causal")


# ---------------------------------------------------------------- paged decode attention
PAGED_CASES = [
    # (B, Hq, Hkv, D, block_size, pool blocks, pages per row, lengths, splits, dtype): odd block counts,
    # lengths that are not block multiples, rows sharing blocks, splits whose runs start past a row's end
    (3, 6, 2, 64, 16, 11, 5, [37, 80, 1], None, F32),
    (2, 8, 2, 32, 32, 7, 3, [33, 96], 2, F32),
    (4, 4, 4, 32, 16, 13, 7, [17, 111, 64, 2], 3, F32),
    (2, 8, 1, 64, 16, 9, 5, [79, 20], None, BF16),
    (2, 4, 2, 128, 64, 5, 3, [130, 191], 2, F16),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,hq,hkv,d,bs,n_blocks,pages,lengths,splits,dtype", PAGED_CASES)
def test_paged_decode_attention_matches_float64(mode, b, hq, hkv, d, bs, n_blocks, pages, lengths, splits, dtype):
    """Tables drawn at random from the pool (rows share blocks, a row's pages are out of order);
    positions past each row's length hold huge values in the blocks that only those positions use."""
    rng = np.random.default_rng(n_blocks * 7 + d)
    q = rand(rng, (b, hq, d), dtype)
    kp, vp = rand(rng, (n_blocks, bs, hkv, d), dtype), rand(rng, (n_blocks, bs, hkv, d), dtype)
    tables = jnp.asarray(rng.integers(0, n_blocks, (b, pages)), jnp.int32)
    lengths = jnp.asarray(lengths, jnp.int32)
    want = testing.paged_decode_attention_f64(q, kp, vp, tables, lengths)
    config = None if splits is None else pk.PagedDecodeAttentionConfig(num_splits=splits)
    out = pk.paged_decode_attention(q, kp, vp, tables, lengths, mode=mode, config=config)
    assert out.shape == q.shape and out.dtype == q.dtype
    what = f"paged decode B{b} H{hq}/{hkv} D{d} bs{bs} splits {splits}"
    assert_close(out, want, dtype, mode, what)
    assert_close(pk.reference.paged_decode_attention(q, kp, vp, tables, lengths), want, dtype, mode,
                 what + " (reference)")
    # The check can fail: a table that points each page at the next block of the pool is another answer.
    other = (tables + 1) % n_blocks
    moved = pk.paged_decode_attention(q, kp, vp, other, lengths, mode=mode, config=config)
    assert float(np.max(np.abs(f64(moved) - want))) > 10 * tol(dtype, mode)


@pytest.mark.parametrize("mode", MODES)
def test_paged_decode_attention_ignores_blocks_past_the_length(mode):
    """Garbage in the unused part of a row's last block and in the table entries past its length
    (the serving engine's null block) changes nothing."""
    rng = np.random.default_rng(5)
    b, hq, hkv, d, bs, n = 2, 4, 2, 32, 16, 6
    q = rand(rng, (b, hq, d), F32)
    kp, vp = rand(rng, (n, bs, hkv, d), F32), rand(rng, (n, bs, hkv, d), F32)
    tables = jnp.asarray([[1, 2, 0, 0], [3, 4, 5, 0]], jnp.int32)
    lengths = jnp.asarray([21, 40], jnp.int32)
    want = testing.paged_decode_attention_f64(q, kp, vp, tables, lengths)
    kp = kp.at[0].set(1e4).at[2, 5:].set(1e4).at[5, 8:].set(-1e4)
    vp = vp.at[0].set(-1e4).at[2, 5:].set(1e4).at[5, 8:].set(1e4)
    out = pk.paged_decode_attention(q, kp, vp, tables, lengths, mode=mode, config=pk.PagedDecodeAttentionConfig(2))
    assert_close(out, want, F32, mode, "paged decode with garbage past the lengths")


def test_paged_decode_attention_plan_and_errors():
    p = pk.paged_decode_attention_plan(1, 512, 16, 8, num_sms=132)
    assert p.num_splits > 1 and p.pages_per_split * p.num_splits >= 512 and p.grid[1:] == (8, 1)
    assert pk.paged_decode_attention_plan(64, 16, 16, 8, num_sms=132).num_splits == 2
    q, kp = jnp.ones((2, 4, 32), F32), jnp.ones((5, 16, 2, 32), F32)
    t, n = jnp.asarray([[1, 2], [3, 4]], jnp.int32), jnp.asarray([5, 32], jnp.int32)
    pda = pk.paged_decode_attention
    _err(lambda: pda(q, jnp.ones((5, 8, 2, 32)), jnp.ones((5, 8, 2, 32)), t, n), "blocks of 8", "power of two")
    _err(lambda: pda(q, jnp.ones((5, 24, 2, 32)), jnp.ones((5, 24, 2, 32)), t, n), "power of two")
    _err(lambda: pda(q, kp, kp, t[0], n), "block_tables", "[B, pages]")
    _err(lambda: pda(q, kp, kp, t.astype(F32), n), "block_tables", "int32")
    _err(lambda: pda(q, kp, kp, t, jnp.asarray([0, 3])), "lengths", "1..pages * block_size = 32")
    _err(lambda: pda(q, kp, kp, t, jnp.asarray([1, 33])), "lengths", "1..pages")
    _err(lambda: pda(q, kp, kp, t + 2, n), "block_tables", "blocks 0..4")
    _err(lambda: pda(q, kp, jnp.ones((5, 16, 2, 16)), t, n), "v_pages")
    _err(lambda: pda(q, kp, kp, t, n, mode="mosaic_interpret"), "bfloat16 or float16")
    _err(lambda: pk.PagedDecodeAttentionConfig(0), "num_splits")


def test_decode_attention_errors():
    q, kc = jnp.ones((2, 4, 32), F32), jnp.ones((2, 10, 2, 32), F32)
    n = jnp.asarray([1, 10], jnp.int32)
    da_ = pk.decode_attention
    _err(lambda: da_(q[0], kc, kc, n), "q", "[B, Hq, D]")
    _err(lambda: da_(q, kc[0], kc, n), "k_cache", "[B, S_max, Hkv, D]")
    _err(lambda: da_(q, kc, jnp.ones((2, 11, 2, 32)), n), "v_cache")
    _err(lambda: da_(jnp.ones((3, 4, 32)), kc, kc, n), "batch")
    _err(lambda: da_(q, jnp.ones((2, 10, 3, 32)), jnp.ones((2, 10, 3, 32)), n), "multiple")
    _err(lambda: da_(jnp.ones((2, 4, 20)), jnp.ones((2, 10, 2, 20)), jnp.ones((2, 10, 2, 20)), n), "head dim")
    _err(lambda: da_(q, kc, kc, jnp.asarray([1, 2, 3])), "lengths", "[B]")
    _err(lambda: da_(q, kc, kc, jnp.asarray([1.0, 2.0])), "lengths", "int32")
    _err(lambda: da_(q, kc, kc, jnp.asarray([0, 5])), "lengths", "1..S_max")
    _err(lambda: da_(q, kc, kc, jnp.asarray([3, 11])), "lengths", "1..S_max")
    _err(lambda: da_(q.astype(F16), kc, kc, n), "k_cache", "dtype")


# ---------------------------------------------------------------- lowering for CUDA on CPU
def _lower_for_cuda(fn, *args):
    """Lower ``fn`` to StableHLO for CUDA (Pallas -> Triton IR) on a machine without a GPU.

    An abstract H200 stands in for the missing device; this runs the whole Pallas->Triton
    lowering (which rejects non-power-of-two blocks and ops Triton lacks) but not Triton's
    own compilation to PTX (that and the shared-memory limits: tests/test_triton_compile.py)."""
    from jax._src import mesh as mesh_lib  # private: AbstractDevice has no public export yet

    device = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
    mesh = mesh_lib.AbstractMesh((1,), ("x",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the Triton backend's deprecation
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


S = jax.ShapeDtypeStruct


@pytest.mark.parametrize("m,k,n,dtype", [(1, 8192, 8192, BF16), (64, 8192, 8192, BF16), (8192, 8192, 8192, BF16),
                                         (37, 70, 45, F32), (300, 20, 40, F16)])
def test_matmul_lowers_for_cuda(m, k, n, dtype):
    text = _lower_for_cuda(lambda a, b: mm_mod.pallas_matmul(a, b, interpret=False),
                           S((m, k), dtype), S((k, n), dtype))
    assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("b,t,s,hq,hkv,d,causal", [(4, 4096, 4096, 16, 16, 128, True), (2, 19, 40, 4, 2, 32, True),
                                                   (1, 1, 37, 8, 1, 64, False), (1, 17, 50, 4, 1, 256, True)])
def test_flash_attention_lowers_for_cuda(b, t, s, hq, hkv, d, causal):
    text = _lower_for_cuda(lambda q, k, v: fa_mod.pallas_flash_attention(q, k, v, causal=causal, interpret=False),
                           S((b, t, hq, d), BF16), S((b, s, hkv, d), BF16), S((b, s, hkv, d), BF16))
    assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("b,t,s,hkv,d,dtype", [(12, 16, 256, 2, 64, F32), (8, 16, 4096, 8, 128, BF16)])
def test_flash_attention_with_q_offsets_lowers_for_cuda(b, t, s, hkv, d, dtype):
    """The serving engine's prompt pieces: 16 queries each, placed inside a slot's row."""
    text = _lower_for_cuda(lambda q, k, v, o: fa_mod.pallas_flash_attention(q, k, v, q_offsets=o, interpret=False),
                           S((b, t, 4 * hkv, d), dtype), S((b, s, hkv, d), dtype), S((b, s, hkv, d), dtype),
                           S((b,), jnp.int32))
    assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("b,hq,hkv,d,s_max,dtype", [(64, 32, 8, 128, 4096, BF16), (1, 32, 8, 128, 32768, BF16),
                                                    (3, 8, 2, 32, 50, F32), (2, 8, 1, 64, 33, F16)])
def test_decode_attention_lowers_for_cuda(b, hq, hkv, d, s_max, dtype):
    text = _lower_for_cuda(lambda q, k, v, n: da_mod.pallas_decode_attention(q, k, v, n, interpret=False),
                           S((b, hq, d), dtype), S((b, s_max, hkv, d), dtype), S((b, s_max, hkv, d), dtype),
                           S((b,), jnp.int32))
    assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("b,hq,hkv,d,bs,pages,dtype", [(64, 32, 8, 128, 16, 256, BF16), (1, 32, 8, 64, 16, 2048, BF16),
                                                      (3, 6, 2, 64, 16, 16, F32), (2, 8, 1, 64, 32, 5, F16)])
def test_paged_decode_attention_lowers_for_cuda(b, hq, hkv, d, bs, pages, dtype):
    pool = S((b * pages + 1, bs, hkv, d), dtype)
    text = _lower_for_cuda(lambda q, k, v, t, n: pda_mod.pallas_paged_decode_attention(q, k, v, t, n, interpret=False),
                           S((b, hq, d), dtype), pool, pool, S((b, pages), jnp.int32), S((b,), jnp.int32))
    assert text.count("__gpu$xla.gpu.triton") == 1


def test_cuda_lowering_rejects_non_power_of_two_blocks():
    """The lowering check above is real: a kernel loading a 24-element block is refused."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    def copy24(x_ref, o_ref):
        plgpu.store(o_ref.at[pl.ds(0, 24)], plgpu.load(x_ref.at[pl.ds(0, 24)]))

    def fn(x):
        return common.call(copy24, out_shape=jax.ShapeDtypeStruct((48,), BF16), grid=(1,), args=(x,),
                            interpret=False, num_warps=4, num_stages=1, name="copy24")

    with pytest.raises(Exception, match="power of 2"):
        _lower_for_cuda(fn, S((48,), BF16))
