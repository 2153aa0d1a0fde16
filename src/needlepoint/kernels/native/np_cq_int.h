/* Exact CQ x A8 products in integers, AVX2 and AVX-512 VNNI variants (included by np_cq.h
 * once per variant, every name through NP_NAME; the baseline variant keeps the float64
 * kernel, faster without SIMD): here the level-sum kernel (2-bit storage, decode rows), in
 * np_cq_int16.h the 16-bit digit kernel (4-bit storage, and 2-bit prefill tiles); np_cq_int
 * at the end picks. docs/numerics.md "Exact CQ x A8 products" is the contract,
 * kernels/exact.py `cq_matmul_reference` the numpy reference with the same bits.
 *
 * A group's sum D = sum_c cb[idx_c] v_c is regrouped by level: D = sum_j cb[j] S_j with
 * S_j = sum of the v_c whose code is j, integers (|S_j| <= 128 * 2^14 < 2^21). Three integer
 * functionals of the codes give the four S_j (the fourth from the group total of v, a property
 * of the activation alone):
 *   Fa = sum_c idx_c v_c,  Fb = sum_c [idx_c >= 2] v_c,  Fc = sum_c [idx_c == 3] v_c;
 *   S3 = Fc, S2 = Fb - Fc, S1 = Fa - 2 S2 - 3 S3, S0 = total - S1 - S2 - S3.
 * Each cb[j] S_j is exact in float64 (24-bit level times a 22-bit integer) and so is their sum
 * in any order (multiples of the codebook quantum below 2^53 of it: `check_codebook`), so
 * D is the exact value the float64 reference computes, and the unchanged epilogue
 * (np_epilogue) gives the same bits. No bound on the codebook's integer levels is needed.
 *
 * SIMD: v = 128 vh + vl with vl = v & 127 in [0, 127] and vh = v >> 7 in [-128, 127] (any
 * |v| <= 2^14, which the A8 rotation guarantees; other inputs fall back to the float64
 * kernel), both as bytes, so the functionals are u8 x s8 multiply-adds: vpmaddubsw with 16-bit
 * lanes (AVX2: a lane sums 8 products of at most 3 * 128, no saturation) or vpdpbusd into
 * 32-bit lanes (AVX-512 VNNI). Activation bytes are laid out to match the packed codes:
 * byte k of a group's 32 holds columns 4k + s in bits 2s..2s+1, so field s of all 32 bytes
 * meets vl/vh of columns 4k + s, stored at ((g/2)*4 + s)*64 + (g%2)*32 + k (two groups side
 * by side per field: one 64-byte AVX-512 register covers a pair of groups). */

#ifndef NP_I2_ONCE
#define NP_I2_ONCE
#define NP_I2_VRANGE 16384 /* |v| bound of the byte split (vh = v >> 7 must fit an int8) */
#endif
#ifdef NP_SIMD_AVX2 /* the baseline variant keeps the float64 kernel (faster without SIMD) */
/* activation rows per pass over the weights (prefill reuses each weight tile this often) */
#if defined(NP_SIMD_AVX512)
#define NP_I2_RB 2
#define NP_I2_TMAX 2 /* activation rows up to which np_cq_int picks this kernel */
#else
#define NP_I2_RB 1
#define NP_I2_TMAX 1
#endif

/* Activation bytes of rows t in [0, T) for codes of 8 / fields bits: lo/hi [T, act_bytes],
 * column c of a chunk of 64 * fields columns at (chunk * fields + c % fields) * 64 + c / fields
 * (the chunk's 64 code bytes hold its columns in that order), the rest zero; group totals
 * tot [T, g8] (g8 = groups rounded up to 8; the caller zeroes the padding). NP_BADARG when
 * some v is outside [-2^14, 2^14). */
