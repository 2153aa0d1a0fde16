"""The int8 numerics' elementwise parts and attention: every one batch-invariant and pinned.

With `numerics="int8"` every matrix product is an `linear.Int8Linear` (`kernels.i8`), and the
rest of the block is computed row by row in a fixed order, so a position's logits never depend
on how many other positions share its chunk, on the chunk size, on the thread count or on BLAS:

* norms: `kernels.i8_ops.norm` (float64 halving-tree sums, same bits native or numpy);
* SiLU `x / (1 + exp32(-x))` and GELU-tanh `x / (1 + exp32(-2u))`, `u = sqrt(2/pi)(x +
  0.044715 x^3)` (the same function as `0.5 x (1 + tanh u)`), float32 elementwise with the
  pinned exp (`kernels.pinned.exp32`);
* RoPE: cos/sin tables computed once per model from float32 angles `p * inv_freq` through
  float64 cos/sin rounded to float32, applied elementwise;
* logit soft-capping (Gemma): `kernels.pinned.softcap32`, `cap * tanh(x / cap)` with the
  pinned exp; a soft-capped attention runs `kernels.pinned.attend_reference` (no native form);
* attention: keys cached as int16 rows (`kernels.exact.a16_codes_reference`: a few large key
  channels, as Qwen's k bias makes, leave an 8-bit row too few levels for the rest; 16-bit
  keys bring int8's worst logit error on Qwen2.5 from 2.7 to 0.43, the products' own) and
  values as int8 rows (A8, `kernels.exact.a8_codes_reference`), one scale per position and kv
  head; queries A16 per position and head (Gemma 3's q norm weights make a few large query
  channels the same way: 8-bit queries were its largest loss, docs/numerics.md), and
  `kernels.pinned.attend_reference`'s attention (exact integer scores, pinned softmax: pinned
  exp, sums in position order; values summed in position order), native in
  `kernels.i8_rows`. Its score scale is `1/sqrt(head_dim)`; another scale multiplies q first.

`int8_fused.py` runs a whole block of these in one native call, with the same bits.
"""

from __future__ import annotations

import math

import numpy as np

from ...kernels import exact, i8_ops, i8_rows, pinned
from ...kernels.blockweight import BlockWeight
from .kv_cache import KVRows

F32 = np.float32
_SQRT_2_OVER_PI = F32(math.sqrt(2.0 / math.pi))
_GELU_C = F32(0.044715)


class PinnedNorm:
    """RMSNorm (`center` False) or LayerNorm over the last axis, in the pinned order."""

    __slots__ = ("weight", "bias", "eps", "center")

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, eps: float,
                 center: bool) -> None:
        self.weight = np.ascontiguousarray(weight, F32)
        self.bias = None if bias is None else np.ascontiguousarray(bias, F32)
        self.eps = float(eps)
        self.center = center

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return i8_ops.norm(x, self.weight, self.bias, self.eps, self.center)


def pinned_silu(x: np.ndarray) -> np.ndarray:
    e = pinned.exp32(np.negative(x, dtype=F32))
    e += F32(1.0)
    return np.divide(x, e, dtype=F32)


def pinned_gelu_tanh(x: np.ndarray) -> np.ndarray:
    u = x * x
    u *= x
    u *= _GELU_C
    u += x
    u *= _SQRT_2_OVER_PI * F32(-2.0)
    e = pinned.exp32(u)
    e += F32(1.0)
    return np.divide(x, e, dtype=F32)


ACTIVATIONS = {"silu": pinned_silu, "gelu_tanh": pinned_gelu_tanh}


