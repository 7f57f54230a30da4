"""Notebook 11, "Fewer bytes per weight": what storing the weights as int8 or int4 does to each
phase, predicted from the bytes, then measured on this machine, and what it costs in quality.

1. **Predict** (:func:`predict`): the roofline of this machine (or a GPU preset) with the weights'
   stored bytes (``ModelConfig.quantization``): a decode step's time is its bytes over the read
   bandwidth, so int8 should cut it by ~4x against float32 at batch 1; prefill's time is its FLOPs
   over the peak, unchanged by the weights' bytes as long as the arithmetic stays in float
   (weight-only quantization); the batch where decode turns compute-bound (the roofline's flip)
   moves down with the bytes per weight.
2. **Measure** (:func:`measure`): the lesson model with float32 weights, int8 weight-only
   (activations stay float32), int8 with int8 activations (both operands int8: XLA:CPU's fast
   path) and int4 (group 128), decode steps at batch 1 and 64 and a prefill, timed side by side,
   with the model's matrices timed alone beside them, one after another as the model runs them
   (what the step's gain should be if only its matmuls change: :func:`follows_its_matmuls`).
3. **Quality** (:func:`quality`): the trained ``shakespeare_large`` on 16 KB of held-out text in
   every format: nats per byte and how often its next-byte choice equals float32's.
4. **The GPU, predicted** (:func:`gpu_table`): ``base`` and ``llama3_8b`` on the H100 and H200
   presets per format: decode tokens/s at batch 1, the flip, and the price of a million output tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.analytic import costs, economics, roofline
from inference_lab.base import hardware, tokenizer
from inference_lab.base.config import ModelConfig
from inference_lab.lessons.claims import Verdict, decide, log_midpoint, noise
from inference_lab.measure import timing
from inference_lab.measure.matmuls import ModelMatmulsPoint
from inference_lab.model import pretrained, quantize
from inference_lab.model.transformer import Transformer

QUALITY_PRESET = "shakespeare_large"
CONTEXT = 128          # cached tokens per row in the timed decode steps
PROMPT_LEN = 256       # the timed prefill
STEPS = 8              # decode steps per timed loop
BATCHES = (1, 64)         # batch 1, and a batch where the int8 matmuls outweigh the rest of the step
WINDOWS = 8            # held-out windows of 256 bytes for the quality table (2 KB)
GPU_PRESETS = ("base", "llama3_8b")
GPUS = ("H100_SXM", "H200")

# name -> (quantization, group size, activations); the timed formats
FORMATS = {
    "float32": ("none", None, "auto"),
    "int8, weight-only": ("int8", None, "float"),
    "int8 x int8": ("int8", None, "int8"),
    "int4 g128": ("int4", 128, "auto"),
}
# what each format is timed at: (decode batches, prefill?); int4's prefill and the weight-only
# format's larger batch are left out to keep the notebook's run short (docs/benchmarks.md has them)
TIMED = {"float32": (BATCHES, True), "int8, weight-only": ((1,), True), "int8 x int8": (BATCHES, True),
         "int4 g128": ((1,), False)}
PREDICTED = {"float32": ("none", None), "int8": ("int8", None), "int4 g32": ("int4", 32), "int4 g128": ("int4", 128)}


def formats(model) -> dict:
    """The timed formats of ``model``: name -> Transformer (the float one, or quantized)."""
    return {name: model if scheme == "none" else model.quantized(scheme, g, activations=act)
            for name, (scheme, g, act) in FORMATS.items()}


# ----------------------------------------------------------------------------- 1. predict
def predict(cfg, spec, *, batch: int = 1, context: int = CONTEXT, prompt_len: int = PROMPT_LEN) -> list[dict]:
    """The roofline's view of each stored format (:data:`PREDICTED`) of ``cfg`` on ``spec``, the
    arithmetic in ``cfg.dtype`` (weight-only: the weights are widened to it before they multiply)."""
    rows = []
    for name, (scheme, g) in PREDICTED.items():
        q = cfg.replace(quantization=scheme, group_size=g)
        step = roofline.predicted_decode_step_seconds(q, spec, batch, context)
        rows.append({"format": format_name(name, cfg), "cfg": q, "weight_bytes": costs.weight_bytes(q),
                     "bytes_per_weight": q.bytes_per_weight, "decode_step_s": step,
                     "decode_tokens_per_s": batch / step,
                     "prefill_s": roofline.predicted_prefill_seconds(q, spec, 1, prompt_len),
                     "flip": roofline.predicted_flip(q, spec, include_kv=False)})
    return rows


def format_name(name: str, cfg) -> str:
    """A format's name for ``cfg``: the unquantized one is called by the model's dtype."""
    return cfg.dtype if name == "float32" else name


def prediction_table(rows: list[dict]) -> str:
    f32 = rows[0]
    lines = [f"{'weights':<10}{'bytes/weight':>13}{'weights MB':>11}{'decode B1 ms':>14}{'x f32':>7}"
             f"{'prefill ms':>12}{'flip (weights)':>16}"]
    for r in rows:
        flip = "never" if r["flip"] is None else str(r["flip"])
        lines.append(f"{r['format']:<10}{r['bytes_per_weight']:>13.3f}{r['weight_bytes'] / 1e6:>11.1f}"
                     f"{r['decode_step_s'] * 1e3:>14.2f}{f32['decode_step_s'] / r['decode_step_s']:>7.2f}"
                     f"{r['prefill_s'] * 1e3:>12.1f}{flip:>16}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- 2. measure
@dataclasses.dataclass
class Measured:
    """The side-by-side run: ``decode[name][batch]`` and ``prefill[name]`` records of the model,
    ``matmuls[name][rows]`` the model's matrices alone (float32 and int8 x int8)."""

    decode: dict
    prefill: dict
    matmuls: dict
    weight_bytes: dict

    def step(self, name: str, batch: int) -> float:
        return self.decode[name][batch].step_seconds