static int NP_NAME(np_int_prepare)(const int32_t *v, int64_t T, int64_t in_pad, int fields,
                                   int8_t *lo, int8_t *hi, int32_t *tot, int64_t act_bytes) {
    int64_t groups = in_pad / 128, g8 = (groups + 7) & ~(int64_t)7;
    int shift = fields == 4 ? 2 : fields == 2 ? 1 : 0; /* fields is a power of two */
    for (int64_t t = 0; t < T; t++) {
        int8_t *L = lo + t * act_bytes, *H = hi + t * act_bytes;
        memset(L, 0, (size_t)act_bytes);
        memset(H, 0, (size_t)act_bytes);
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            int32_t sum = 0;
            for (int c = 0; c < 128; c++) {
                int32_t value = x[c];
                if (value < -NP_I2_VRANGE || value >= NP_I2_VRANGE) return NP_BADARG;
                sum += value;
                int64_t col = g * 128 + c, cc = col & ((64 << shift) - 1);
                int64_t at = (((col >> (6 + shift)) << shift) + (cc & (fields - 1))) * 64 +
                             (cc >> shift);
                L[at] = (int8_t)(value & 127);
                H[at] = (int8_t)(value >> 7);
            }
            tot[t * g8 + g] = sum;
        }
    }
    return NP_OK;
}

#ifdef NP_SIMD_AVX2
/* One group against nb activation rows (stride act_bytes): 16-bit multiply-adds; the
 * functionals' 32-bit lanes (unreduced) go to f[(b * 3 + u) * fstride + lane]. */
static inline __attribute__((always_inline)) void NP_NAME(np_i2_group_avx2)(
    const uint8_t *bytes, const int8_t *L, const int8_t *H, int64_t act_bytes, const int nb,
    int32_t *f, int64_t fstride) {
    const __m256i c = _mm256_loadu_si256((const __m256i *)bytes);
    const __m256i three = _mm256_set1_epi8(3);
    const __m256i tb = _mm256_setr_epi8(0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i tc = _mm256_setr_epi8(0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    __m256i acc[NP_I2_RB][6];
    for (int b = 0; b < nb; b++)
        for (int u = 0; u < 6; u++) acc[b][u] = _mm256_setzero_si256();
    __m256i x = c;
    for (int s = 0; s < 4; s++) {
        __m256i a = _mm256_and_si256(x, three);
        __m256i mb = _mm256_shuffle_epi8(tb, a), mc = _mm256_shuffle_epi8(tc, a);
        x = _mm256_srli_epi16(x, 2);
        for (int b = 0; b < nb; b++) {
            __m256i l = _mm256_loadu_si256((const __m256i *)(L + b * act_bytes + s * 64));
            __m256i h = _mm256_loadu_si256((const __m256i *)(H + b * act_bytes + s * 64));
            acc[b][0] = _mm256_add_epi16(acc[b][0], _mm256_maddubs_epi16(a, l));
            acc[b][1] = _mm256_add_epi16(acc[b][1], _mm256_maddubs_epi16(a, h));
            acc[b][2] = _mm256_add_epi16(acc[b][2], _mm256_maddubs_epi16(mb, l));
            acc[b][3] = _mm256_add_epi16(acc[b][3], _mm256_maddubs_epi16(mb, h));
            acc[b][4] = _mm256_add_epi16(acc[b][4], _mm256_maddubs_epi16(mc, l));
            acc[b][5] = _mm256_add_epi16(acc[b][5], _mm256_maddubs_epi16(mc, h));
        }
    }
    const __m256i one = _mm256_set1_epi16(1), w128 = _mm256_set1_epi16(128);
    for (int b = 0; b < nb; b++)
        for (int u = 0; u < 3; u++)
            _mm256_storeu_si256((__m256i *)(f + (b * 3 + u) * fstride),
                                _mm256_add_epi32(_mm256_madd_epi16(acc[b][2 * u], one),
                                                 _mm256_madd_epi16(acc[b][2 * u + 1], w128)));
}

/* The lane sums of 8 vectors of 8 int32 (p[8 i + lane]) as one vector. */
static inline __m256i NP_NAME(np_i2_hsum8)(const int32_t *p) {
    __m256i h01 = _mm256_hadd_epi32(_mm256_loadu_si256((const __m256i *)p),
                                    _mm256_loadu_si256((const __m256i *)(p + 8)));
    __m256i h23 = _mm256_hadd_epi32(_mm256_loadu_si256((const __m256i *)(p + 16)),
                                    _mm256_loadu_si256((const __m256i *)(p + 24)));
    __m256i h45 = _mm256_hadd_epi32(_mm256_loadu_si256((const __m256i *)(p + 32)),
                                    _mm256_loadu_si256((const __m256i *)(p + 40)));
    __m256i h67 = _mm256_hadd_epi32(_mm256_loadu_si256((const __m256i *)(p + 48)),
                                    _mm256_loadu_si256((const __m256i *)(p + 56)));
    __m256i q0 = _mm256_hadd_epi32(h01, h23), q1 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                            _mm256_permute2x128_si256(q0, q1, 0x31));
}

/* D of 8 groups g..g+7 of one activation row from their unreduced functionals f[u][g][8]
 * (np_i2_dot, eight at a time: every operation is exact, so the order does not matter). */
static inline void NP_NAME(np_i2_dots8)(const int32_t *f, int64_t fstride, const int32_t *tot,
                                        const double *cb, double *dots) {
    __m256i fa = NP_NAME(np_i2_hsum8)(f), fb = NP_NAME(np_i2_hsum8)(f + fstride);
    __m256i s3 = NP_NAME(np_i2_hsum8)(f + 2 * fstride);
    __m256i s2 = _mm256_sub_epi32(fb, s3);
    __m256i s1 = _mm256_sub_epi32(fa, _mm256_add_epi32(_mm256_add_epi32(s2, s2),
                                                       _mm256_add_epi32(_mm256_add_epi32(s3, s3), s3)));
    __m256i s0 = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)tot),
                                  _mm256_add_epi32(_mm256_add_epi32(s1, s2), s3));
    const __m256i sj[4] = {s0, s1, s2, s3};
