"""Quantized weights: the formats, the quantized matmul kernel, the model's quantized path and
its files.

The kernel runs under the Pallas interpreter (and compiled where a GPU is present) with its
outputs poisoned, and is compared with float64 numpy computed from the dequantized weight (and,
for int8 activations, the dequantized activations) on awkward shapes, and with the XLA
reference. The model's quantized greedy tokens must equal those of a float model holding the
dequantized weights exactly, on both tiers, whenever the activations stay float.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import quantization, testing
from pallas_kernels.mode import pallas_supported
from inference_lab.base.config import ModelConfig
from inference_lab.model import pretrained, quantize, weights
from inference_lab.model.transformer import Transformer
from inference_lab.runtime import generation

GPU = pytest.mark.skipif(not pallas_supported(), reason="needs an NVIDIA GPU (compute capability >= 8.0)")
MODES = ["reference", "interpret", pytest.param("pallas", marks=[pytest.mark.gpu, GPU])]


@pytest.fixture(autouse=True)
def poison():
    with testing.poisoned_outputs():
        yield


def _weight(rng, k, n, group_size):
    w = rng.standard_normal((k, n)).astype(np.float32) * rng.uniform(0.1, 3.0, size=(1, n)).astype(np.float32)
    return quantization.quantize_int4(w, group_size) if group_size else quantization.quantize_int8(w)


def _truth(x, q, scales, group_size, activations):
    """float64 numpy of what the kernel computes: x (or its int8 rounding) @ the dequantized weight."""
    w = testing.f64(quantization.dequantize(q, scales, group_size))
    if activations == "int8":
        xq, xs = quantization.quantize_rows(x)
        return (testing.f64(xq) * testing.f64(xs)) @ w
    return testing.f64(x) @ w


# ----------------------------------------------------------------------------- formats
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_packing_round_trips_and_rounds_to_the_nearest_step(group_size):
    rng = np.random.default_rng(group_size)
    w = rng.standard_normal((256, 7)).astype(np.float32)
    q, scales = quantization.quantize_int4(w, group_size)
    assert q.dtype == jnp.uint8 and q.shape == (128, 7) and scales.shape == (256 // group_size, 7)
    values = np.asarray(quantization.unpack_int4(q, group_size), np.int32)
    assert values.min() >= -7 and values.max() <= 7
    step = np.repeat(np.asarray(scales), group_size, axis=0)
    assert np.all(np.abs(values * step - w) <= step / 2 + 1e-6)   # nearest grid point, every weight
    # packing is the inverse of unpacking: low nibbles the group's first half, high its second
    packed = np.asarray(q).reshape(256 // group_size, group_size // 2, 7)
    lo = (packed & 15).astype(np.int32) - 8
    assert np.array_equal(lo, values.reshape(256 // group_size, group_size, 7)[:, : group_size // 2])


def test_int8_rounds_to_the_nearest_step_and_keeps_zero_columns():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((100, 6)).astype(np.float32)
    w[:, 2] = 0.0
    q, scales = quantization.quantize_int8(w)
    assert float(scales[2]) == 1.0 and not np.asarray(q)[:, 2].any()
    err = np.abs(np.asarray(quantization.dequantize(q, scales)) - w)
    assert np.all(err <= np.asarray(scales)[None] / 2 + 1e-6)


# ----------------------------------------------------------------------------- the kernel
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("activations", ["float", "int8"])
@pytest.mark.parametrize("m,k,n,group_size,dtype", [
    (1, 96, 40, None, jnp.float32), (5, 130, 17, None, jnp.bfloat16), (3, 128, 70, 32, jnp.float32),
    (17, 256, 33, 64, jnp.float32), (70, 384, 130, 128, jnp.float32), (1, 192, 96, 32, jnp.bfloat16)])
def test_quantized_matmul_matches_float64(mode, activations, m, k, n, group_size, dtype):
    rng = np.random.default_rng(m * 1000 + k + n)
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    q, scales = _weight(rng, k, n, group_size)
    y = pk.quantized_matmul(x, q, scales, group_size=group_size, activations=activations, mode=mode)
    assert y.shape == (m, n) and y.dtype == dtype
    tol = 2e-6 if dtype == jnp.float32 else 1e-2
    assert testing.rel_err(y, _truth(x, q, scales, group_size, activations)) < tol
    ref = pk.quantized_matmul(x, q, scales, group_size=group_size, activations=activations, mode="reference")
    assert testing.rel_err(y, testing.f64(ref)) < tol


def test_auto_activations_are_int8_on_the_xla_path_and_float_in_the_kernel():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)
    q, scales = _weight(rng, 64, 16, None)
    for mode, activations in (("reference", "int8"), ("interpret", "float")):
        got = pk.quantized_matmul(x, q, scales, mode=mode)
        want = _truth(x, q, scales, None, activations)
        other = _truth(x, q, scales, None, "float" if activations == "int8" else "int8")
        assert testing.rel_err(got, want) < 1e-6 < testing.rel_err(got, other)


def test_split_k_partials_add_up():
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((1, 512)), jnp.float32)
    q, scales = _weight(rng, 512, 24, 64)
    config = pk.MatmulConfig(block_m=16, block_n=16, block_k=64, split_k=3)
    plan = pk.quantized_matmul_plan(1, 512, 24, jnp.float32, group_size=64, config=config)
    assert plan.grid == (1, 2, 3)
    y = pk.quantized_matmul(x, q, scales, group_size=64, mode="interpret", config=config)
    assert testing.rel_err(y, _truth(x, q, scales, 64, "float")) < 2e-6


def test_plan_fills_the_gpu_at_decode_shapes():
    p = pk.quantized_matmul_plan(1, 4096, 4096, jnp.bfloat16, group_size=32, num_sms=132)
    assert p.config.block_k == 32 and p.grid[0] * p.grid[1] * p.grid[2] >= 2 * 132


@pytest.mark.parametrize("call,message", [
    (lambda x, q, s: pk.quantized_matmul(x, q, s, group_size=48), "group_size=48 is not an int4 group size"),
    (lambda x, q, s: pk.quantized_matmul(x[:, :96], q[:48], s[:3], group_size=64), "does not divide the weight's 96"),
    (lambda x, q, s: pk.quantized_matmul(x, q, s), "group_size=None but q is packed int4"),
    (lambda x, q, s: pk.quantized_matmul(x, q.astype(jnp.int16), s, group_size=32), "q has dtype int16"),
    (lambda x, q, s: pk.quantized_matmul(x, q, s[:2], group_size=32), "pass the scales quantization made"),
    (lambda x, q, s: pk.quantized_matmul(x, q[:10], s, group_size=32), "q has 10 rows but x has K=128"),
    (lambda x, q, s: pk.quantized_matmul(x, q, s, group_size=32, activations="fp8"), "activations='fp8'"),
    (lambda x, q, s: pk.quantized_matmul(x, q, s, group_size=32, mode="mosaic_interpret"), "no Mosaic GPU tier"),
    (lambda x, q, s: pk.quantized_matmul(x.astype(jnp.int32), q, s, group_size=32), "x has dtype int32"),
])
def test_bad_input_is_a_one_line_error(call, message):
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((2, 128)), jnp.float32)
    q, s = _weight(rng, 128, 8, 32)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")) as err:
        call(x, q, s)
    assert "\n" not in str(err.value)


def test_int8_weight_refuses_a_group_size():
    q, s = quantization.quantize_int8(np.ones((32, 4), np.float32))
    with pytest.raises(ValueError, match="group_size=32 is for int4 weights"):
        pk.quantized_matmul(jnp.ones((1, 32)), q, s, group_size=32)


# ----------------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def trained():
    return pretrained.load("reference", preset="shakespeare")


PROMPT = ["ROMEO:\nBut soft, what light"]


@pytest.mark.parametrize("scheme,group_size", [("int8", None), ("int4", 32), ("int4", 64)])
def test_quantized_greedy_tokens_equal_the_dequantized_float_model(trained, scheme, group_size):
    """Weight-only quantization computes exactly the float model of its dequantized weights."""
    qm = trained.quantized(scheme, group_size, activations="float")
    twin = Transformer(trained.cfg, kernels="reference", params=quantize.dequantize(qm.params()))
    assert qm.cfg.quantization == scheme and twin.cfg.quantization == "none"
    assert generation.generate(qm, PROMPT, 48) == generation.generate(twin, PROMPT, 48)


def test_kernel_path_gives_the_reference_path_tokens():
    """The Pallas kernel (interpreted) and the XLA path, on the same int4 weights: the same greedy
    tokens (a small random model: the interpreter is slow)."""
    qm = Transformer(ModelConfig.preset("tiny"), kernels="reference").quantized("int4", 32, activations="float")
    on_kernel = Transformer(qm.cfg, kernels="interpret", params=qm.params())
    assert generation.generate(on_kernel, [[1, 5, 9, 2]], 3) == generation.generate(qm, [[1, 5, 9, 2]], 3)


def test_int8_activations_change_the_numbers_a_little(trained):
    """The CPU path quantizes activations too: logits move, but little next to their spread."""
    tokens = np.asarray([list(range(1, 60))])
    f = np.asarray(trained(tokens))
    w8 = np.asarray(trained.quantized("int8", activations="float")(tokens))
    w8a8 = np.asarray(trained.quantized("int8", activations="int8")(tokens))
    assert 0 < np.abs(w8a8 - w8).max() and np.abs(w8a8 - f).std() < 0.1 * f.std()


def test_quantized_model_is_smaller_by_the_bytes_per_weight(trained):
    layers = trained.cfg.n_layers * (trained.cfg.layer_params - 2 * trained.cfg.d_model) + trained.cfg.head_params
    for scheme, g, per_weight in (("int8", None, 1.0), ("int4", 32, 0.5 + 4 / 32)):
        qm = trained.quantized(scheme, g)
        saved = trained.nbytes - qm.nbytes
        assert abs(saved - layers * (4 - per_weight)) < 0.02 * saved


def test_int4_names_the_layer_it_cannot_pack(trained):
    with pytest.raises(ValueError, match=r"group_size=128 does not divide d_model \(the rows of w_qkv, w_gate_up and the head\) = 192"):
        trained.quantized("int4", 128)


@pytest.mark.parametrize("kwargs,message", [
    (dict(scheme="int3"), "quantization='int3' must be one of none, int8, int4"),
    (dict(scheme="int8", group_size=32), "group_size=32 applies to int4 only"),
    (dict(scheme="int4", group_size=16), "group_size=16 is not an int4 group size"),
])
def test_bad_scheme_is_a_one_line_error(trained, kwargs, message):
    with pytest.raises(ValueError, match=message):
        trained.quantized(**kwargs)


def test_already_quantized_params_are_refused(trained):
    with pytest.raises(ValueError, match="already quantized"):
        quantize.quantize(trained.quantized("int8").params(), "int4", 32)


# ----------------------------------------------------------------------------- files
@pytest.mark.parametrize("scheme,group_size", [("int8", None), ("int4", 64)])
def test_quantized_file_round_trips(trained, tmp_path, scheme, group_size):
    qm = trained.quantized(scheme, group_size)
    path = tmp_path / "q.safetensors"
    qm.save(path)
    back = Transformer.load(path, kernels="reference")
    assert (back.cfg.quantization, back.cfg.group_size) == (scheme, group_size)
    assert generation.generate(back, PROMPT, 16) == generation.generate(qm, PROMPT, 16)
    assert path.stat().st_size < 0.35 * trained.nbytes


def _rewrite(path, dst, edit_tensors=None, edit_meta=None):
    from safetensors.numpy import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
    tensors = load_file(str(path))
    if edit_tensors:
        edit_tensors(tensors)
    if edit_meta:
        edit_meta(meta)
    save_file(tensors, str(dst), metadata=meta)
    return dst


def test_damaged_quantized_files_are_refused(trained, tmp_path):
    src = tmp_path / "q.safetensors"
    trained.quantized("int4", 32).save(src)
    cases = {
        "holds zero or negative values": dict(edit_tensors=lambda t: t["layers.1.w_o.scales"].__setitem__((0, 0), -1.0)),
        "'head.scales' holds NaN or infinite values": dict(edit_tensors=lambda t: t["head.scales"].__setitem__((0, 3), np.nan)),
        "'layers.0.w_down.q' is missing": dict(edit_tensors=lambda t: t.pop("layers.0.w_down.q")),
        "not a valid ModelConfig .*group_size=48": dict(edit_meta=lambda m: m.__setitem__(
            "config", m["config"].replace('"group_size": 32', '"group_size": 48'))),
        "the file was quantized for another model or scheme": dict(edit_meta=lambda m: m.__setitem__(
            "config", m["config"].replace('"quantization": "int4", "group_size": 32',
                                          '"quantization": "int8", "group_size": null'))),
    }
    for i, (message, edit) in enumerate(cases.items()):
        with pytest.raises(ValueError, match=message):
            Transformer.load(_rewrite(src, tmp_path / f"bad{i}.safetensors", **edit))


def test_a_quantized_file_for_another_preset_is_refused(trained, tmp_path):
    """A file whose config claims another model than its tensors hold (the tensors of
    ``shakespeare`` under ``shakespeare_large``'s config) fails on the first stored shape."""
    src = tmp_path / "q.safetensors"
    trained.quantized("int8").save(src)
    large = ModelConfig.preset("shakespeare_large", quantization="int8")
    import dataclasses

    with pytest.raises(ValueError, match=r"'(head|layers\.0\.w_qkv)\.q' is int8 .* the file was quantized for another model"):
        Transformer.load(_rewrite(src, tmp_path / "other.safetensors", edit_meta=lambda m: m.__setitem__(
            "config", json.dumps(dataclasses.asdict(large)))))


def test_check_params_refuses_a_quantized_weight_whose_parts_do_not_fit(trained):
    params = trained.quantized("int8").params()
    w = params["layers"][0]["w_o"]
    params["layers"][0]["w_o"] = quantize.QuantizedWeight(w.q[:-1], w.scales, w.shape, w.float_dtype)
    cfg = trained.cfg.replace(quantization="int8")
    with pytest.raises(ValueError, match=r"layers\.0\.w_o\.q is int8 \(191, 192\)"):
        weights.check_params(cfg, params)
    with pytest.raises(ValueError, match=r"'head' is int8 \(group_size=None\) but the config says quantization='none'"):
        weights.check_params(trained.cfg, trained.quantized("int8").params())


def test_config_knows_the_stored_bytes_and_the_kernel_group_sizes():
    from inference_lab.analytic import costs
    from inference_lab.base.config import INT4_GROUP_SIZES

    assert INT4_GROUP_SIZES == quantization.INT4_GROUP_SIZES
    cfg = ModelConfig.preset("small")
    f32 = costs.weight_bytes(cfg)
    assert cfg.bytes_per_weight == 4
    assert 1.0 < cfg.replace(quantization="int8").bytes_per_weight < 1.01
    assert cfg.replace(quantization="int4", group_size=32).bytes_per_weight == pytest.approx(0.5 + 4 / 32)
    assert costs.weight_bytes(cfg.replace(quantization="int8")) == pytest.approx(f32 / 4, rel=0.01)


# ----------------------------------------------------------------------------- command lines
@pytest.mark.parametrize("argv,message", [
    (["--quantize", "int4", "--quantize-group-size", "128", "--preset", "shakespeare"],
     "--quantization int4: --quantize-group-size=128 does not divide d_model"),
    (["--quantization", "int8", "--quantize-group-size", "32"], "applies to --quantization int4 only"),
    (["--quantization", "int4", "--quantize-group-size", "48"], "--quantize-group-size=48 is not an int4 group size"),
    (["--quantization", "int8", "--policy", "disaggregated"], "not supported with --policy disaggregated"),
])
def test_serve_refuses_bad_quantization_flags_before_loading(argv, message, capsys):
    from inference_lab.serving import server

    with pytest.raises(SystemExit) as exit_:
        server.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_serve_loads_a_quantized_model_and_refuses_to_quantize_twice(tmp_path, trained):
    from inference_lab.serving.models import load_model

    model = load_model("shakespeare", quantization="int4", group_size=64)
    assert (model.cfg.quantization, model.cfg.group_size) == ("int4", 64)
    path = tmp_path / "q.safetensors"
    trained.quantized("int8").save(path)
    assert load_model(weights=path).cfg.quantization == "int8"
    with pytest.raises(ValueError, match="already int8; serve it with --quantization none"):
        load_model(weights=path, quantization="int4")


@pytest.mark.parametrize("argv,message", [
    (["--preset", "shakespeare", "--quantize", "int4", "--quantize-group-size", "128"], "does not divide d_model"),
    (["--quantize", "int8", "--tp", "2"], "--quantization or --kv-cache-dtype int8 with --tp"),
    (["--quantize-group-size", "64"], "applies to --quantization int4 only"),
    (["--kv-cache-dtype", "int8", "--tp", "2"], "--quantization or --kv-cache-dtype int8 with --tp"),
])
def test_probe_refuses_bad_quantization_flags(argv, message):
    from inference_lab.measure import probe_args

    with pytest.raises(ValueError, match=message):
        probe_args.check_args(probe_args.build_parser().parse_args(["--kernels", "reference"] + argv))


def test_probe_file_names_and_records_the_format():
    from inference_lab.measure import probe_args, schema

    m = {"id": "abc", "name": None, "processor": "cpu"}
    assert probe_args.filename(m, "small", "reference", "int8").endswith("-small-reference-int8.json")
    assert probe_args.filename(m, "small", "reference", "none", "int8").endswith("-small-reference-kvint8.json")
    assert probe_args.filename(m, "small", "reference") .endswith("-small-reference.json")
    props = schema.PROBE_V2["properties"]["model"]["properties"]
    assert props["quantization"]["enum"] == ["none", "int8", "int4"] and 32 in props["group_size"]["enum"]


def test_casting_a_quantized_file_is_refused(trained, tmp_path):
    src = tmp_path / "q.safetensors"
    trained.quantized("int8").save(src)
    with pytest.raises(ValueError, match="holds int8 weights; cast the float model's file"):
        weights.cast(src, tmp_path / "b.safetensors", "bfloat16")


# ----------------------------------------------------------------------------- the int8 KV cache
def _int8_caches(rng, b, s, hkv, d):
    k, v = (rng.standard_normal((b, s, hkv, d)).astype(np.float32) * rng.uniform(0.2, 3.0, (b, s, hkv, 1))
            for _ in range(2))
    return (*quantization.quantize_kv(k), *quantization.quantize_kv(v))


def _decode_truth(q, kq, ks, vq, vs, lengths):
    """float64 attention over the dequantized caches (the probabilities rounded to q's dtype after
    the value scales weigh them, as the kernel feeds its dot)."""
    k = testing.f64(kq) * testing.f64(ks)[..., None]
    v = testing.f64(vq) * testing.f64(vs)[..., None]
    return testing.decode_attention_f64(q, k, v, lengths)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,s,hq,hkv,d,dtype", [(2, 40, 4, 2, 32, jnp.float32), (3, 130, 8, 2, 64, jnp.float32),
                                                (1, 300, 4, 4, 64, jnp.bfloat16)])