def measure(model, *, repeats: int | None = 7) -> Measured:
    """Time every format of ``model`` (:data:`TIMED`) and the matrices alone, in one round-robin run."""
    models = formats(model)
    points, where = [], []
    for name, (batches, with_prefill) in TIMED.items():
        m = models[name]
        for b in batches:
            points.append(timing.DecodePoint(m, b, CONTEXT, STEPS))
            where.append(("decode", name, b))
        if with_prefill:
            points.append(timing.PrefillPoint(m, 1, PROMPT_LEN))
            where.append(("prefill", name, None))
    for name in ("float32", "int8 x int8"):
        for rows in (max(BATCHES), PROMPT_LEN):   # one after another, as the model runs them
            points.append(ModelMatmulsPoint(models[name], rows, chained=True))
            where.append(("matmuls", name, rows))
    records = timing.measure_points(points, repeats=repeats, ceilings=None, desc="formats")
    out = Measured({}, {}, {}, {name: m.nbytes for name, m in models.items()})
    for (kind, name, key), rec in zip(where, records):
        if kind == "prefill":
            out.prefill[name] = rec
        else:
            getattr(out, kind).setdefault(name, {})[key] = rec
    return out


def measured_table(measured: Measured) -> str:
    f32 = "float32"
    lines = [f"{'weights':<19}{'MB':>7}" + "".join(f"{f'decode B{b} ms':>15}{'x f32':>7}" for b in BATCHES)
             + f"{'prefill ms':>12}{'x f32':>7}"]
    for name in FORMATS:
        cells = f"{name:<19}{measured.weight_bytes[name] / 1e6:>7.1f}"
        for b in BATCHES:
            rec = measured.decode[name].get(b)
            cells += (f"{rec.step_seconds * 1e3:>15.2f}{measured.step(f32, b) / rec.step_seconds:>7.2f}" if rec
                      else f"{'-':>15}{'':>7}")
        rec = measured.prefill.get(name)
        cells += (f"{rec.seconds * 1e3:>12.1f}{measured.prefill[f32].seconds / rec.seconds:>7.2f}" if rec
                  else f"{'-':>12}{'':>7}")
        lines.append(cells)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- verdicts
