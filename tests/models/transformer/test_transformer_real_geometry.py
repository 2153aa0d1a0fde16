"""int8 numerics in the geometry of the real files (Qwen2.5-Coder-0.5B: d 896, 14 / 2 heads of
64, q/k/v biases, ff 4864, untied head; Gemma 3 270M: d 640, 4 / 1 heads of 256, q/k and
output norms, ff 2048, 5:1 sliding/full layers, tied head) on small random GGUFs
(`real_geometry_helpers`) whose 2-D weights hold every integer ggml type and an F16 matrix:

* every weight of an integer type is multiplied where the mapped file holds it;
* the bits do not depend on how the tokens arrive (forward, chunks of 7, prefill + steps, a
  batch of two sessions), on the thread count, on a split into local stages, on the fused
  native block vs the block run kernel by kernel, nor on the SIMD variant or the numpy
  reference (fresh processes);
* each product equals the float path's dequantised weight times the int8 activation, and the
  logits stay close to the float path's on the same file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from real_geometry_helpers import GEMMA, QWEN, write_real_geometry_gguf
from wtype_helpers import INTEGER_TYPES, maps_the_file

import needlepoint
from needlepoint.kernels import i8, i8_native, wtypes
from needlepoint.kernels.blockweight import BlockWeight
from needlepoint.models.transformer.int8 import BlockEmbedding

REPO_ROOT = Path(__file__).resolve().parents[3]
MODELS = {"qwen2": QWEN, "gemma3": GEMMA}
TOKENS = 32


class Case:
    """One written file, its tensor types, its int8 model and the logits of `ids`."""

    def __init__(self, folder: Path, arch: str) -> None:
        self.geometry = MODELS[arch]
        self.path, self.types = write_real_geometry_gguf(self.geometry,
                                                         folder / f"{arch}.gguf")
        self.model = needlepoint.load(self.path, numerics="int8")
        vocab = self.model.config.vocab
        self.ids = np.random.default_rng(7).integers(3, vocab, TOKENS).tolist()
        self.full = self.model.forward(self.ids)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real_geometry")
    return {arch: Case(folder, arch) for arch in MODELS}


@pytest.fixture(params=list(MODELS))
def case(request, cases) -> Case:
    return cases[request.param]


def _stored_parts(case: Case, layer: int) -> dict[str, object]:
    """Each GGUF weight of block `layer` and the int8 part that multiplies it."""
    weights = case.model.weights.layers[layer]
    names = {"qkv": ("attn_q", "attn_k", "attn_v"), "gate_up": ("ffn_gate", "ffn_up"),
             "o": ("attn_output",), "down": ("ffn_down",)}
    return {f"blk.{layer}.{stem}.weight": part for field, stems in names.items()
            for stem, part in zip(stems, getattr(weights, field).parts, strict=True)}


def test_the_files_hold_every_integer_type_and_the_real_geometry(cases) -> None:
    every = {kind for case in cases.values() for kind in case.types.values()}
    assert every == set(INTEGER_TYPES) | {"F16"}
    assert set(INTEGER_TYPES) == {n for n, t in wtypes.TYPES.items() if t.unpack is not None}
    for case in cases.values():  # each file alone holds every integer type
        assert set(INTEGER_TYPES) <= set(case.types.values()), case.types
    qwen, gemma = cases["qwen2"].model.config, cases["gemma3"].model.config
    assert (qwen.d_model, qwen.num_heads, qwen.num_kv_heads, qwen.head_dim, qwen.d_ff) == \
        (896, 14, 2, 64, 4864)
    assert (gemma.d_model, gemma.num_heads, gemma.num_kv_heads, gemma.head_dim, gemma.d_ff) == \
        (640, 4, 1, 256, 2048)
    assert [gemma.window(i) for i in range(6)] == [8] * 5 + [None]  # 5 sliding, 1 full
    assert TOKENS > 3 * GEMMA["window"]  # the window slides within the tests' prompts


def test_every_integer_weight_is_multiplied_where_the_file_holds_it(case) -> None:
    for layer in range(case.geometry["layers"]):
        for name, part in _stored_parts(case, layer).items():
            kind = case.types[name]
            if kind == "F16":  # a float weight: quantised to int8 at load
                assert isinstance(part, i8.I8Weight), name
                continue
            assert isinstance(part, BlockWeight) and part.wtype.name == kind, (name, part)
            assert maps_the_file(part.data), name
    weights = case.model.weights
    assert isinstance(weights.embed, BlockEmbedding)
    assert weights.embed.weight.wtype.name == case.types["token_embd.weight"]
    assert maps_the_file(weights.embed.weight.data)
    (head,) = weights.lm_head.parts
    if "output.weight" in case.types:  # Qwen: its own Q8_0 head
        assert head.wtype.name == case.types["output.weight"] and maps_the_file(head.data)
    else:  # Gemma: the tied head multiplies the embedding's own blocks
        assert head is weights.embed.weight


def test_forward_chunks_steps_and_a_batch_give_the_same_bits(case) -> None:
    model, ids, full = case.model, case.ids, case.full
    np.testing.assert_array_equal(model.session(chunk=7).run(ids, "all"), full)
    session = model.session(chunk=7)
    np.testing.assert_array_equal(session.prefill(ids[:20]), full[19])
    stepped = np.stack([session.step(t) for t in ids[20:]])
    np.testing.assert_array_equal(stepped, full[20:])
    short, long = model.session(chunk=7), model.session(chunk=64)
    out = model.run_batch([(short, ids[:13], True), (long, ids, False)])
    np.testing.assert_array_equal(out[0], full[:13])
    np.testing.assert_array_equal(out[1], full[-1])
    np.testing.assert_array_equal(short.step(ids[13]), full[13])  # the batch left it in step


def test_two_threads_give_the_same_bits(case) -> None:
    two = needlepoint.load(case.path, numerics="int8", threads=2)
    assert two.weights.lm_head.parts[0].threads == 2
    assert two.weights.layers[0].down.parts[0].threads == 2
    np.testing.assert_array_equal(two.forward(case.ids), case.full)
    session = two.session(chunk=7)
    session.prefill(case.ids[:-4], logits=False)
    np.testing.assert_array_equal(np.stack([session.step(t) for t in case.ids[-4:]]),
                                  case.full[-4:])


@pytest.mark.parametrize("stages", [2, "last"])
def test_local_stages_give_the_same_bits(case, stages) -> None:
    """Two balanced stages, and a cut before the last block (Gemma: its one full layer)."""
    layers = case.geometry["layers"]
    cuts = 2 if stages == 2 else [0, layers - 1]
    ids, full = case.ids, case.full
    with needlepoint.load(case.path, numerics="int8", stages=cuts) as staged:
        assert len(staged.plan.cuts) == 2
        np.testing.assert_array_equal(staged.forward(ids), full)
        session = staged.session(chunk=7)
        np.testing.assert_array_equal(session.prefill(ids[:25]), full[24])
        np.testing.assert_array_equal(np.stack([session.step(t) for t in ids[25:]]), full[25:])


def _prefill_and_steps(model, ids: list[int], chunk: int, steps: int) -> np.ndarray:
    """Logits of every position of `ids`: the prompt in chunks of `chunk`, then `steps`
    tokens one at a time."""
    session = model.session(chunk=chunk)
    head = session.run(ids[:-steps], "all")
    return np.concatenate([head, np.stack([session.step(t) for t in ids[-steps:]])])


def test_fused_native_block_equals_the_block_kernel_by_kernel(case) -> None:
    model, ids, full = case.model, case.ids, case.full
    if case.geometry["arch"] == "gemma3":  # q/k and output norms, windows: kernel by kernel
        assert model.fused_blocks is None
        return
    assert model.fused_blocks is not None and len(model.fused_blocks) == QWEN["layers"]
    model.fused = False
    try:
        np.testing.assert_array_equal(model.forward(ids), full)
        for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
            i8_native.LIBRARY.np_force_variant(variant)
            try:  # 12 positions (the baseline is slow at this width): a tile of 8 + 1, 1, steps
                for fused in (True, False):
                    model.fused = fused
                    np.testing.assert_array_equal(_prefill_and_steps(model, ids[:12], 9, 2),
                                                  full[:12], err_msg=f"{variant} {fused}")
            finally:
                i8_native.LIBRARY.np_force_variant(2)
    finally:
        model.fused = True


SCRIPT = """
import sys
import numpy as np
import needlepoint
from needlepoint.kernels import i8_native
model = needlepoint.load(sys.argv[1], numerics="int8")
ids = [int(t) for t in sys.argv[3].split(",")]
session = model.session(chunk=13)  # 13 rows: tiles of 8 and 4 and a remainder
logits = [session.run(ids[:-3], "all")] + [session.step(t)[None] for t in ids[-3:]]
np.save(sys.argv[2], np.concatenate(logits))
print(i8_native.simd_variant())
"""
VARIANT_TOKENS = 16  # the numpy reference and the baseline take seconds per 16 positions


def test_every_variant_and_the_numpy_reference_give_the_same_bits(case, tmp_path) -> None:
    """Each in a fresh process (the variant is chosen when the library loads), all at once."""
    runs = {"best": {}, "avx2": {"NEEDLEPOINT_NATIVE_VARIANT": "1"},
            "baseline": {"NEEDLEPOINT_NATIVE_VARIANT": "0"}, "numpy": {"NEEDLEPOINT_NATIVE": "0"}}
    src = str(REPO_ROOT / "src")
    ids = ",".join(map(str, case.ids[:VARIANT_TOKENS]))
    started = {}
    for label, extra in runs.items():
        env = dict(os.environ, **extra)
        env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]]
                                                     if env.get("PYTHONPATH") else []))
        out = tmp_path / f"{label}.npy"
        started[label] = out, subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(case.path), str(out), ids], env=env,
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = set()
    for label, (out, process) in started.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
        seen.add(stdout.strip())
        np.testing.assert_array_equal(np.load(out), case.full[:VARIANT_TOKENS],
                                      err_msg=f"{label} ({stdout.strip()})")
    assert {"baseline", "none"} <= seen  # the baseline C and the numpy reference did run


def test_int8_is_close_to_the_float_path_on_the_same_file(case) -> None:
    flt = needlepoint.load(case.path, numerics="float")
    rng = np.random.default_rng(3)
    # each product: the file's dequantised weight (the float path's) times the int8
    # activation, to float32 rounding of the sums (1e-6 of the largest output) for weights
    # used as stored; an F16 weight is quantised to int8 at load (codes of 1/127 of a block's
    # largest value: a relative error up to ~1/254 per value, 1e-2 of the largest output)
    for layer, plain in enumerate(flt.weights.layers):
        weights = case.model.weights.layers[layer]
        for field, parts in (("qkv", ("q", "k", "v")), ("gate_up", ("gate", "up")),
                             ("o", ("o",)), ("down", ("down",))):
            fused = getattr(weights, field)
            x = rng.standard_normal((3, fused.in_features)).astype(np.float32)
            codes, scale, _ = i8.quantize(x, fused.k_pad)
            seen = (codes.reshape(3, -1, 32) * scale[:, :, None].astype(np.float64))
            seen = seen.reshape(3, -1)[:, : fused.in_features]
            linears = [getattr(plain, p) for p in parts]
            expect = seen @ np.concatenate([lin.weight for lin in linears], axis=1)
            expect += np.concatenate([np.zeros(lin.out_features) if lin.bias is None
                                      else lin.bias for lin in linears])
            loaded = any(isinstance(p, i8.I8Weight) for p in fused.parts)
            bound = (1e-2 if loaded else 1e-6) * np.abs(expect).max()
            assert np.abs(fused(x) - expect).max() <= bound, (layer, field)
    # the logits: an int8 activation row (codes of 1/127 of its block's largest value, ~2.1
    # standard deviations for 32 normal values) carries an rms rounding error of ~0.5% of its
    # rms; the ~35 roundings in a row (per block: the q | k | v input, q and v codes, the o,
    # gate | up and down inputs; the head's input) add up, if independent, to ~3% of the
    # logits' spread at every position. Bounded at twice that; the top token then mostly agrees
    reference = flt.forward(case.ids)
    spread = np.sqrt(np.mean((reference - reference.mean(-1, keepdims=True)) ** 2, axis=-1))
    distance = np.sqrt(np.mean((case.full - reference) ** 2, axis=-1))
    assert (distance / spread).max() <= 0.06, distance / spread
    assert np.mean(case.full.argmax(-1) == reference.argmax(-1)) >= 0.8
