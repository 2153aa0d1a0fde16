"""The weight-type table (`kernels.wtypes`) and the numpy reference of the product over a
file's own blocks (`kernels.blockweight`): ggml's dequantisation bit for bit (against the
`gguf` package's decoders), the generic form and the epilogue checked by hand in Python
integers and floats, the BlockWeight API."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from wtype_helpers import INTEGER_TYPES, random_rows

from needlepoint.errors import UnsupportedTensorTypeError
from needlepoint.kernels import blockweight, i8, wtypes
from needlepoint.kernels.blockweight import BlockWeight

F32 = np.float32


@pytest.mark.parametrize("name", INTEGER_TYPES)
def test_dequantize_is_ggml_bit_for_bit(name) -> None:
    rng = np.random.default_rng(INTEGER_TYPES.index(name))
    wt = wtypes.weight_type(name)
    data = random_rows(name, 6, 512, rng)
    ours = wt.dequantize(data)
    ref = gguf_dequantize(data, gguf.GGMLQuantizationType[name]).reshape(6, 512)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))
    assert wt.ggml_id == int(gguf.GGMLQuantizationType[name])
    assert (wt.block_values, wt.block_bytes) == gguf.GGML_QUANT_SIZES[
        gguf.GGMLQuantizationType[name]]


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_float_types_dequantize_as_stored(name) -> None:
    rng = np.random.default_rng(7)
    wt = wtypes.weight_type(name)
    values = rng.standard_normal((3, 64)).astype(F32)
    raw = {"F32": values, "F16": values.astype(np.float16),
           "BF16": (values.view(np.uint32) >> 16).astype(np.uint16)}[name]
    data = np.ascontiguousarray(raw).view(np.uint8)
    ref = gguf_dequantize(data, gguf.GGMLQuantizationType[name]).reshape(3, 64)
    np.testing.assert_array_equal(wt.dequantize(data), ref)
    assert wt.unpack is None and wt.native_id == 0
    assert wt.ggml_id == int(gguf.GGMLQuantizationType[name])


def test_native_ids_are_distinct_and_unknown_types_are_typed_errors() -> None:
    ids = [t.native_id for t in wtypes.TYPES.values() if t.unpack is not None]
    assert len(set(ids)) == len(ids) and 0 not in ids
    with pytest.raises(UnsupportedTensorTypeError, match="IQ2_XXS"):
        wtypes.weight_type("IQ2_XXS")
    with pytest.raises(UnsupportedTensorTypeError, match="Q4_K"):
        wtypes.weight_type("Q4_K").row_bytes(100)


def _by_hand_value(name: str, block: bytes, i: int) -> float:
    """Value i (0..31) of a 32-value block, read from the layout table of wtypes_unpack by
    hand: `a * s * code + m * u` (the generic form)."""
    d = float(np.frombuffer(block[0:2], np.float16)[0])
    if name == "Q8_0":
        return d * int(np.frombuffer(block[2:], np.int8)[i])
    if name == "Q4_0":
        byte = block[2 + i % 16]
        return d * (((byte >> 4) if i >= 16 else (byte & 15)) - 8)
    if name == "Q5_1":
        m = float(np.frombuffer(block[2:4], np.float16)[0])
        qh = int.from_bytes(block[4:8], "little")
        byte = block[8 + i % 16]
        q = ((byte >> 4) if i >= 16 else (byte & 15)) | (((qh >> i) & 1) << 4)
        return d * q + m
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q5_1"])
def test_generic_form_is_the_layout_by_hand(name) -> None:
    rng = np.random.default_rng(11)
    wt = wtypes.weight_type(name)
    data = random_rows(name, 1, 32, rng)
    form = wt.unpack(data)
    block = bytes(data[0])
    for i in (0, 5, 15, 16, 31):
        h = i // 16
        value = (float(form.a[0, 0]) * int(form.s[0, 0, h]) * int(form.codes[0, 0, i])
                 + float(form.m[0, 0]) * int(form.u[0, 0, h]))
        assert value == pytest.approx(_by_hand_value(name, block, i), rel=1e-6, abs=1e-9)


def test_q6_k_and_q2_k_keep_their_sixteen_value_scales() -> None:
    """The 16-value sub-block scales are s0, s1 of each 32-block, not a re-quantisation."""
    rng = np.random.default_rng(12)
    data = random_rows("Q6_K", 1, 256, rng)
    form = wtypes.weight_type("Q6_K").unpack(data)
    assert form.s[0].reshape(-1).tolist() == data[0, 192:208].view(np.int8).tolist()
    data = random_rows("Q2_K", 1, 256, rng)
    form = wtypes.weight_type("Q2_K").unpack(data)
    assert form.s[0].reshape(-1).tolist() == (data[0, :16] & 15).tolist()
    assert form.u[0].reshape(-1).tolist() == (data[0, :16] >> 4).tolist()
    d, dmin = data[0, 80:84].view(np.float16).astype(F32)
    assert (form.a[0] == d).all() and (form.m[0] == -dmin).all()


def _product_by_hand(codes, xscale, w: BlockWeight, t: int, n: int) -> float:
    form = w.wtype.unpack(w.data[n : n + 1])
    acc = 0.0
    for b in range(w.blocks):
        x = [int(v) for v in codes[t, 32 * b : 32 * b + 32]]
        c = [int(v) for v in form.codes[0, b]]
        s0, s1 = (int(v) for v in form.s[0, b])
        u0, u1 = (int(v) for v in form.u[0, b])
        p = s0 * sum(x[i] * c[i] for i in range(16)) + s1 * sum(x[i] * c[i]
                                                             for i in range(16, 32))
        m = u0 * sum(x[:16]) + u1 * sum(x[16:])
        inner = float(form.a[0, b]) * p + float(form.m[0, b]) * m
        acc = acc + inner * float(xscale[t, b])
    return float(F32(acc))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_1", "Q2_K", "Q6_K"])
def test_reference_product_is_the_definition_by_hand(name) -> None:
    rng = np.random.default_rng(13)
    k = 256
    w = BlockWeight(wtypes.weight_type(name), random_rows(name, 5, k, rng), 5, k)
    x = (rng.standard_normal((3, k)) * 4).astype(F32)
    codes, scale, sums = i8.quantize_reference(x, k)
    y = blockweight.matmul_reference(codes, scale, sums, w)
    for t, n in ((0, 0), (1, 3), (2, 4)):
        assert y[t, n] == _product_by_hand(codes, scale, w, t, n)
    bias = rng.standard_normal(5).astype(F32)
    np.testing.assert_array_equal(blockweight.matmul_reference(codes, scale, sums, w, bias),
                                  y + bias)


def test_one_q8_0_block_by_hand() -> None:
    """d = 0.5, codes 0..31, x = 1 everywhere (scale 1/127 after A8): y = 0.5 * 496 * xs."""
    block = np.zeros((1, 34), np.uint8)
    block[0, :2] = np.array([0.5], np.float16).view(np.uint8)
    block[0, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    w = BlockWeight(wtypes.weight_type("Q8_0"), block, 1, 32)
    codes, scale, sums = i8.quantize_reference(np.ones((1, 32), F32), 32)
    assert codes.tolist() == [[127] * 32] and scale[0, 0] == F32(1 / 127)
    y = blockweight.matmul_reference(codes, scale, sums, w)
    assert y[0, 0] == F32(0.5 * (127 * 496) * float(F32(1 / 127)))


def test_q8_0_equals_the_i8_weight_product() -> None:
    """For Q8_0 the block product is kernels.i8's epilogue exactly (codes, float16 d)."""
    rng = np.random.default_rng(14)
    data = random_rows("Q8_0", 19, 96, rng)
    data.reshape(-1, 34)[:, 2:][data.reshape(-1, 34)[:, 2:] == 128] = 129  # i8 has no -128
    w = BlockWeight(wtypes.weight_type("Q8_0"), data, 19, 96)
    form = w.wtype.unpack(data)
    old = i8.pack_weight(form.codes.reshape(19, 96), form.a)
    x = (rng.standard_normal((4, 96)) * 3).astype(F32)
    q = i8.quantize_reference(x, 96)
    np.testing.assert_array_equal(blockweight.matmul_reference(*q, w),
                                  i8.matmul_reference(*q, old))


