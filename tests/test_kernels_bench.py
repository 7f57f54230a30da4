"""The kernel benchmark runs end to end (on CPU: tiny shapes, flagged as not representative),
times inside jitted loops that XLA cannot shortcut, and fails loudly when our kernels fail."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import pallas_kernels as pk
from inference_lab.runtime import hlo
from pallas_kernels import bench, timing
from pallas_kernels.mode import pallas_supported

CPU_ONLY = pytest.mark.skipif(pallas_supported(), reason="the CPU path; on a GPU scripts/gpu_check.sh runs the full benchmark")


@CPU_ONLY
def test_bench_quick_on_cpu(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--repeats", "1", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "NOT REPRESENTATIVE" in printed
    result = json.loads(path.read_text())
    assert result["meta"]["representative"] is False and result["failures"] == []
    assert result["ceilings"]["matmul_flops"] > 0 and result["ceilings"]["bandwidth"] > 0
    kernels = {row["kernel"] for row in result["rows"]}
    assert kernels == {"matmul", "matmul_decode", "flash_attention", "decode_attention", "paged_decode_attention"}
    timed = [row for row in result["rows"] if "seconds" in row]
    assert len(timed) == len(result["rows"]) and all(row["seconds"] > 0 for row in timed)
    # Every kernel was timed both as Pallas (interpreted) and as XLA.
    for kernel in kernels:
        impls = {row["impl"] for row in timed if row["kernel"] == kernel}
        assert "pallas[interpret]" in impls and len(impls) >= 2, (kernel, impls)


@CPU_ONLY
def test_bench_exits_nonzero_when_our_kernel_fails(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(pk, "decode_attention", broken)
    assert bench.main(["--quick", "--repeats", "1"]) == 1
    out = capsys.readouterr()
    assert "ERROR: decode_attention" in out.out and "kernel exploded" in out.out
    assert "failed" in out.err


def _dot_inside_loop(text: str) -> bool:
    """Whether a dot is computed inside the program's while loop (its body or what it calls)."""
    import re

    comps, entry = hlo._computations(text)
    bodies = [m.group(1) for line in comps[entry] for m in [re.search(r"body=%?([\w.\-]+)", line)] if m]
    todo, seen = list(bodies), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for line in comps[name]:
            if re.search(r"\sdot\(", line):
                return True
            todo += re.findall(r"(?:calls|body|to_apply)=%?([\w.\-]+)", line)
    return False


def test_loop_keeps_every_call_inside_the_loop():
    """The timed loop cannot be shortcut: the dot stays in the while body, not hoisted out."""
    a, b = jnp.ones((64, 64)), jnp.ones((64, 64))
    looped = timing.InOneProgram(lambda a, b: a @ b, (a, b))
    assert _dot_inside_loop(looped.lower(7).compile().as_text()), "the matmul was hoisted out of the timed loop"
    assert float(looped.jitted(jnp.int32(7), *looped.args)[1]) == 64.0
    # Counter-check: a plain loop over the same call IS shortcut by XLA (the check can fail).
    naive = jax.jit(lambda a, b: lax.fori_loop(0, 7, lambda i, acc: acc + (a @ b)[0, 0], 0.0))
    assert not _dot_inside_loop(naive.lower(a, b).compile().as_text())


def _add_loop(fn, calls):
    """The bench's loop until the H200 run (pallas_kernels.bench.looped): element 0 of every
    floating argument got ``0 * out`` *added*, and the arguments were not donated."""
    def run(*args):
        def body(i, carry):
            xs, acc = carry
            out = fn(*xs).reshape(-1)[0]
            return [x.at[(0,) * x.ndim].add((out * 0).astype(x.dtype)) for x in xs], acc + out
        return lax.fori_loop(0, calls, body, (list(args), jnp.float32(0)))[1]
    return jax.jit(run)


def test_the_timed_loop_writes_no_copy_of_a_weight():
    """One call of a one-row matmul in the timed loop reads its weight and writes one element
    of each argument: no weight-sized buffer is written (hlo.count_cache_copies, with XLA:GPU's
    in-place rule) and the caller's arrays are left as they were. The old loop added to the element
    it wrote, which XLA:GPU emits as a rewrite of the whole weight (compiled for an H200 on a CPU:
    a [2048, 128256] bf16 weight read and written again every call, the one-row matmuls measured
    at a third of the read ceiling) and copied the undonated weight once per sample: the counter
    sees both there, so it can fail."""
    x, w = jnp.ones((1, 256)), jax.random.normal(jax.random.key(0), (256, 512))
    dot = lambda x, w: jnp.dot(x, w)   # noqa: E731
    looped = timing.InOneProgram(dot, (x, w))
    text = looped.lower(5).compile().as_text()
    assert hlo.count_cache_copies(text, w.size) == 0
    before = looped.args[1]
    for _ in range(2):
        looped(5)
    assert jnp.array_equal(looped.args[1], w) and before.is_deleted()   # donated, handed back unchanged
    old = _add_loop(dot, 5).lower(x, w).compile().as_text()
    assert hlo.count_cache_copies(old, w.size) == 2    # the copy before the loop, the rewrite inside it


def test_bench_rejects_bad_repeats():
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])


def test_decode_projections_cover_both_models():
    assert set(bench.DECODE_PROJECTIONS) == {"base", "llama3_8b"}
    for projs in bench.DECODE_PROJECTIONS.values():
        assert set(projs) == {"qkv", "o", "gate_up", "down", "head"}


def test_bench_checks_its_output_path_before_running(tmp_path, monkeypatch, capsys):
    def boom(**k):
        raise AssertionError("benchmarked before checking --json")

    monkeypatch.setattr(bench, "run", boom)
    cases = [("", "--json '': give a file name"),
             (str(tmp_path / "missing" / "b.json"), "does not exist; create it first"),
             (str(tmp_path), "is a folder; give a file name")]
    for path, message in cases:
        assert bench.main(["--json", path]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bench: error: ") and message in err and err.count("\n") == 1, err
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    assert bench.main(["--json", str(existing)]) == 2
    assert "pass --force" in capsys.readouterr().err and existing.read_text() == "{}"
    monkeypatch.setattr(bench, "run", lambda **k: {"rows": [], "failures": []})
    assert bench.main(["--json", str(existing), "--force"]) == 0
    assert json.loads(existing.read_text()) == {"rows": [], "failures": []}