#ifdef NP_SIMD_AVX512
    __m512d d = _mm512_setzero_pd();
    for (int j = 0; j < 4; j++)
        d = _mm512_add_pd(d, _mm512_mul_pd(_mm512_cvtepi32_pd(sj[j]), _mm512_set1_pd(cb[j])));
    _mm512_storeu_pd(dots, d);
#else
    for (int half = 0; half < 2; half++) {
        __m256d d = _mm256_setzero_pd();
        for (int j = 0; j < 4; j++) {
            __m128i part = half ? _mm256_extracti128_si256(sj[j], 1) : _mm256_castsi256_si128(sj[j]);
            d = _mm256_add_pd(d, _mm256_mul_pd(_mm256_cvtepi32_pd(part), _mm256_set1_pd(cb[j])));
        }
        _mm256_storeu_pd(dots + 4 * half, d);
    }
#endif
}
#endif

#ifdef NP_SIMD_AVX512
/* Two groups (64 code bytes) against nb activation rows: vpdpbusd into 32-bit lanes, stored
 * unreduced like np_i2_group_avx2's (lanes 0-7 the first group, 8-15 the second). */
static inline __attribute__((always_inline)) void NP_NAME(np_i2_pair_avx512)(
    const uint8_t *bytes, const int8_t *L, const int8_t *H, int64_t act_bytes, const int nb,
    int32_t *f, int64_t fstride) {
    const __m512i c = _mm512_loadu_si512((const void *)bytes);
    const __m512i three = _mm512_set1_epi8(3);
    const __m512i tb = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0,
                                                            0, 0, 0, 0, 0));
    const __m512i tc = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                                            0, 0, 0, 0, 0));
    __m512i acc[NP_I2_RB][6];
    for (int b = 0; b < nb; b++)
        for (int u = 0; u < 6; u++) acc[b][u] = _mm512_setzero_si512();
    __m512i x = c;
    for (int s = 0; s < 4; s++) {
        __m512i a = _mm512_and_si512(x, three);
        __m512i mb = _mm512_shuffle_epi8(tb, a), mc = _mm512_shuffle_epi8(tc, a);
        x = _mm512_srli_epi16(x, 2);
        for (int b = 0; b < nb; b++) {
            __m512i l = _mm512_loadu_si512((const void *)(L + b * act_bytes + s * 64));
            __m512i h = _mm512_loadu_si512((const void *)(H + b * act_bytes + s * 64));
            acc[b][0] = _mm512_dpbusd_epi32(acc[b][0], a, l);
            acc[b][1] = _mm512_dpbusd_epi32(acc[b][1], a, h);
            acc[b][2] = _mm512_dpbusd_epi32(acc[b][2], mb, l);
            acc[b][3] = _mm512_dpbusd_epi32(acc[b][3], mb, h);
            acc[b][4] = _mm512_dpbusd_epi32(acc[b][4], mc, l);
            acc[b][5] = _mm512_dpbusd_epi32(acc[b][5], mc, h);
        }
    }
    for (int b = 0; b < nb; b++)
        for (int u = 0; u < 3; u++)
            _mm512_storeu_si512((void *)(f + (b * 3 + u) * fstride),
                                _mm512_add_epi32(acc[b][2 * u],
                                                 _mm512_slli_epi32(acc[b][2 * u + 1], 7)));
}
#endif