def test_decode_attention_reads_an_int8_cache(mode, b, s, hq, hkv, d, dtype):
    rng = np.random.default_rng(s)
    q = jnp.asarray(rng.standard_normal((b, hq, d)), dtype)
    kq, ks, vq, vs = _int8_caches(rng, b, s, hkv, d)
    lengths = jnp.asarray(rng.integers(1, s + 1, b), jnp.int32)
    out = pk.decode_attention(q, kq, vq, lengths, k_scales=ks, v_scales=vs, mode=mode)
    assert out.shape == (b, hq, d) and out.dtype == dtype
    tol = 2e-3 if dtype == jnp.float32 else 3e-2   # f32: the probabilities' weighting order differs
    assert testing.rel_err(out, _decode_truth(q, kq, ks, vq, vs, lengths)) < tol


@pytest.mark.parametrize("kwargs,message", [
    (dict(k_scales="ks"), "pass k_scales and v_scales together"),
    (dict(k_cache="kf"), "k_scales were given but the caches are float32"),
    (dict(k_scales=None, v_scales=None), "k_cache is int8 but no k_scales were given"),
    (dict(k_scales="bad"), r"k_scales is float32 \(2, 16\)"),
    (dict(k_new="kn"), "k_new with an int8 cache"),
    (dict(mode="mosaic_interpret"), "an int8 KV cache runs on the Triton tier only"),
])
def test_int8_cache_bad_input_is_a_one_line_error(kwargs, message):
    rng = np.random.default_rng(0)
    kq, ks, vq, vs = _int8_caches(rng, 2, 16, 2, 32)
    args = dict(q=jnp.ones((2, 4, 32)), k_cache=kq, v_cache=vq, lengths=jnp.array([3, 5], jnp.int32),
                k_scales=ks, v_scales=vs)
    extra = {"ks": dict(v_scales=None), "kf": dict(k_cache=jnp.ones((2, 16, 2, 32)), v_cache=jnp.ones((2, 16, 2, 32))),
             "bad": dict(k_scales=ks[:, :, 0]), "kn": dict(k_new=jnp.ones((2, 2, 32)), v_new=jnp.ones((2, 2, 32)))}
    for key, value in kwargs.items():
        if isinstance(value, str) and value in extra:
            args.update(extra[value])
        else:
            args[key] = value
    with pytest.raises(ValueError, match=message) as err:
        pk.decode_attention(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("lengths"), **args)
    assert "\n" not in str(err.value)


