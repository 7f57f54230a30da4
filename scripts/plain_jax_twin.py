"""The lab's model beside a plain-JAX twin: the same weights, the same greedy tokens, timed side by side.

    .venv/bin/python scripts/plain_jax_twin.py [--preset small] [--prompt-len 256] [--repeats 7]

The twin is a Llama in about eighty lines of jax.numpy: separate q, k, v, o and MLP matrices
(split from the lab's fused ones), an einsum attention, a jitted prefill and a jitted decode
loop (``lax.fori_loop``) over a KV cache written with ``dynamic_update_slice``. No Pallas, no
engine, no checks: what someone would write in an afternoon. If the lab's prefill or decode is
slower than that, the lab is leaving speed on the table; the table says by how much. Both run
through the lab's one timer (round-robin, medians), prefill at ``--prompt-len`` and decode at
batch 1 and 32 from that context, and the twin is checked against the lab before anything is
timed (its prefill logits, and in float32 its greedy tokens: ``check_same_tokens``). docs/benchmarks.md records the table with the processor and versions.
"""

from __future__ import annotations

import argparse
import functools
import platform
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.measure import timing
from inference_lab.model.kv_cache import KVCache
from inference_lab.model.transformer import Transformer
from inference_lab.runtime import generation
from pallas_kernels.timing import round_robin, timed

HI = jax.lax.Precision.HIGHEST   # float32 at full precision (a GPU would use TF32); 16-bit at XLA's default
# The twin donates caches its prefill reads whole (no in-place update is possible there): by design.
warnings.filterwarnings("ignore", "Some donated buffers were not usable")


# ----------------------------------------------------------------------------- the twin
def twin_weights(model) -> dict:
    """The lab's weights in the plain layout: wq [D, Hq*Dh], wk/wv [D, Hkv*Dh], w1/w3 [D, F]."""
    p, cfg = model.params(), model.cfg
    d, hkv, g, dh = cfg.d_model, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    layers = []
    for lp in p["layers"]:
        qkv = lp["w_qkv"]                                           # [D, Hkv, G + 2, Dh]
        layers.append({"attn_norm": lp["attn_norm"], "mlp_norm": lp["mlp_norm"], "wo": lp["w_o"],
                       "wq": qkv[:, :, :g].reshape(d, hkv * g * dh), "wk": qkv[:, :, g].reshape(d, hkv * dh),
                       "wv": qkv[:, :, g + 1].reshape(d, hkv * dh), "w1": lp["w_gate_up"][:, 0],
                       "w3": lp["w_gate_up"][:, 1], "w2": lp["w_down"]})
    return {"embed": p["embed"], "head": p["head"], "final_norm": p["final_norm"], "layers": layers}


def norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


def rope(x, pos, theta):                                            # x [B, T, H, Dh], pos [B, T]
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1])
    ang = pos[..., None, None].astype(jnp.float32) * freq
    x1, x2 = x[..., :half], x[..., half:]
    x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)                # rotated in float32, kept in x's dtype
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], -1).astype(x.dtype)


def forward(w, tokens, pos, ks, vs, cfg):
    """tokens [B, T] at positions pos [B, T] (a block of consecutive positions); caches [B, S, Hkv, Dh]
    per layer. Returns the last position's logits and the caches with this block written."""
    b, t = tokens.shape
    hq, hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    hi = HI if cfg.dtype == "float32" else None   # a bf16 product at HIGHEST would run in f32 on a GPU
    x = w["embed"][tokens]
    start = pos[0, 0]
    keys = jnp.arange(ks[0].shape[1])
    visible = keys[None, :] <= pos[0][:, None]                      # [T, S] causal over the whole cache
    new_ks, new_vs = [], []
    for lw, kc, vc in zip(w["layers"], ks, vs):
        h = norm(x, lw["attn_norm"], cfg.norm_eps)
        q = rope(jnp.dot(h, lw["wq"], precision=hi).reshape(b, t, hq, dh), pos, cfg.rope_theta)
        k = rope(jnp.dot(h, lw["wk"], precision=hi).reshape(b, t, hkv, dh), pos, cfg.rope_theta)
        v = jnp.dot(h, lw["wv"], precision=hi).reshape(b, t, hkv, dh)
        kc = jax.lax.dynamic_update_slice(kc, k, (0, start, 0, 0))
        vc = jax.lax.dynamic_update_slice(vc, v, (0, start, 0, 0))
        qg = q.reshape(b, t, hkv, hq // hkv, dh)
        s = jnp.einsum("bthgd,bshd->bhgts", qg, kc, precision=hi) * dh ** -0.5
        a = jax.nn.softmax(jnp.where(visible, s, -jnp.inf), -1)
        o = jnp.einsum("bhgts,bshd->bthgd", a, vc, precision=hi).reshape(b, t, hq * dh)
        x = x + jnp.dot(o, lw["wo"], precision=hi)
        h = norm(x, lw["mlp_norm"], cfg.norm_eps)
        x = x + jnp.dot(jax.nn.silu(jnp.dot(h, lw["w1"], precision=hi)) * jnp.dot(h, lw["w3"], precision=hi),
                        lw["w2"], precision=hi)
        new_ks.append(kc)
        new_vs.append(vc)
    logits = jnp.dot(norm(x[:, -1], w["final_norm"], cfg.norm_eps), w["head"], precision=hi)
    return logits, new_ks, new_vs


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("ks", "vs"))
def twin_prefill(w, tokens, ks, vs, *, cfg):
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return forward(w, tokens, pos, ks, vs, cfg)


