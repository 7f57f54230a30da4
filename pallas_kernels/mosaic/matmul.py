"""Hopper matmul ``a [M, K] @ b [K, N]`` in Mosaic GPU: TMA, wgmma, warp specialisation, persistent CTAs.

Layout and math
---------------
``a`` is ``[M, K]`` and ``b`` is ``[K, N]``, both row-major bf16 or f16 (the tensor cores' input
types); ``out[i, j] = sum_k a[i, k] * b[k, j]`` accumulated in f32 by the tensor cores and cast
once to ``out_dtype`` (default: the input dtype). ``b`` is the weight of a model's projection:
nothing here copies, pads or transposes it.

Work units, grid and why
------------------------
- The output is cut into CTA tiles of ``tile_m x (consumers * tile_n)``. A *work unit* is one
  CTA tile and one contiguous range of K (a *K split*): ``units = m_tiles * n_tiles * k_splits``.
- The grid is **persistent**: ``min(num_sms, units)`` CTAs, one per SM; CTA ``c`` runs units
  ``c, c + grid, c + 2*grid, ...`` (``plgpu.nd_loop``). Shared memory and barriers are set up
  once per CTA and reused by every unit it runs.
- Each CTA runs ``consumers + 1`` warpgroups (``plgpu.emit_pipeline_warp_specialized``): a
  *producer* that only issues TMA copies of ``[tile_m, tile_k]`` slabs of ``a`` and
  ``[tile_k, consumers * tile_n]`` slabs of ``b`` into a ring of ``stages`` shared-memory slots,
  with few registers (40 per thread, ``setmaxnreg``), and one or two *consumers*, each owning
  ``tile_m x tile_n`` of the tile, that issue ``wgmma`` on the shared slabs into an f32
  register accumulator and hand each slot back to the producer once their wgmma is done.
  ``delay_release=1`` would keep one wgmma in flight across steps (the tensor core never waits
  for the hand-back); it is off by default because with the helper's slot recycling across
  units the producer may refill a slot whose last wgmma is still reading (the interpreter
  catches it outright when a unit has a single step; plan() then turns it off).
- Epilogue: each consumer casts its accumulator, writes it to shared memory in
  ``epi_m x epi_n`` sub-tiles (two slots, so filling one overlaps the TMA store of the other)
  and stores them with TMA.
- Decode shapes (``M <= 64``: M is the batch) have a single tile row, so tiling N alone would
  give 24 units for the fused QKV projection of Llama-3.2-1B (N = 3072 in 128-wide tiles):
  108 of 132 SMs would stream no weight. :func:`plan` therefore tries CTA tiles 64 x 128 (two
  consumers) and 64 x 64 (one) and every K split, and keeps the cheapest by a small model of
  the time (the weight bytes of the busiest SM, one pipeline fill per unit, and the SM's share
  of the partial sums a split writes and re-reads), preferring the splits that give every SM
  at least one unit. With more than one split each unit writes an f32 partial
  ``[k_splits, M, N]`` and one fused XLA reduction sums them and casts: an extra launch, and
  partials of up to half the weight's bytes (written, then read again) for the small 1B
  projections at M = 64, at most 6% at M = 1. With one split the kernel writes ``out_dtype``
  directly.
- Why not "2 CTAs per SM": the CTA is persistent and its ring of slabs takes most of an SM's
  227 KiB of shared memory, so a second CTA would not be resident anyway. What matters for a
  weight-streaming matmul is that **every SM gets weight tiles** and that the busiest SM does
  not stream much more than the average (``MatmulPlan.balance``, >= 0.79 for every decode
  projection of Llama-3.2-1B and Llama-3-8B on 132 and 108 SMs: see the tests).

Edges (M, N, K not multiples of the tiles)
------------------------------------------
Handled by **TMA's out-of-bounds handling**, not by masks: a TMA load whose box crosses the
end of a dimension fills the missing elements with zeros (``OOBFillMode.ZEROS``), and a TMA
store drops the elements outside the array. A zero in ``a`` *or* ``b`` adds nothing to a dot
product, so the last K split may run past K; rows and columns past M or N are computed from
zeros and never stored; none of it reads HBM. Mosaic GPU's swizzled
TMA copies view each global array as whole ``8 x swizzle-width`` tiles (:func:`padding`), so:
- M is padded to a multiple of 8 rows and K to the swizzle width (64 for 2-byte types with
  128-byte swizzle) in a copy of the activation ``a`` (a few KB at decode); the output's extra
  rows are sliced off;
- the weight ``b`` is never copied when K is a multiple of 8 and N of the swizzle width (true of
  every model projection): its rows past K are zero-filled by TMA. An awkward weight (K not a
  multiple of 8, N not of the swizzle width) is padded in a copy, on every call; in mode
  "pallas" such a call runs on the Triton tier instead, which masks its edges for free.

Not here: 2-CTA clusters with TMA multicast of the shared operand, an L2-aware tile order
(units run in row-major order), stream-K (units are whole K splits), split-K reduction inside
the kernel (GPU interpret mode has no TMA reduce-add to test it with), FP8.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mosaic import common as C


# ----------------------------------------------------------------------------- the kernel
def matmul_kernel(a_gmem, b_gmem, out_gmem, *, p: MatmulPlan):
    # a_gmem: [M, K]; b_gmem: [K, N]; out_gmem: [M, N] (out dtype) or [k_splits, M, N] f32.
    c = p.config
    tm, tn, tk = c.tile_m, c.tile_n, c.tile_k
    cta_n = c.cta_n
    out_dtype = out_gmem.dtype
    a_tf = C.swizzled(tk, a_gmem.dtype)
    b_tf = C.swizzled(tn, b_gmem.dtype)      # each consumer slices whole swizzle tiles
    epi_n = epi_cols(c, out_dtype)
    out_tf = C.swizzled(epi_n, out_dtype)

    def make_pipeline(body, compute_context):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(p.steps_per_split,),
            memory_registers=40,
            in_specs=[
                plgpu.BlockSpec((tm, tk), lambda kk: (0, kk), transforms=a_tf,
                                memory_space=plgpu.SMEM, delay_release=c.delay_release),
                plgpu.BlockSpec((tk, cta_n), lambda kk: (kk, 0), transforms=b_tf,
                                memory_space=plgpu.SMEM, delay_release=c.delay_release),
            ],
            wg_axis="wg",
            num_compute_wgs=c.consumers,
            max_concurrent_steps=c.stages,
            compute_context=compute_context,
        )

    ignore = lambda *_, **__: None  # allocations do not depend on the bodies

    @functools.partial(
        pl.run_scoped,
        ring=make_pipeline(ignore, ignore).get_allocations(a_gmem, b_gmem),
        out_smem=plgpu.SMEM((c.consumers, 2, c.epi_m, epi_n), out_dtype, transforms=out_tf),
        collective_axes="wg",
    )
    def _scope(ring, out_smem):
        wg = lax.axis_index("wg")                  # 0 .. consumers-1: consumers; last: producer

        @plgpu.nd_loop((p.m_tiles, p.n_tiles, p.k_splits), collective_axes="sm")
        def _unit(info):
            mi, ni, si = info.index
            rows = pl.ds(mi * tm, tm)
            cols = pl.ds(ni * cta_n, cta_n)
            ks = pl.ds(si * (p.steps_per_split * tk), p.steps_per_split * tk)
            out = out_gmem.at[si] if p.k_splits > 1 else out_gmem   # [M, N]

            def mma(_, a_smem, b_smem, acc):
                # a_smem: [tm, tk]; b_smem: [tk, 2*tn]; acc: [tm, tn] f32 (this warpgroup's half).
                plgpu.wgmma(acc, a_smem, b_smem.at[:, pl.ds(wg * tn, tn)])
                plgpu.wgmma_wait(c.delay_release)
                return acc

            def consumer(run_pipeline):
                @functools.partial(pl.run_scoped, acc=plgpu.ACC((tm, tn), jnp.float32))
                def _(acc):
                    run_pipeline(acc)
                    res = acc[...].astype(out_dtype)      # [tm, tn], waits for the last wgmma
                    mine = out.at[rows, cols].at[:, pl.ds(wg * tn, tn)]
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # previous unit's stores
                    n_epi = tn // epi_n
                    for e in range(tm // c.epi_m * n_epi):
                        em, en = divmod(e, n_epi)
                        er = slice(em * c.epi_m, (em + 1) * c.epi_m)
                        ec = slice(en * epi_n, (en + 1) * epi_n)
                        plgpu.wait_smem_to_gmem(1, wait_read_only=True)   # this slot is free
                        out_smem[wg, e % 2] = res[er, ec]
                        plgpu.commit_smem()
                        # TMA store: the parts of the sub-tile past M or N are dropped.
                        plgpu.copy_smem_to_gmem(out_smem.at[wg, e % 2], mine.at[er, ec])

            make_pipeline(mma, consumer)(a_gmem.at[rows, ks], b_gmem.at[ks, cols],
                                         allocations=ring)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


# ----------------------------------------------------------------------------- entry points
@C.one_entry("out_dtype", "config", "interpret")
def matmul(a, b, *, out_dtype=None, config: MosaicMatmulConfig | None = None,
           interpret=False):
    """``a [M, K] @ b [K, N]`` on Hopper tensor cores (bf16/f16 in, f32 accumulation), any M, K, N.

    Assumes shapes were validated by the caller; raises ``ValueError`` only for f32 inputs.
    Edges that are not tile multiples are zero-filled (:func:`padding`): TMA's own zero fill where
    it can, a copy of the activation for ragged rows or K, of the weight only for a K not a
    multiple of 8 or an N not a multiple of the swizzle width. ``interpret=True`` (or a
    ``plgpu.InterpretGPUParams``) runs under GPU interpret mode on any machine. See the module
    docstring for the decomposition.
    """
    C.check_mma_dtype(a, "a", "matmul")
    C.check_mma_dtype(b, "b", "matmul")
    m, k = a.shape
    n = b.shape[1]
    out_dtype = jnp.dtype(a.dtype if out_dtype is None else out_dtype)
    pad = padding(m, k, n, plan(m, k, n, a.dtype, config=config).config, a.dtype, out_dtype)
    if (pad["m"], pad["k"]) != (m, k):    # the activation: a few zero rows, zero columns up to whole tiles
        a = jnp.pad(a, ((0, pad["m"] - m), (0, pad["k"] - k)))
    if pad["weight"]:                     # an awkward weight: K rows to a multiple of 8, N to whole tiles
        b = jnp.pad(b, ((0, C.round_up(k, 8) - k), (0, pad["n"] - n)))
    p = plan(pad["m"], pad["k"], pad["n"], a.dtype, config=config)   # rows of b past K: zero-filled by TMA
    split = p.k_splits > 1
    out_type = jax.ShapeDtypeStruct((p.k_splits, pad["m"], pad["n"]) if split else (pad["m"], pad["n"]),
                                    jnp.float32 if split else out_dtype)
    call = plgpu.kernel(
        functools.partial(matmul_kernel, p=p),
        out_type=out_type,
        grid=p.grid,
        grid_names=("sm",),
        num_threads=p.config.consumers + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=C.interpret_params(interpret),
    )
    out = call(a, b)
    if split:
        out = jnp.sum(out, axis=0).astype(out_dtype)
    return out[:m, :n] if (pad["m"], pad["n"]) != (m, n) else out


def tma_multiples(config: MosaicMatmulConfig, dtype, out_dtype) -> tuple[int, int]:
    """(k_multiple, n_multiple): what K and N must be multiples of for the swizzled TMA copies.

    Mosaic GPU views a global array that TMA copies into a tiled, swizzled shared-memory buffer
    as whole ``8 x swizzle-width`` tiles, so the array's last dimension must be a multiple of
    the swizzle width (64 elements for 2-byte types and 128-byte swizzle)."""
    k_mult = len_of_swizzle_row(config.tile_k, dtype)
    n_mult = math.lcm(len_of_swizzle_row(config.tile_n, dtype),
                      len_of_swizzle_row(epi_cols(config, out_dtype), out_dtype),
                      len_of_swizzle_row(epi_cols(config, jnp.float32), jnp.float32))
    return k_mult, n_mult


def len_of_swizzle_row(minor_elems: int, dtype) -> int:
    itemsize = jnp.dtype(dtype).itemsize
    return plgpu.find_swizzle(minor_elems * itemsize * 8) // itemsize


def padding(m: int, k: int, n: int, config: MosaicMatmulConfig, dtype, out_dtype) -> dict:
    """What the operands must be padded to for this tier's TMA copies, which view every array as
    whole ``8 x swizzle-width`` tiles (:func:`tma_multiples`): ``{"m", "k", "n"}`` padded sizes
    and ``"weight"``: whether the weight ``b`` itself needs a copy (its rows K not a multiple of 8,
    or its columns N not a multiple of the swizzle width: no model projection is such a shape).
    Rows of ``a`` and columns of ``a`` (K) are padded in a copy of the activation; rows of ``b``
    past K are zero-filled by TMA itself when K is a multiple of 8 (a copy reads nothing there)."""
    k_mult, n_mult = tma_multiples(config, dtype, out_dtype)
    sizes = {"m": C.round_up(m, 8), "k": C.round_up(k, k_mult), "n": C.round_up(n, n_mult)}
    return dict(sizes, weight=(k % 8 != 0) or sizes["n"] != n)


def unsupported(a, b, out_dtype=None, config: MosaicMatmulConfig | None = None, *,
                allow_copies: bool = True) -> str | None:
    """Why this tier cannot (or, with ``allow_copies=False``, should not) take ``a @ b``: a one-line
    reason, or None. It takes any shape, but a K or N that is not a multiple of the TMA tiles
    costs a copy of the weight on every call (:func:`padding`): where another tier can run the
    call without one (mode "pallas"), it should."""
    for x, name in ((a, "a"), (b, "b")):
        if jnp.dtype(x.dtype) not in C.MMA_DTYPES:
            return f"{name} has dtype {x.dtype}; the Mosaic GPU matmul takes bfloat16 or float16"
    m, k = a.shape
    n = b.shape[1]
    out_dtype = jnp.dtype(a.dtype if out_dtype is None else out_dtype)
    if not allow_copies and padding(m, k, n, plan(m, k, n, a.dtype, config=config).config, a.dtype,
                                    out_dtype)["weight"]:
        return (f"K={k}, N={n}: the Mosaic GPU matmul would copy the weight to pad it to whole TMA tiles "
                "(K a multiple of 8, N of the swizzle width)")
    return None


# ----------------------------------------------------------------------------- config and plan
DECODE_M = 64  # M up to this is "decode-shaped": one wgmma tile row holds the whole batch


@dataclasses.dataclass(frozen=True)
class MosaicMatmulConfig:
    """Tiles and pipeline depth. The CTA tile is ``tile_m x (consumers * tile_n)``: one or two
    consumer warpgroups side by side in N. ``k_splits=None`` lets :func:`plan` choose;
    ``num_sms=None`` reads the device (132, an H200, when there is no GPU)."""

    tile_m: int = 128       # rows per consumer warpgroup (wgmma M: a multiple of 64)
    tile_n: int = 128       # columns per consumer warpgroup
    tile_k: int = 64        # K per pipeline step (64 x 2 bytes = one 128-byte swizzle row)
    stages: int = 4         # shared-memory slots in the TMA ring
    epi_m: int = 64         # epilogue sub-tile: epi_m rows x epi_n 2-byte columns
    epi_n: int = 64         # (half as many columns for an f32 output: same bytes)
    delay_release: int = 0  # wgmmas kept in flight before a slot is handed back (see docs)
    consumers: int = 2      # consumer warpgroups (1 or 2)
    k_splits: int | None = None
    num_sms: int | None = None

    def __post_init__(self):
        if self.tile_m % 64:
            raise ValueError(f"tile_m={self.tile_m} must be a multiple of 64 (the wgmma M)")
        if self.tile_n % 8 or self.tile_k % 16:
            raise ValueError(f"tile_n={self.tile_n} must be a multiple of 8 and tile_k={self.tile_k} of 16")
        if self.tile_m % self.epi_m or self.tile_n % self.epi_n:
            raise ValueError("epi_m / epi_n must divide tile_m / tile_n")
        if self.consumers not in (1, 2):
            raise ValueError(f"consumers={self.consumers} must be 1 or 2")
        if not 0 <= self.delay_release < self.stages:
            raise ValueError(f"delay_release={self.delay_release} must lie in 0..stages-1")

    @property
    def cta_n(self) -> int:
        return self.consumers * self.tile_n


# Defaults by shape class (starting points, to be tuned on an H200). Decode: one 64-row tile,
# narrow N tiles (plan() may drop to one consumer: 64 columns), a deep ring: the weight stream is all that matters. Prefill: 128 x 256 CTA
# tiles, the shape class jax's own Hopper matmul example is tuned around; 4 stages = 192 KiB
# of slabs plus 32 KiB of epilogue buffers fits the 227 KiB a Hopper CTA may use.
DECODE_CONFIG = MosaicMatmulConfig(tile_m=64, tile_n=64, tile_k=64, stages=6, epi_m=64, epi_n=32)
PREFILL_CONFIG = MosaicMatmulConfig(tile_m=128, tile_n=128, tile_k=64, stages=4, epi_m=64, epi_n=64)


@dataclasses.dataclass(frozen=True)
class MatmulPlan:
    """How one ``[m, k] @ [k, n]`` call is cut up. ``grid == (num_ctas,)``."""

    config: MosaicMatmulConfig
    m: int
    n: int
    k: int
    num_sms: int
    m_tiles: int
    n_tiles: int
    k_splits: int
    steps_per_split: int    # K steps (of tile_k) per unit; the last split may read zeros past K
    grid: tuple[int, ...]

    @property
    def units(self) -> int:
        return self.m_tiles * self.n_tiles * self.k_splits

    @property
    def num_ctas(self) -> int:
        return self.grid[0]

    @property
    def units_per_cta(self) -> tuple[int, int]:
        """(fewest, most) units any CTA runs."""
        return self.units // self.num_ctas, C.cdiv(self.units, self.num_ctas)

    @property
    def balance(self) -> float:
        """Mean over max of the K steps each SM runs (1.0: all SMs equally busy)."""
        total = self.units * self.steps_per_split
        return total / (self.num_sms * self.units_per_cta[1] * self.steps_per_split)

    @property
    def partial_bytes(self) -> int:
        """Bytes of f32 partial sums the kernel writes (and the reduction reads back)."""
        return 0 if self.k_splits == 1 else self.k_splits * C.round_up(self.m, 8) * self.n * 4

    def smem_bytes(self, itemsize: int = 2) -> int:
        """Shared memory of one CTA: the TMA ring plus 2 epilogue slots per consumer."""
        return smem_bytes(self.config, itemsize)


def smem_bytes(c: MosaicMatmulConfig, itemsize: int = 2) -> int:
    slabs = c.stages * (c.tile_m * c.tile_k + c.tile_k * c.cta_n) * itemsize
    return slabs + c.consumers * 2 * c.epi_m * c.epi_n * 2


def epi_cols(c: MosaicMatmulConfig, out_dtype) -> int:
    """Epilogue sub-tile columns for ``out_dtype`` (``epi_n`` 2-byte columns' worth of bytes)."""
    return max(8, c.epi_n * 2 // jnp.dtype(out_dtype).itemsize)


def _split_options(config: MosaicMatmulConfig, m, n, k, itemsize, num_sms):
    """Yield ((prefers_fewer_units, cost), k_splits) for every sensible K split of ``config``.

    The cost is a time model in bytes one SM moves: the weight slabs of the busiest SM
    (``waves * steps``), one extra step per unit for its pipeline fill, and the SM's share of
    the f32 partials that a split matmul writes and the reduction reads back. Splits that
    would leave SMs without a unit sort last whenever the shape has enough K steps to avoid it.
    """
    m_tiles = C.cdiv(m, config.tile_m)
    n_tiles = C.cdiv(n, config.cta_n)
    k_steps = C.cdiv(k, config.tile_k)
    weight_step = config.tile_k * config.cta_n * itemsize
    need = min(num_sms, m_tiles * n_tiles * k_steps)   # units for every SM to have one
    fixed = config.k_splits
    for s in ([fixed] if fixed else range(1, min(k_steps, MAX_K_SPLITS) + 1)):
        s = max(1, min(s, k_steps))
        steps = C.cdiv(k_steps, s)
        s = C.cdiv(k_steps, steps)                 # drop splits that would hold no real K step
        units = m_tiles * n_tiles * s
        waves = C.cdiv(units, num_sms)
        cost = waves * (steps + 1) * weight_step
        if s > 1:
            cost += 2 * s * C.round_up(m, 8) * n * 4 / num_sms
        yield (units < need, cost), s


MAX_K_SPLITS = 64
DECODE_CONSUMERS = (2, 1)   # decode CTA tiles plan() may pick: 64 x 128 (two consumers) or 64 x 64


def plan(m: int, k: int, n: int, dtype=jnp.bfloat16, *, num_sms: int | None = None,
         config: MosaicMatmulConfig | None = None) -> MatmulPlan:
    """The work decomposition for an ``[m, k] @ [k, n]`` matmul on ``num_sms`` SMs.

    Without a config, decode shapes (``m <= 64``) try the decode tiles with each consumer
    count in ``DECODE_CONSUMERS`` (CTA tiles 64 x 128 and 64 x 64) and every K split, and keep the cheapest by the model in
    ``_split_options``; larger ``m`` uses ``PREFILL_CONFIG``. With a config only ``k_splits``
    (when None) is chosen. ``plan(...).config`` is the resolved config (``k_splits`` set).
    """
    if config is None:
        candidates = ([dataclasses.replace(DECODE_CONFIG, consumers=w) for w in DECODE_CONSUMERS]
                      if m <= DECODE_M else [PREFILL_CONFIG])
    else:
        candidates = [config]
    num_sms = num_sms or candidates[0].num_sms or C.device_num_sms()
    itemsize = jnp.dtype(dtype).itemsize
    key, cfg, splits = min(
        ((key, cfg, s) for cfg in candidates
         for key, s in _split_options(cfg, m, n, k, itemsize, num_sms)),
        key=lambda t: t[0])
    steps = C.cdiv(C.cdiv(k, cfg.tile_k), splits)
    # Keeping a wgmma in flight across steps needs at least two steps per unit: with one, the
    # producer could refill the slot of the next unit before its last wgmma is done (the
    # interpreter catches this as a barrier that completes a phase nobody observed).
    dr = cfg.delay_release if steps > cfg.delay_release else 0
    cfg = dataclasses.replace(cfg, k_splits=splits, num_sms=num_sms, delay_release=dr)
    if smem_bytes(cfg, itemsize) > C.HOPPER_SMEM_BYTES:
        raise ValueError(f"config needs {smem_bytes(cfg, itemsize)} bytes of shared memory per CTA; "
                         f"Hopper allows {C.HOPPER_SMEM_BYTES}: lower stages or the tiles")
    m_tiles = C.cdiv(m, cfg.tile_m)
    n_tiles = C.cdiv(n, cfg.cta_n)
    units = m_tiles * n_tiles * splits
    return MatmulPlan(config=cfg, m=m, n=n, k=k, num_sms=num_sms, m_tiles=m_tiles,
                      n_tiles=n_tiles, k_splits=splits, steps_per_split=steps,
                      grid=(min(num_sms, units),))