def test_int8_kv_cache_decodes_as_the_float_cache_of_its_dequantized_values(trained):
    """Prefill attends to the fresh K/V (the same logits as the float model); a decode step reads the
    int8 cache on both tiers alike, and differs from a float cache holding the dequantized contents
    only by this step's own K/V, which the int8 cache stores rounded."""
    from inference_lab.model.kv_cache import KVCache, QuantizedKV

    m8 = trained.with_kv_cache_dtype("int8")
    assert m8.cfg.kv_cache_dtype == "int8"
    tokens, lengths = generation.padded([list(b"ROMEO:\nBut soft, what light")])
    cache = KVCache.create(m8.cfg, 1, 64)
    assert cache.quantized and cache.dtype == jnp.int8
    logits, cache = generation.prefill(m8, tokens, cache, lengths)
    full, _ = generation.prefill(trained, tokens, KVCache.create(trained.cfg, 1, 64), lengths)
    assert testing.rel_err(logits, testing.f64(full)) < 1e-6
    copy = KVCache([QuantizedKV(jnp.array(x.values), jnp.array(x.scales)) for x in cache.k],
                   [QuantizedKV(jnp.array(x.values), jnp.array(x.scales)) for x in cache.v], cache.lengths)
    deq = KVCache([k.dequantize() for k in cache.k], [v.dequantize() for v in cache.v], cache.lengths)
    step = jnp.argmax(logits, -1).astype(jnp.int32)
    on_kernel, _ = generation.decode_step(Transformer(m8.cfg, kernels="interpret", params=m8.params()), step, copy)
    on_xla, cache = generation.decode_step(m8, step, cache)
    assert testing.rel_err(on_kernel, testing.f64(on_xla)) < 1e-5
    twin, _ = generation.decode_step(trained, step, deq)
    assert 0 < testing.rel_err(on_xla, testing.f64(twin)) < 5e-3