class RopeTable:
    """cos, sin [positions, head_dim] of one model, grown on demand (elementwise per
    position, so a position's row is the same whichever chunk asks for it)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(F32) / F32(head_dim)
        self.inv_freq = F32(1.0) / (F32(theta) ** exponent)
        self.cos = np.zeros((0, head_dim), F32)
        self.sin = np.zeros((0, head_dim), F32)

    def __call__(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        end = start + count
        if end > self.cos.shape[0]:
            size = max(end, 2 * self.cos.shape[0], 256)
            positions = np.arange(size, dtype=np.int64).astype(F32)
            angles = (positions[:, None] * self.inv_freq[None, :]).astype(np.float64)
            angles = np.concatenate([angles, angles], axis=-1)
            self.cos, self.sin = np.cos(angles).astype(F32), np.sin(angles).astype(F32)
        return self.cos[start:end], self.sin[start:end]


def query_codes(q: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """A16 codes and scales of query rows q [T, H, hd] -> [T*H, hd], [T*H]: the kernels'
    score scale is 1/sqrt(hd), so another `scale` first multiplies q by scale * sqrt(hd)."""
    count, heads, head_dim = q.shape
    factor = F32(scale * math.sqrt(head_dim))
    rows = np.ascontiguousarray(q, F32).reshape(count * heads, head_dim)
    if factor != F32(1.0):
        rows = rows * factor
    return exact.a16_codes(rows)


class Int8KVCache(KVRows):
    """Keys (int16) and values (int8) of one layer as rows `[positions, kv_heads, head_dim]`
    with float32 scales `[positions, kv_heads]`, kept as the layer's window says
    (`kv_cache.py`); `attend` appends a chunk and attends to it."""

    NAMES = ("kcode", "kscale", "vcode", "vscale")
    __slots__ = ("kcode", "kscale", "vcode", "vscale", "_held")

    def __init__(self, kv_heads: int, head_dim: int, limit: int,
                 window: int | None = None) -> None:
        self._setup({"kcode": np.zeros((0, kv_heads, head_dim), np.int16),
                     "kscale": np.zeros((0, kv_heads), F32),
                     "vcode": np.zeros((0, kv_heads, head_dim), np.int8),
                     "vscale": np.zeros((0, kv_heads), F32)}, limit, window)
        self._held: tuple | None = None

    def addresses(self) -> tuple[int, int, int, int]:
        """Data addresses of kcode, kscale, vcode, vscale (for the native block, which writes
        a full cache's rows itself), looked up again only when an array was replaced."""
        held = self._held
        if (held is None or held[0] is not self.kcode or held[1] is not self.kscale
                or held[2] is not self.vcode or held[3] is not self.vscale):
            arrays = (self.kcode, self.kscale, self.vcode, self.vscale)
            held = (*arrays, tuple(a.ctypes.data for a in arrays))
            self._held = held
        return held[4]

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Quantise and store k (A16), v (A8) [T, kv_heads, hd], one scale per row of hd."""
        count, heads, head_dim = k.shape
        new = {}
        for name, src, rule in (("k", k, exact.a16_codes), ("v", v, exact.a8_codes)):
            c, s = rule(np.ascontiguousarray(src, F32).reshape(count * heads, head_dim))
            new[name + "code"] = c.reshape(count, heads, head_dim)
            new[name + "scale"] = s.reshape(count, heads)
        self.write(new)

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int,
               scale: float, softcap: float | None = None) -> np.ndarray:
        """Append k, v; q [T, H, hd] at positions start.. attends causally (within the
        window, each query row's keys in ascending position order) -> [T, H*hd]. A full
        cache runs the native causal kernel; a window or a `softcap` (`pinned.softcap32`)
        `kernels.pinned`'s attention over the rows held, the same definition."""
        self.check_start(start)
        self.append(k, v)
        count, heads, hd = q.shape
        kv_heads = self.kcode.shape[1]
        qcode, qscale = query_codes(q, scale)
        if self.window is None and softcap is None:
            return i8_rows.attend_causal(qcode, qscale, start, heads, self.kcode, self.kscale,
                                         self.vcode, self.vscale)
        if self.window is None:
            slots, seen = i8_rows.causal_slots(start, count, heads, kv_heads)
        else:
            slots, seen = window_slots(start, count, heads, kv_heads, self.base, self.window)
        flat = self.kcode.shape[0] * kv_heads
        arrays = (qcode, qscale, self.kcode.reshape(flat, hd), self.kscale.reshape(flat),
                  self.vcode.reshape(flat, hd), self.vscale.reshape(flat), slots, seen)
        out = (pinned.attend(*arrays) if softcap is None
               else pinned.attend_reference(*arrays, softcap=softcap))
        self.trim()
        return out.reshape(count, heads * hd)

    def copy(self) -> Int8KVCache:
        other = self.copy_rows(Int8KVCache.__new__(Int8KVCache))
        other._held = None
        return other


def window_slots(start: int, count: int, heads: int, kv_heads: int, base: int, window: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """slots [count*heads, n] and keys seen per query row (t, h): rows `(j - base) * kv_heads
    + g` of positions j = max(0, p - window + 1) .. p, p = start + t, ascending, of kv head
    g = h // (heads / kv_heads)."""
    positions = np.arange(start, start + count, dtype=np.int64)
    first = np.maximum(positions - window + 1, 0)
    seen = positions - first + 1  # [count]
    longest = int(seen.max())
    offsets = np.minimum(first[:, None] + np.arange(longest)[None, :], positions[:, None])
    g = np.arange(heads, dtype=np.int64) // (heads // kv_heads)
    slots = (offsets - base)[:, None, :] * kv_heads + g[None, :, None]  # [count, heads, n]
    return slots.reshape(count * heads, longest), np.repeat(seen, heads)


class BlockEmbedding:
    """Embedding rows read from a weight in its file's own blocks (`kernels.blockweight`;
    a GGUF Q8_0 / Q5_0 / K-quant table, shared with a tied LM head): each row dequantised as
    the float path dequantises it, only the rows asked for."""

    def __init__(self, weight: BlockWeight) -> None:
        self.weight = weight
        self.shape = (weight.n_out, weight.k_in)

    def __getitem__(self, tokens: np.ndarray) -> np.ndarray:
        return self.weight.rows(np.asarray(tokens, np.int64).reshape(-1))