#ifdef NP_SIMD_AVX2
/* np_epilogue of 4 consecutive weight rows at once, one row per float64 lane: each lane runs
 * exactly the scalar epilogue's operations in its order, so the bits are the same. */
static inline void NP_NAME(np_i2_epilogue4)(const double *dots, int64_t dstride,
                                            const float *norms, int64_t groups, double s,
                                            float *out) {
    __m256d acc = _mm256_setzero_pd();
    for (int64_t g = 0; g < groups; g++) {
        __m256d nrm = _mm256_cvtps_pd(_mm_setr_ps(norms[g], norms[groups + g],
                                                  norms[2 * groups + g], norms[3 * groups + g]));
        __m256d d = _mm256_setr_pd(dots[g], dots[dstride + g], dots[2 * dstride + g],
                                   dots[3 * dstride + g]);
        acc = _mm256_add_pd(acc, _mm256_mul_pd(nrm, d));
    }
    __m256d y = _mm256_mul_pd(acc, _mm256_set1_pd(s));
    y = _mm256_mul_pd(y, _mm256_set1_pd(0.08838834764831845));
    _mm_storeu_ps(out, _mm256_cvtpd_ps(y));
}

/* The epilogue of one tile: `rows` (<= 4) weight rows from r4 against activation rows [0, nb),
 * the dots of weight row i and activation row b at dots[i * dstride + b * gstride]; a full
 * tile four rows a vector, a short one a row at a time (the same bits either way). Shared by
 * the level-sum (np_i2_rows) and the digit (np_d16_rows) kernels. */
static inline void NP_NAME(np_tile_epilogue)(const np_cq_part *part, int64_t groups, int64_t r4,
                                             int rows, int nb, const double *dots,
                                             int64_t dstride, int64_t gstride, const double *s,
                                             float *out, int64_t out_stride) {
    const float *norms = part->norms + r4 * groups;
    for (int b = 0; b < nb; b++) {
        float *o = out + b * out_stride + part->out_col + r4;
        if (rows == 4)
            NP_NAME(np_i2_epilogue4)(dots + b * gstride, dstride, norms, groups, s[b], o);
        else
            for (int i = 0; i < rows; i++)
                o[i] = NP_NAME(np_epilogue)(dots + i * dstride + b * gstride,
                                            norms + i * groups, groups, s[b]);
    }
}
#endif