def widening_costs_more(f32_step, widened_step, *, bytes_moved: float = 9.0, bytes_f32: float = 4.0) -> Verdict:
    """Weight-only int8 through a dot that widens the weight in memory first (XLA:CPU's) reads 1
    byte, writes 4 and reads them again per weight: ~9 bytes moved against float32's 4, so the
    step should take about 9/4 as long, where the bytes alone would promise 1/4. Holds when the
    float32 step is at most the log midpoint of that prediction and no change (x1) times as fast
    as the widened one's, allowing for noise; records are read by ``step_seconds``."""
    predicted = bytes_f32 / bytes_moved
    ratio = f32_step.step_seconds / widened_step.step_seconds
    need = log_midpoint(predicted)
    u = noise(f32_step, widened_step)
    return Verdict("a weight widened in memory before its dot costs more bytes than it saved",
                   decide(ratio, need, u, at_least=False),
                   f"decode batch {f32_step.batch}: float32 {f32_step.step_seconds * 1e3:.2f} ms, int8 weight-only "
                   f"{widened_step.step_seconds * 1e3:.2f} ms: x{ratio:.2f} the speed (predicted x{predicted:.2f} "
                   f"from ~{bytes_moved:g} bytes moved per weight against {bytes_f32:g}, needed at most x{need:.2f}"
                   + (f"; noise x{u:.2f}" if u > 1.005 else "") + ")")


def follows_its_matmuls(what: str, f32_time, q_time, f32_matmuls, q_matmuls) -> Verdict:
    """The quantized step (or prefill) is faster than the float32 one by at least the log midpoint
    of 1 and what its matmuls predict: the float32 time with its matmuls' time replaced by the
    quantized matmuls' (both timed alone, beside it, at the same rows). Records are read by
    ``step_seconds`` (decode) or ``seconds``."""
    def t(r):
        return getattr(r, "step_seconds", None) or r.seconds
    rest = t(f32_time) - f32_matmuls.seconds
    predicted = t(f32_time) / max(rest + q_matmuls.seconds, 1e-12)
    ratio = t(f32_time) / t(q_time)
    need = log_midpoint(predicted)
    u = noise(f32_time, q_time, f32_matmuls, q_matmuls)
    holds = decide(ratio, need, u) if predicted > 1.05 else None   # no gain predicted: nothing to check
    return Verdict(f"{what} gets faster with int8 x int8, as its matmuls timed alone predict",
                   holds,
                   f"{what}: float32 {t(f32_time) * 1e3:.2f} ms, int8 x int8 {t(q_time) * 1e3:.2f} ms: x{ratio:.2f} "
                   f"(predicted x{predicted:.2f}: the matrices alone took {f32_matmuls.seconds * 1e3:.2f} ms in float32 "
                   f"and {q_matmuls.seconds * 1e3:.2f} ms in int8; needed x{need:.2f}"
                   + (f"; noise x{u:.2f}" if u > 1.005 else "") + ")")


# ----------------------------------------------------------------------------- 3. quality
def heldout_windows(n: int = WINDOWS, length: int = 256) -> np.ndarray:
    """``n`` windows of held-out bytes as token rows ``[n, length + 1]``: BOS, then ``length`` bytes."""
    text = pretrained.heldout_text()
    step = (len(text) - length) // max(n - 1, 1)
    rows = [[tokenizer.BOS] + list(text[i * step: i * step + length]) for i in range(n)]
    return np.asarray(rows, np.int32)