def test_int8_kv_cache_is_refused_where_caches_stay_float(trained):
    from inference_lab.model.kv_cache import KVCache

    m8 = trained.with_kv_cache_dtype("int8")
    cache = KVCache.create(m8.cfg, 1, 32)
    _, cache = generation.prefill(m8, np.array([[1, 2, 3]]), cache, np.array([3]))
    with pytest.raises(ValueError, match="speculative decoding's verify step keeps float caches"):
        generation.verify(m8, np.array([[4, 5]]), cache)
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' must be one of auto, int8"):
        trained.with_kv_cache_dtype("fp8")


def test_int8_kv_cache_updates_in_place_and_counts_its_bytes():
    from inference_lab.analytic import costs
    from inference_lab.model.kv_cache import KVCache
    from inference_lab.runtime import hlo

    cfg = ModelConfig.preset("tiny")
    c8 = cfg.replace(kv_cache_dtype="int8")
    assert costs.kv_bytes_per_token(c8) == pytest.approx(costs.kv_bytes_per_token(cfg) * (1 + 4 / 32) / 4)
    model = Transformer(c8, kernels="reference")
    cache = KVCache.random(c8, 2, 64, 16)
    assert cache.nbytes == 2 * cfg.n_layers * 2 * 64 * cfg.n_kv_heads * (cfg.head_dim + 4)
    text = generation._decode_loop_jit.lower(model.params(), jnp.zeros((2,), jnp.int32), cache.lengths, cache.k,
                                             cache.v, jax.random.key(0), None, steps=4, top_k=None, cfg=c8,
                                             mode="reference").compile().as_text()
    assert hlo.count_cache_copies(text, cache.k[0].values.size) == 0