/* All groups of weight rows [r0, r1) of `part` against activation rows [0, nb) of the tile.
 * SIMD: per row, the functionals' unreduced lanes of every group go to fbuf [nb][3][g8][8]
 * (g8 = groups rounded up to 8, the padding zero), 8 groups at a time are reduced into
 * dots [4 rows][nb][g8], and the epilogue runs 4 rows at a time. */
static inline __attribute__((always_inline)) void NP_NAME(np_i2_rows)(
    const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1, const int8_t *lo,
    const int8_t *hi, const int32_t *tot, int64_t act_bytes, const int nb, const double *cb,
    const double *s, float *out, int64_t out_stride, double *dots, int32_t *fbuf) {
    int64_t g8 = (groups + 7) & ~(int64_t)7;
#ifdef NP_SIMD_AVX2
    int64_t fstride = g8 * 8, dstride = NP_I2_RB * g8;
    for (int64_t r4 = r0; r4 < r1; r4 += 4) {
        int rows = (int)(r1 - r4 < 4 ? r1 - r4 : 4);
        for (int i = 0; i < rows; i++) {
            const uint8_t *p = part->packed + (r4 + i) * part->row_bytes;
            int64_t g = 0;
#ifdef NP_SIMD_AVX512
            for (; g + 2 <= groups; g += 2)
                NP_NAME(np_i2_pair_avx512)(p + g * 32, lo + (g >> 1) * 256,
                                           hi + (g >> 1) * 256, act_bytes, nb, fbuf + g * 8,
                                           fstride);
#endif
            for (; g < groups; g++) {
                int64_t at = (g >> 1) * 256 + (g & 1) * 32;
                NP_NAME(np_i2_group_avx2)(p + g * 32, lo + at, hi + at, act_bytes, nb,
                                          fbuf + g * 8, fstride);
            }
            for (int b = 0; b < nb; b++)
                for (g = 0; g < groups; g += 8)
                    NP_NAME(np_i2_dots8)(fbuf + b * 3 * fstride + g * 8, fstride,
                                         tot + b * g8 + g, cb, dots + i * dstride + b * g8 + g);
        }
        NP_NAME(np_tile_epilogue)(part, groups, r4, rows, nb, dots, dstride, g8, s, out,
                                  out_stride);
    }
#endif
}

/* np_cq_matmul for 2-bit storage and at most 4 levels, in integers. NP_BADARG (nothing
 * written) when v is outside the range of the byte split: the caller then runs the float64
 * kernel, which is exact for any int32 v. */
static int NP_NAME(np_cq_int2)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                               const double *cb, const np_cq_part *parts, int64_t n_parts,
                               float *out, int64_t out_stride, int64_t r_first,
                               int64_t r_last) {
    int64_t groups = in_pad / 128, g8 = (groups + 7) & ~(int64_t)7;
    int64_t act_bytes = ((groups + 1) >> 1) * 256;
    int8_t *lo = (int8_t *)malloc((size_t)(2 * T * act_bytes + 64));
    int32_t *tot = (int32_t *)calloc((size_t)(T * g8), sizeof(int32_t));
    double *dots = (double *)malloc(sizeof(double) * (size_t)(4 * NP_I2_RB * g8));
    int32_t *fbuf = (int32_t *)calloc((size_t)(NP_I2_RB * 3 * g8 * 8), sizeof(int32_t));
    if (!lo || !tot || !dots || !fbuf) {
        free(lo);
        free(tot);
        free(dots);
        free(fbuf);
        return NP_NOMEM;
    }
    int8_t *hi = lo + T * act_bytes;
    int status = NP_NAME(np_int_prepare)(v, T, in_pad, 4, lo, hi, tot, act_bytes);
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += NP_I2_RB) {
        int nb = (int)(T - t0 < NP_I2_RB ? T - t0 : NP_I2_RB);
        double s[NP_I2_RB] = {0};
        for (int b = 0; b < nb; b++) s[b] = (double)scale[t0 + b];
        const int8_t *L = lo + t0 * act_bytes, *H = hi + t0 * act_bytes;
        const int32_t *tt = tot + t0 * g8;
        float *o = out + t0 * out_stride;
        int64_t base = 0;
        for (int64_t p = 0; p < n_parts; p++) {
            int64_t a = r_first > base ? r_first - base : 0;
            int64_t z = r_last - base < parts[p].rows ? r_last - base : parts[p].rows;
            if (a < z) {
                switch (nb) {
#if NP_I2_RB >= 2
                case 2: NP_NAME(np_i2_rows)(&parts[p], groups, a, z, L, H, tt, act_bytes, 2, cb, s, o, out_stride, dots, fbuf); break;
#endif
                default: NP_NAME(np_i2_rows)(&parts[p], groups, a, z, L, H, tt, act_bytes, 1, cb, s, o, out_stride, dots, fbuf); break;
                }
            }
            base += parts[p].rows;
        }
    }
    free(lo);
    free(tot);
    free(dots);
    free(fbuf);
    return status;
}
#undef NP_I2_RB
#endif /* NP_SIMD_AVX2 */