def _scores(model, rows: np.ndarray):
    """(nats per byte, argmax [n, length]) of ``model`` predicting each window's bytes."""
    logits = model(rows[:, :-1])                                     # [n, length, V] float32
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, jnp.asarray(rows[:, 1:, None]), axis=-1)
    return float(-jnp.mean(picked)), np.asarray(jnp.argmax(logits, axis=-1))


QUALITY_FORMATS = {   # name -> (quantization, group size, activations)
    "float32": ("none", None, "auto"), "int8, weight-only": ("int8", None, "float"),
    "int8 x int8": ("int8", None, "int8"), "int4 g32": ("int4", 32, "float"),
    "int4 g64": ("int4", 64, "float"), "int4 g128": ("int4", 128, "float"),
}


def quality(trained, rows: np.ndarray | None = None) -> list[dict]:
    """Held-out nats per byte and next-byte agreement with float32 of every format of ``trained``.

    Weight-only formats are evaluated as the float model of their dequantized weights: the same
    numbers (``tests/test_quantization.py`` checks the tokens are identical) without XLA:CPU's slow
    widening dot. ``int8 x int8`` runs its own path (its activations are rounded too)."""
    rows = heldout_windows() if rows is None else rows
    base_loss, base_top = _scores(trained, rows)
    out = []
    for name, (scheme, g, act) in QUALITY_FORMATS.items():
        if scheme == "none":
            loss, top = base_loss, base_top
        else:
            q = trained.quantized(scheme, g, activations=act)
            m = q if act == "int8" else Transformer(trained.cfg, kernels=trained.kernels,
                                                     params=quantize.dequantize(q.params()))
            loss, top = _scores(m, rows)
        bpw = trained.cfg.replace(quantization=scheme, group_size=g).bytes_per_weight
        out.append({"format": name, "bytes_per_weight": bpw, "nats_per_byte": loss,
                    "loss_increase": loss / base_loss - 1, "agreement": float(np.mean(top == base_top))})
    return out


def quality_table(rows: list[dict]) -> str:
    lines = [f"{'weights':<19}{'bytes/weight':>13}{'nats/byte':>11}{'vs f32':>9}{'same next byte':>16}"]
    for r in rows:
        lines.append(f"{r['format']:<19}{r['bytes_per_weight']:>13.3f}{r['nats_per_byte']:>11.4f}"
                     f"{r['loss_increase']:>+9.2%}{r['agreement']:>16.1%}")
    return "\n".join(lines)


def quality_bounded(rows: list[dict], *, int8_limit: float = 0.01, int4_limit: float = 0.05) -> Verdict:
    """int8's held-out loss within ``int8_limit`` of float32's (both int8 paths), int4 with groups
    of 32 within ``int4_limit``. No timing, no noise: it always decides."""
    by = {r["format"]: r for r in rows}
    int8 = max(by["int8, weight-only"]["loss_increase"], by["int8 x int8"]["loss_increase"])
    int4 = by["int4 g32"]["loss_increase"]
    return Verdict("rounding the weights to int8 costs under 1% of the held-out loss, int4 in groups of 32 under 5%",
                   int8 <= int8_limit and int4 <= int4_limit,
                   f"held-out nats/byte: float32 {by['float32']['nats_per_byte']:.4f}; int8 {int8:+.2%} (limit "
                   f"{int8_limit:.0%}), int4 g32 {int4:+.2%} (limit {int4_limit:.0%}); int4 g128 "
                   f"{by['int4 g128']['loss_increase']:+.2%}")