@functools.partial(jax.jit, static_argnames=("cfg", "steps"), donate_argnames=("ks", "vs"))
def twin_decode(w, first, start, ks, vs, *, cfg, steps):
    def body(i, carry):
        tok, ks, vs, out = carry
        pos = jnp.full((tok.shape[0], 1), start + i)
        logits, ks, vs = forward(w, tok[:, None], pos, ks, vs, cfg)
        nxt = jnp.argmax(logits, -1).astype(jnp.int32)
        return nxt, ks, vs, out.at[:, i].set(nxt)

    out = jnp.zeros((first.shape[0], steps), jnp.int32)
    return jax.lax.fori_loop(0, steps, body, (first, list(ks), list(vs), out))[3]


# ----------------------------------------------------------------------------- side by side
def empty_caches(cfg, batch, length):
    """One layer's K (or V) cache per layer, in the model's dtype (the lab's caches are)."""
    return [jnp.zeros((batch, length, cfg.n_kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype)) for _ in range(cfg.n_layers)]


# How far the twin's prefill logits may be from the lab's, relative to their largest: float32 runs
# the same math to rounding; bfloat16 rounds each matmul's output and the caches to 8 bits of
# mantissa, in another order on each side (the lab's kernels against XLA's einsums).
LOGITS_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def check_same_tokens(model, w, prompt_len: int, steps: int = 8) -> str:
    """Raise unless the twin computes the lab's model: its prefill logits within
    :data:`LOGITS_TOLERANCE` of the lab's and, in float32, the same greedy tokens. In 16-bit
    dtypes two correct implementations can part ways at a near-tie of a random model's logits, so
    the tokens are reported there, not required. Returns the one-line result."""
    cfg = model.cfg
    prompt = np.random.default_rng(0).integers(0, 256, (1, prompt_len), np.int32)
    logits, ks, vs = twin_prefill(w, jnp.asarray(prompt), empty_caches(cfg, 1, prompt_len + steps),
                                  empty_caches(cfg, 1, prompt_len + steps), cfg=cfg)
    lab_logits, _ = generation.prefill(model, prompt, KVCache.create(cfg, 1, prompt_len))
    theirs_l, ours_l = np.asarray(logits, np.float64), np.asarray(lab_logits, np.float64)
    err = float(np.max(np.abs(theirs_l - ours_l)) / max(np.max(np.abs(ours_l)), 1e-30))
    tolerance = LOGITS_TOLERANCE[cfg.dtype]
    assert err <= tolerance, f"the twin is not the same model: prefill logits differ by {err:.2e} (> {tolerance})"
    first = jnp.argmax(logits, -1).astype(jnp.int32)
    theirs = [int(first[0])] + np.asarray(twin_decode(w, first, prompt_len, ks, vs, cfg=cfg, steps=steps - 1))[0].tolist()
    ours = generation.generate(model, [prompt[0].tolist()], max_new_tokens=steps)[0]
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    if cfg.dtype == "float32":
        assert ours == theirs, f"the twin is not the same model: {ours} vs {theirs}"
    return (f"the twin is the lab's model: prefill logits within {err:.1e} of the lab's (relative), "
            f"{same} of {steps} greedy tokens the same")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    cfg = ModelConfig.preset(args.preset)
    model = Transformer(cfg, rngs=nnx.Rngs(0), kernels="auto")
    w = twin_weights(model)
    print(check_same_tokens(model, w, 32))
    t, steps = args.prompt_len, args.steps
    prompt = jnp.asarray(np.random.default_rng(1).integers(0, 256, (1, t), np.int32))

    def twin_prefill_run():
        ks, vs = empty_caches(cfg, 1, t), empty_caches(cfg, 1, t)
        jax.block_until_ready(ks)
        return timed(lambda: twin_prefill(w, prompt, ks, vs, cfg=cfg))

    def twin_decode_run(batch):
        def run():
            ks, vs = empty_caches(cfg, batch, t + steps), empty_caches(cfg, batch, t + steps)   # donated each run
            first = jnp.full((batch,), 7, jnp.int32)
            jax.block_until_ready((ks, vs))
            return timed(lambda: twin_decode(w, first, t, ks, vs, cfg=cfg, steps=steps))
        return run

    lab = [timing.PrefillPoint(model, 1, t), timing.DecodePoint(model, 1, t, steps), timing.DecodePoint(model, 32, t, steps)]
    for p in lab:
        p.prepare()
        p.run()
    runs = [p.run for p in lab] + [twin_prefill_run, twin_decode_run(1), twin_decode_run(32)]
    s = round_robin(runs, args.repeats)
    lab_pre, lab_d1, lab_d32, tw_pre, tw_d1, tw_d32 = (x.median for x in s)
    rows = [("prefill, batch 1", t / lab_pre, t / tw_pre, "tok/s"),
            ("decode, batch 1", steps / lab_d1, steps / tw_d1, "tok/s"),
            ("decode, batch 32", 32 * steps / lab_d32, 32 * steps / tw_d32, "tok/s")]
    print(f"{cfg.name} ({cfg.num_params / 1e6:,.0f}M params, {cfg.dtype}), prompt {t}, {steps} decode steps per loop, "
          f"median of {args.repeats} round-robin repeats; lab kernels: {model.kernels}")
    print(f"processor: {hardware.processor_summary()}; python {platform.python_version()}, jax {jax.__version__}")
    print(f"{'':<20}{'the lab':>12}{'plain JAX':>12}{'lab / plain':>13}")
    for name, ours, theirs, unit in rows:
        print(f"{name:<20}{ours:>12,.1f}{theirs:>12,.1f}{ours / theirs:>12.2f}x  {unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