#include "np_cq_int16.h"
#include "np_cq_int4.h"
#include "np_cq_lut.h"
#include "np_cq_had.h"
#include "np_cq_had2.h"

/* 1 when every part carries the copy of its layout (2-bit: np_cq_lut.h np_lut_split; 4-bit:
 * np_cq_int4.h np_cq_blk4). */
static inline int NP_NAME(np_cq_all_interleaved)(const np_cq_part *parts, int64_t n_parts) {
    for (int64_t p = 0; p < n_parts; p++)
        if (!parts[p].interleaved) return 0;
    return n_parts > 0;
}

/* The integer kernels' entry (np_cq.h np_cq_matmul), the one place that picks a 2-bit kernel:
 * NP_BADARG when none covers this product (storage width, codebook, variant or v range), and
 * the float64 kernel runs. All integer kernels give the float64 kernel's bits, so the pick
 * changes no output; it follows the per-row cost curve measured in one process
 * (bench/needlepoint_bench/products_curve.py, docs/benchmarks.md). The table-lookup kernel
 * (np_cq_lut.h): on AVX2 at every row count when the parts carry the interleaved codes (no
 * per-call transpose), else from NP_LUT_TMIN rows; on AVX-512 VNNI up to NP_LUT_TMAX_IL_VNNI
 * rows with the interleaved codes (two 16-row blocks per zmm register), where vpdpbusd level
 * sums cost more than the lookups, and from NP_LUT_TMIN_VNNI rows. Otherwise the
 * level-sum kernel above for decode rows (T <= NP_I2_TMAX: fewer operations per weight for one
 * row) and the 16-bit digit kernel (np_cq_int16.h) for 4-bit storage and for prefill tiles
 * (two 16-bit products per weight instead of six byte products). Before all of these, on
 * AVX-512 VNNI from NP_HAD_TMIN_VNNI rows (NP_HAD_TMIN_PACKED_VNNI without the interleaved
 * copy): the transform on the weights (np_cq_had.h, three vpdpbusd byte products per weight
 * against the int8 q recovered from v), which hands back to the picks above when v is not the
 * Walsh-Hadamard image of int8 codes; on AVX2 from NP_HAD2_TMIN_AVX2 rows
 * (NP_HAD2_TMIN_PACKED_AVX2 without the copy) its AVX2 form (np_cq_had2.h, vpmaddubsw on
 * halved planes, q in [-127, 127]), which hands back the same way. 4-bit storage on AVX-512
 * VNNI (np_cq_int4.h): the blocked kernel at every row count when the parts carry the 16-row
 * blocks (no reduction across lanes: about 1.5x the digit kernel at 1 to 64 rows in one
 * process), else the word-lookup kernel up to NP_P4_TMAX rows; AVX2 has no vpermw and keeps
 * the digit kernel. */