# ----------------------------------------------------------------------------- 4. the GPU, predicted
def gpu_table(context: int = 1024, batches=(1, 64)) -> list[dict]:
    """Per GPU preset and model: each format's decode tokens/s at ``batches`` (the roofline, KV
    cache included at ``context`` tokens), the flip of the weights alone (the batch where a step's
    matmuls turn compute-bound: ``roofline.predicted_flip(include_kv=False)``) and the price of a
    million output tokens (``economics.predicted_token_prices``, the preset's example price)."""
    out = []
    for preset in GPU_PRESETS:
        cfg = ModelConfig.preset(preset)
        for gpu in GPUS:
            spec = hardware.PRESETS[gpu]
            for name, (scheme, g) in PREDICTED.items():
                q = cfg.replace(quantization=scheme, group_size=g)
                row = {"model": preset, "gpu": gpu, "format": format_name(name, cfg),
                       "weight_gb": costs.weight_bytes(q) / 1e9, "flip": roofline.predicted_flip(q, spec, include_kv=False)}
                for b in batches:
                    p = economics.predicted_token_prices(q, spec, batch=b, context=context)
                    row[f"tokens_per_s_b{b}"] = p["decode_tokens_per_s"]
                    row[f"output_price_b{b}"] = p["output_per_million"]
                out.append(row)
    return out


def gpu_text(rows: list[dict], batches=(1, 64)) -> str:
    lines = [f"{'model':<10}{'gpu':<9}{'weights':<10}{'GB':>6}" + "".join(f"{f'tok/s B{b}':>11}" for b in batches)
             + f"{'flip':>7}" + "".join(f"{f'$/M out B{b}':>12}" for b in batches)]
    for r in rows:
        lines.append(f"{r['model']:<10}{r['gpu']:<9}{r['format']:<10}{r['weight_gb']:>6.2f}"
                     + "".join(f"{r[f'tokens_per_s_b{b}']:>11,.0f}" for b in batches)
                     + f"{r['flip'] if r['flip'] else 'never':>7}"
                     + "".join(f"{r[f'output_price_b{b}']:>12.3f}" for b in batches))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- 5. the KV cache in int8
KV_BATCH = 8                       # the timed batch here: enough rows for the cache to be a large share
KV_CONTEXTS = (256, 1536)          # two contexts: the time per cached token is their difference
GPU_KV_CONTEXTS = (1024, 4096, 16384, 32768)
GPU_KV_BATCHES = (1, 16, 64)
GPU_KV_PRESET = "llama3_8b"


def int8_cache(cfg):
    return cfg.replace(kv_cache_dtype="int8")


def cache_bytes_per_token(cfg) -> dict:
    """Bytes one cached token takes in each cache, read from real caches (``KVCache.nbytes`` of one
    row of 256 positions, values and scales): ``{"float": ..., "int8": ...}``."""
    from inference_lab.model.kv_cache import KVCache

    return {name: KVCache.create(c, 1, 256).nbytes / 256 for name, c in (("float", cfg), ("int8", int8_cache(cfg)))}


def kv_cache_gpu_rows(preset: str = GPU_KV_PRESET, contexts=GPU_KV_CONTEXTS, batches=GPU_KV_BATCHES) -> list[dict]:
    """The roofline of a bf16 model on each GPU preset with its KV cache in bf16 and in int8: per
    context, how many sequences fit in each (:func:`roofline.max_batch`) and, at each batch that
    fits in both, the decode step's speed-up from the int8 cache and the cache's share of the
    step's bytes."""
    cfg = ModelConfig.preset(preset)
    rows = []
    for gpu in GPUS:
        spec = hardware.PRESETS[gpu]
        for context in contexts:
            fits = {"bf16": roofline.max_batch(cfg, spec, context), "int8": roofline.max_batch(int8_cache(cfg), spec, context)}
            row = {"gpu": gpu, "context": context, "fits": fits, "speedup": {}, "kv_share": {}}
            for b in batches:
                if b <= fits["bf16"]:
                    cost = costs.decode_cost(cfg, b, context)
                    row["speedup"][b] = (roofline.predicted_decode_step_seconds(cfg, spec, b, context)
                                         / roofline.predicted_decode_step_seconds(int8_cache(cfg), spec, b, context))
                    row["kv_share"][b] = cost.parts["kv_read"] / cost.bytes
            rows.append(row)
    return rows