def test_to_q8_0_is_the_defined_rounding() -> None:
    rng = np.random.default_rng(15)
    w = rng.standard_normal((3, 40)).astype(F32)
    w[1, :32] = 0.0  # an all-zero block: d = 0, codes 0
    blocks = wtypes.to_q8_0(w)
    assert blocks.shape == (3, 2 * 34)
    b = blocks.reshape(3, 2, 34)
    d = b[:, :, :2].copy().view(np.float16)[..., 0]
    codes = b[:, :, 2:].view(np.int8)
    assert d[1, 0] == 0 and not codes[1, 0].any()
    assert d[0, 0] == np.float16(np.abs(w[0, :32]).max() / F32(127))
    expect = np.clip(np.rint(w[2, 32:] / F32(d[2, 1])), -127, 127)
    assert codes[2, 1, :8].tolist() == expect.astype(int).tolist()
    assert not codes[2, 1, 8:].any()  # padding past k = 40
    back = BlockWeight(wtypes.weight_type("Q8_0"), blocks, 3, 40).dequantize()
    assert back.shape == (3, 40)
    np.testing.assert_allclose(back, w, atol=float(np.abs(w).max()) / 127)


def test_block_weight_api() -> None:
    rng = np.random.default_rng(16)
    data = random_rows("Q4_K", 7, 512, rng)
    w = BlockWeight(wtypes.weight_type("Q4_K"), data, 7, 512, threads=2)
    assert (w.n_out, w.k_in, w.k_pad, w.nbytes, w.threads) == (7, 512, 512, 7 * 288, 2)
    assert w.data is data or np.shares_memory(w.data, data)  # never copied
    full = w.dequantize()
    np.testing.assert_array_equal(w.rows([5, 0, 5]), full[[5, 0, 5]])
    picked = w.select_rows([6, 1])
    np.testing.assert_array_equal(picked.dequantize(), full[[6, 1]])
    assert not np.shares_memory(picked.data, data)
    with pytest.raises(IndexError):
        w.rows([7])
    with pytest.raises(ValueError, match="uint8"):
        BlockWeight(wtypes.weight_type("Q4_K"), data[:, :-1], 7, 512)
    with pytest.raises(UnsupportedTensorTypeError, match="256"):
        BlockWeight(wtypes.weight_type("Q4_K"), data, 7, 480)
    with pytest.raises(UnsupportedTensorTypeError, match="F16"):
        BlockWeight(wtypes.weight_type("F16"), data, 7, 512)
