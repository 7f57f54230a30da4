"""The optional Hopper sections of notebooks 02 and 03: plans of both tiers, the interpret check,
and the measured comparison read from a recorded GPU benchmark (or an honest "not yet")."""

import json

from inference_lab.lessons import hopper_tier


def test_plans_describe_both_tiers():
    text = hopper_tier.matmul_plans(1, 2048, 3072)
    assert "Triton tier" in text and "Mosaic tier" in text and "132 persistent CTAs" in text
    assert "split" in text  # a decode projection splits K in both tiers
    text = hopper_tier.decode_attention_plans(1, 32768, 32, 8, 128)
    assert "1,024 programs" in text and "wgmma" in text
    assert len(hopper_tier.what_hopper_adds().splitlines()) == 4


def test_mosaic_kernels_check_out_under_gpu_interpret_mode():
    errors = hopper_tier.mosaic_check()
    assert len(errors) == 2 and all(0 <= e < 2e-2 for e in errors.values()), errors


def test_measured_tiers_reads_a_recorded_benchmark(tmp_path):
    assert "no GPU measurement recorded yet" in hopper_tier.measured_tiers("matmul", tmp_path / "none.json")
    bench = {"meta": {"device": "NVIDIA H200", "date": "2026-12-01", "jax": "0.11.2"},
             "rows": [{"kernel": "matmul", "shape": "8192x8192x8192 bfloat16", "impl": "pallas[triton]",
                       "seconds": 1.5e-3, "tflops": 733.0},
                      {"kernel": "matmul", "shape": "8192x8192x8192 bfloat16", "impl": "pallas[mosaic]",
                       "seconds": 1.4e-3, "tflops": 781.0},
                      {"kernel": "matmul", "shape": "8192x8192x8192 bfloat16", "impl": "pallas[mosaic]",
                       "error": "boom"},
                      {"kernel": "decode_attention", "shape": "B64", "impl": "pallas[triton]", "seconds": 1e-4,
                       "tbps": 3.1}]}
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(bench))
    text = hopper_tier.measured_tiers("matmul", path)
    assert "NVIDIA H200" in text and "733 TFLOP/s" in text and "781 TFLOP/s" in text and "TB/s" not in text