def kv_cache_gpu_text(rows: list[dict], preset: str = GPU_KV_PRESET, batches=GPU_KV_BATCHES) -> str:
    cfg = ModelConfig.preset(preset)
    tokens = costs.weight_bytes(cfg) / costs.kv_bytes_per_token(cfg)
    lines = [f"{preset} (bf16 weights), the roofline: decode step speed-up from an int8 KV cache (the cache's share "
             "of the step's bytes in bf16), and how many sequences fit in 90% of the GPU's memory",
             f"{'gpu':<10}{'context':>8}" + "".join(f"{f'batch {b}':>16}" for b in batches) + f"{'fit bf16':>10}{'fit int8':>10}"]
    for r in rows:
        said = {b: f"x{r['speedup'][b]:.2f} ({r['kv_share'][b]:.0%})" for b in r["speedup"]}
        cells = "".join(f"{said.get(b, 'does not fit'):>16}" for b in batches)
        lines.append(f"{r['gpu']:<10}{r['context']:>8,}{cells}{r['fits']['bf16']:>10}{r['fits']['int8']:>10}")
    r = int8_cache(cfg).kv_bytes_per_element / cfg.kv_bytes_per_element
    lines.append(f"the cache's bytes equal the weights' at batch x context = {tokens:,.0f} tokens (e.g. batch "
                 f"{tokens / 4096:.0f} at 4,096): there the int8 cache makes the step x{2 / (1 + r):.2f} faster; at a "
                 f"tenth of that, x{1.1 / (1 + 0.1 * r):.2f}")
    return "\n".join(lines)


def measure_kv_cache(model, *, repeats: int | None = 7) -> dict:
    """Decode steps of ``model`` (its own weights) with a float cache and an int8 cache at
    :data:`KV_BATCH` and each of :data:`KV_CONTEXTS`, side by side: ``{(cache, context): record}``."""
    models = {"float": model, "int8": model.with_kv_cache_dtype("int8")}
    where = [(name, c) for name in models for c in KV_CONTEXTS]
    points = [timing.DecodePoint(models[name], KV_BATCH, c, STEPS) for name, c in where]
    records = timing.measure_points(points, repeats=repeats, ceilings=None, desc="KV caches")
    return dict(zip(where, records))


def per_cached_token(records: dict, name: str) -> float:
    """Seconds a decode step adds per cached token of one row, from the two contexts' steps."""
    lo, hi = KV_CONTEXTS
    return ((records[(name, hi)].step_seconds - records[(name, lo)].step_seconds)
            / ((hi - lo) * records[(name, hi)].batch))


def kv_cache_table(records: dict, cfg, spec) -> str:
    lo, hi = KV_CONTEXTS
    per_token = cache_bytes_per_token(cfg)
    lines = [f"decode batch {KV_BATCH}, {cfg.name}, {cfg.dtype} weights: the float cache against the int8 cache",
             f"{'cache':<8}{'bytes/token':>12}" + "".join(f"{f'step ms @{c}':>15}" for c in KV_CONTEXTS)
             + f"{'us per cached token':>21}{'roofline us':>13}"]
    for name in ("float", "int8"):
        c = cfg if name == "float" else int8_cache(cfg)
        roof = ((roofline.predicted_decode_step_seconds(c, spec, KV_BATCH, hi)
                 - roofline.predicted_decode_step_seconds(c, spec, KV_BATCH, lo)) / ((hi - lo) * KV_BATCH))
        lines.append(f"{name:<8}{per_token[name]:>12,.0f}"
                     + "".join(f"{records[(name, ctx)].step_seconds * 1e3:>15.2f}" for ctx in KV_CONTEXTS)
                     + f"{per_cached_token(records, name) * 1e6:>21.3f}{roof * 1e6:>13.3f}")
    return "\n".join(lines)