static int NP_NAME(np_cq_int)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                              int storage_bits, const float *codebook, int64_t codebook_len,
                              const double *cb, const np_cq_part *parts, int64_t n_parts,
                              float *out, int64_t out_stride, int64_t r_first, int64_t r_last) {
#ifdef NP_SIMD_AVX2
    const int il = NP_NAME(np_cq_all_interleaved)(parts, n_parts);
    /* pick 3 (the transform on the weights) where it does not apply: the default pick */
    const int pick = np_cq_kernel_pick == 3 ? 0 : np_cq_kernel_pick;
#ifdef NP_SIMD_AVX512
    if (storage_bits == 2 && codebook_len <= 4 &&
        (np_cq_kernel_pick == 3 ||
         (np_cq_kernel_pick == 0 && T >= (il ? NP_HAD_TMIN_VNNI : NP_HAD_TMIN_PACKED_VNNI)))) {
        int status = NP_NAME(np_cq_had2)(v, scale, T, in_pad, cb, parts, n_parts, out,
                                         out_stride, r_first, r_last);
        if (status != NP_BADARG) return status; /* else v is not H q: the kernels below */
    }
    const int by_rows = (T <= NP_LUT_TMAX_IL_VNNI && il) || T >= NP_LUT_TMIN_VNNI;
#else
    if (storage_bits == 2 && codebook_len <= 4 &&
        (np_cq_kernel_pick == 3 ||
         (np_cq_kernel_pick == 0 && T >= (il ? NP_HAD2_TMIN_AVX2 : NP_HAD2_TMIN_PACKED_AVX2)))) {
        int status = NP_NAME(np_cq_had2)(v, scale, T, in_pad, cb, parts, n_parts, out,
                                         out_stride, r_first, r_last);
        if (status != NP_BADARG) return status; /* else v is not H q: the kernels below */
    }
    const int by_rows = T >= NP_LUT_TMIN || il;
#endif
    const int lookup = pick == 2 || pick == 5 || (pick == 0 && by_rows);
    if (storage_bits == 2 && codebook_len <= 4 && lookup)
        return NP_NAME(np_cq_lut2)(v, scale, T, in_pad, cb, parts, n_parts, out, out_stride,
                                   r_first, r_last);
    if (storage_bits == 2 && codebook_len <= 4 && T <= NP_I2_TMAX)
        return NP_NAME(np_cq_int2)(v, scale, T, in_pad, cb, parts, n_parts, out, out_stride,
                                   r_first, r_last);
#ifdef NP_SIMD_AVX512
    if (storage_bits == 4 && codebook_len <= 16 && np_cq_kernel_pick != 1 && il)
        return NP_NAME(np_cq_blk4)(v, scale, T, in_pad, codebook, codebook_len, parts, n_parts,
                                   out, out_stride, r_first, r_last);
    if (storage_bits == 4 && codebook_len <= 16 && np_cq_kernel_pick != 1 && T <= NP_P4_TMAX)
        return NP_NAME(np_cq_perm4)(v, scale, T, in_pad, codebook, codebook_len, parts, n_parts,
                                    out, out_stride, r_first, r_last);
#endif
    if ((storage_bits == 2 && codebook_len <= 4) || (storage_bits == 4 && codebook_len <= 16))
        return NP_NAME(np_cq_int16)(v, scale, T, in_pad, storage_bits, codebook, codebook_len,
                                    parts, n_parts, out, out_stride, r_first, r_last);
#endif
    (void)v, (void)scale, (void)T, (void)in_pad, (void)storage_bits, (void)codebook;
    (void)codebook_len, (void)cb, (void)parts, (void)n_parts, (void)out, (void)out_stride;
    (void)r_first, (void)r_last;
    return NP_BADARG;
}
#ifdef NP_SIMD_AVX2
#undef NP_I2_TMAX
#endif
#ifdef NP_SIMD_AVX512
#undef NP_P4_TMAX
#endif