def cache_time_follows_its_bytes(records: dict, cfg) -> Verdict:
    """Whether the int8 cache cuts the time a cached token costs a step as much as it cuts the
    token's bytes. On a machine whose decode attention streams the cache at the read rate (a GPU
    kernel built for it) it should: int8 over float ~ their bytes' ratio. The claim checked here
    is this CPU's: its attention is bound by XLA's arithmetic over the cache, not by the cache's
    bytes (notebook 03), so the int8 cache's time per cached token stays above the log midpoint
    of that ratio and 1. Fails on a machine where the cache's bytes set the time."""
    per_token = cache_bytes_per_token(cfg)
    by_bytes = per_token["int8"] / per_token["float"]
    f, q = per_cached_token(records, "float"), per_cached_token(records, "int8")
    if f <= 0:
        return Verdict("the int8 cache does not cut a cached token's time by its bytes here (attention is not bound by "
                       "the cache's bytes)", None, "the float cache's longer context was not slower: nothing to compare")
    ratio = q / f
    need = log_midpoint(by_bytes)
    lo, hi = KV_CONTEXTS
    u = noise(*(records[(n, c)] for n in ("float", "int8") for c in (lo, hi)))
    return Verdict("the int8 cache does not cut a cached token's time by its bytes here (attention is not bound by "
                   "the cache's bytes)", decide(ratio, need, u),
                   f"per cached token: float {f * 1e6:.3f} us, int8 {q * 1e6:.3f} us: x{ratio:.2f} the time for "
                   f"x{by_bytes:.2f} the bytes (a bytes-bound cache would take about x{by_bytes:.2f}; needed at least "
                   f"x{need:.2f}" + (f"; noise x{u:.2f}" if u > 1.005 else "") + ")")


# ----------------------------------------------------------------------------- the figure and the dashboard
CURVE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # the figure's lines and the dashboard's batch slider


def curve_rows(cfg, spec, context: int = CONTEXT, batches=CURVE_BATCHES) -> list[dict]:
    """The roofline's decode tokens/s over the batch for each predicted format (the figure's lines)."""
    rows = []
    for name, (scheme, g) in PREDICTED.items():
        q = cfg.replace(quantization=scheme, group_size=g)
        rows += [{"format": format_name(name, cfg), "batch": b, "decode_tokens_per_s": roofline.predicted_decode_tokens_per_s(
                      q, spec, b, context)} for b in batches]
    return rows


def measured_rows(measured: Measured) -> list[dict]:
    """The run as the figure's filled points: decode tokens/s by format and batch."""
    return [{"format": name, "batch": b, "decode_tokens_per_s": rec.decode_tokens_per_s}
            for name, recs in measured.decode.items() for b, rec in recs.items()]


def view(cfg, spec, measured: Measured | None = None):
    """The dashboard: ``view(batch, context)`` -> (figure, readout): the roofline's decode tokens/s
    of each format over the batch at that context, this run's points where the context is the
    timed one, and the readout at the chosen batch."""
    from inference_lab.plots.quantization import quantization_plot

    def show(batch: int, context: int):
        rows = curve_rows(cfg, spec, context)
        points = measured_rows(measured) if measured is not None and context == CONTEXT else []
        fig = quantization_plot(rows, points, mark_batch=batch,
                                title=f"Decode on this machine's roofline, {context} cached tokens")
        at = {r["format"]: r["decode_tokens_per_s"] for r in rows if r["batch"] == batch}
        base = at[cfg.dtype]
        bound = [p["format"] for p in predict(cfg, spec, batch=batch, context=context)
                 if roofline.bound(costs.decode_cost(p["cfg"], batch, context), spec,
                                   roofline.flop_dtype(p["cfg"])) == "compute"]
        text = (f"batch {batch}, context {context}: predicted decode tok/s "
                + ", ".join(f"{k} {v:,.0f} (x{v / base:.2f})" for k, v in at.items())
                + (f"; compute-bound here: {', '.join(bound)}" if bound else "; every format still bandwidth-bound"))
        return fig, text

    return show
