/* Exact CQ x A8 products of 2-bit storage for prefill tiles with the Walsh-Hadamard transform
 * moved onto the weights, AVX-512 VNNI (the AVX2 form: np_cq_had2.h), included by np_cq_int.h
 * after np_cq_lut.h.
 * docs/numerics.md "Exact CQ x A8 products" is the contract, kernels/exact.py
 * `cq_matmul_reference` the numpy reference with the same bits.
 *
 * The level sums S_j come from the bit planes of the codes as in np_cq_lut.h: with
 * b0 = idx & 1, b1 = idx >> 1, b01 = b0 & b1 and P_x = sum_c x_c v_c,
 *   S3 = P01, S2 = P1 - P01, S1 = P0 - P01, S0 = tot - P0 - P1 + P01.
 * An A8 activation group is v = H q (docs/numerics.md step 1), H the unnormalised Sylvester
 * Walsh-Hadamard matrix of order 128 (symmetric, H H = 128 I) and q int8 codes, so
 *   P_x = x . (H q) = (H x) . q.
 * For a 0/1 plane x, (H x)_0 = sum x in [0, 128] and (H x)_k in [-64, 64] for k > 0 (a row
 * k > 0 of H has 64 entries +1 and 64 entries -1), so u = H x + 64 (every entry) lies in
 * [0, 192], a u8, and P_x = sum_k u_k q_k - 64 sum_k q_k with sum_k q_k = v_0 (row 0 of H is all
 * ones): one u8 x s8 product per weight and plane (vpdpbusd), three per weight instead of the
 * six of the byte split of v (np_cq_int.h). |sum_k u_k q_k| <= 128 * 192 * 128 < 2^22, exact in
 * the int32 lanes; S_j, D = sum_j cb[j] S_j and the epilogue (np_had_epilogue: np_epilogue's
 * operations in its order, 16 rows a vector) are then the values and bits of the other
 * integer kernels.
 *
 * q is recovered exactly per call: q = H v / 128, checked (every entry of H v a multiple of
 * 128 and q in [-128, 127], v in [-2^14, 2^14) so that nothing wraps); any other v returns
 * NP_BADARG and np_cq_int runs another kernel. When H v = 128 q' exactly, 128 v = H H v =
 * 128 H q', so v = H q' and the identity above holds for any such v.
 *
 * u is built per call for every 16 weight rows and group and reused by every activation row
 * of the tile, so the kernel pays from a few rows (np_cq_int picks it by measurement). Its
 * layout is vpdpbusd's: register (k4, x) holds, in 32-bit lane i, u_{4 k4 + j} (j = 0..3, byte
 * j) of plane x of weight row i, against a broadcast dword of q (columns 4 k4 .. 4 k4 + 3).
 * H = H_32 (x) H_4 over k = 4 k4 + j: the H_4 of a quad of columns is a lookup of its plane
 * nibble (vpermd of a 16-dword table: byte j = sum_s (-1)^popcount(j & s) bit s), then five
 * butterfly stages over the 32 quads add and subtract whole registers bytewise. Bytes wrap
 * modulo 256, and every final u is in [0, 192], so the wrapped bytes are the exact values.
 * The plane nibbles come from the interleaved copy (np_cq_part.interleaved, np_cq_lut.h: per
 * 16-row block and group, byte i of lane L of register o is row i's code byte 16 L + rev4(o)
 * as b0 | b1 << 4) or, without it, from the packed codes transposed in registers per call
 * (np_cq_lut.h np_lut_planes, whose registers the copy holds). */

#ifndef NP_HAD_ONCE
#define NP_HAD_ONCE
#define NP_HAD_TB 8   /* activation rows per register tile (8 x 3 accumulators + 3 planes) */
#define NP_HAD_SUB 64 /* activation rows per pass over the weights (bounds the dots buffer) */
/* Activation rows from which np_cq_int picks this kernel on AVX-512 VNNI, with the interleaved
 * copy and without it (the codes transposed per call), measured in one process against the
 * default pick before it (bench/needlepoint_bench/products_curve.py): with the copy even at 3
 * rows, 1.2x faster at 4, 2.2-2.4x from 16; without it slower at 4 rows, faster from 5;
 * slower at 1-2 rows, where too few activation rows share the transform of the planes. */
#define NP_HAD_TMIN_VNNI 4
#define NP_HAD_TMIN_PACKED_VNNI 5
#endif

#if defined(NP_SIMD_AVX512)
/* One within-register butterfly stage of 16 int32 lanes: partner lane at distance h. */
#define NP_HAD_BFLY(x, y, mask) _mm512_mask_sub_epi32(_mm512_add_epi32(x, y), mask, y, x)

/* Per activation row t and group g: q = H v / 128 as int8 at q8[t * in_pad + g * 128 + k],
 * v0[t * groups + g] = v_0 (= sum_k q_k) and tot[...] = sum_c v_c (= (H v)_0). NP_BADARG
 * when some v is outside [-2^14, 2^14) or H v is not 128 times an int8 vector. */
static int NP_NAME(np_had_acts)(const int32_t *v, int64_t T, int64_t in_pad, int8_t *q8,
                                int32_t *v0, int32_t *tot) {
    int64_t groups = in_pad / 128;
    __m512i bad = _mm512_setzero_si512();
    const __m512i lo14 = _mm512_set1_epi32(-16384), hi14 = _mm512_set1_epi32(16383);
    const __m512i loq = _mm512_set1_epi32(-128 * 128), hiq = _mm512_set1_epi32(127 * 128);
    const __m512i low7 = _mm512_set1_epi32(127);
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            __m512i r[8];
            for (int i = 0; i < 8; i++) {
                r[i] = _mm512_loadu_si512((const void *)(x + 16 * i));
                bad = _mm512_or_si512(bad, _mm512_movm_epi32(
                          _mm512_cmplt_epi32_mask(r[i], lo14) | _mm512_cmpgt_epi32_mask(r[i], hi14)));
            }
            for (int i = 0; i < 8; i++) { /* lanes at distance 1, 2, 4, 8 */
                r[i] = NP_HAD_BFLY(r[i], _mm512_shuffle_epi32(r[i], _MM_PERM_CDAB), 0xAAAA);
                r[i] = NP_HAD_BFLY(r[i], _mm512_shuffle_epi32(r[i], _MM_PERM_BADC), 0xCCCC);
                r[i] = NP_HAD_BFLY(r[i], _mm512_shuffle_i64x2(r[i], r[i], _MM_SHUFFLE(2, 3, 0, 1)),
                                   0xF0F0);
                r[i] = NP_HAD_BFLY(r[i], _mm512_shuffle_i64x2(r[i], r[i], _MM_SHUFFLE(1, 0, 3, 2)),
                                   0xFF00);
            }
            for (int h = 1; h < 8; h <<= 1) /* registers at distance 1, 2, 4 (lanes 16, 32, 64) */
                for (int i = 0; i < 8; i++)
                    if (!(i & h)) {
                        __m512i a = r[i], b = r[i + h];
                        r[i] = _mm512_add_epi32(a, b);
                        r[i + h] = _mm512_sub_epi32(a, b);
                    }
            int8_t *out = q8 + t * in_pad + g * 128;
            for (int i = 0; i < 8; i++) {
                __mmask16 off = _mm512_test_epi32_mask(r[i], low7) |
                                _mm512_cmplt_epi32_mask(r[i], loq) |
                                _mm512_cmpgt_epi32_mask(r[i], hiq);
                bad = _mm512_or_si512(bad, _mm512_movm_epi32(off));
                _mm_storeu_si128((__m128i *)(out + 16 * i),
                                 _mm512_cvtepi32_epi8(_mm512_srai_epi32(r[i], 7)));
            }
            v0[t * groups + g] = x[0];
            tot[t * groups + g] = _mm_cvtsi128_si32(_mm512_castsi512_si128(r[0]));
        }
    return _mm512_test_epi32_mask(bad, bad) ? NP_BADARG : NP_OK;
}

/* The transformed planes of one 16-row block and group: u[k4 * 3 + x] (see the header) from
 * the block's plane-nibble bytes nib (NP_LUT_BLOCK bytes in the interleaved order). lut: byte
 * j of dword n = sum_s (-1)^popcount(j & s) bit s of n (H_4 of a nibble, as bytes). The 32
 * quads go as two halves of 16 registers (H_32 = H_2 (x) H_16): the stages within a half in
 * registers, the last one as the halves are stored. */
static __attribute__((noinline)) void NP_NAME(np_had_planes)(const uint8_t *nib, __m512i lut,
                                                              __m512i *u) {
    static const uint8_t rev4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    const __m512i off = _mm512_set1_epi8(64);
#pragma GCC unroll 3
    for (int x = 0; x < 3; x++) {
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m512i y[16];
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) { /* rows' nibble bytes of quad 16 half + c */
                __m512i n = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(nib + rev4[c] * 32 + 16 * half)));
                /* vpermd reads the low 4 bits of each index: b0 = n, b1 = n >> 4 (n < 256) */
                __m512i p = x == 0 ? n : _mm512_srli_epi32(n, 4);
                if (x == 2) p = _mm512_and_si512(p, n);
                y[c] = _mm512_permutexvar_epi32(p, lut);
            }
            /* + 64 on every u: H (64 e_0) = 64 (all ones), added before the butterflies */
            if (half == 0) y[0] = _mm512_add_epi8(y[0], off);
#pragma GCC unroll 4
            for (int h = 1; h < 16; h <<= 1)
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    if (!(i & h)) {
                        __m512i a = y[i], b = y[i + h];
                        y[i] = _mm512_add_epi8(a, b);
                        y[i + h] = _mm512_sub_epi8(a, b);
                    }
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++) {
                __m512i *lo = u + k * 3 + x, *hi = u + (k + 16) * 3 + x;
                if (half == 0) {
                    _mm512_store_si512((void *)lo, y[k]);
                } else {
                    __m512i a = _mm512_load_si512((const void *)lo);
                    _mm512_store_si512((void *)lo, _mm512_add_epi8(a, y[k]));
                    _mm512_store_si512((void *)hi, _mm512_sub_epi8(a, y[k]));
                }
            }
        }
    }
}

/* D of 16 weight rows (lanes) of one group and activation row from their accumulated
 * sum_k u_k q_k of the three planes: P_x, the S_j and D = sum_j cb[j] S_j (exact in any order),
 * stored at o[0..15]. corr = 64 v_0 = 64 sum_k q_k. */
static inline void NP_NAME(np_had_dots)(__m512i r0, __m512i r1, __m512i r01, int32_t corr,
                                        int32_t total, const double *cb, double *o) {
    const __m512i c = _mm512_set1_epi32(corr);
    __m512i p0 = _mm512_sub_epi32(r0, c), p1 = _mm512_sub_epi32(r1, c);
    __m512i p01 = _mm512_sub_epi32(r01, c);
    __m512i s1 = _mm512_sub_epi32(p0, p01), s2 = _mm512_sub_epi32(p1, p01);
    __m512i s0 = _mm512_sub_epi32(_mm512_add_epi32(_mm512_set1_epi32(total), p01),
                                  _mm512_add_epi32(p0, p1));
    const __m512i sj[4] = {s0, s1, s2, p01};
    for (int half = 0; half < 2; half++) { /* every product and partial sum exact: FMA too */
        __m512d acc = _mm512_setzero_pd();
        for (int j = 0; j < 4; j++) {
            __m256i part = half ? _mm512_extracti64x4_epi64(sj[j], 1) : _mm512_castsi512_si256(sj[j]);
            acc = _mm512_fmadd_pd(_mm512_cvtepi32_pd(part), _mm512_set1_pd(cb[j]), acc);
        }
        _mm512_store_pd(o + 8 * half, acc);
    }
}

/* np_epilogue of the 16 rows of a block at once, one row per float64 lane, for activation
 * rows [0, nb): each lane runs the scalar epilogue's operations in its order (acc = 0, then
 * acc + norm_g D_g for g ascending, times s, times 2^-3.5, to float), so the bits are the
 * same. dots[(t * groups + g) * 16 + i], nt[g * 16 + i] = norm of row i, group g (float64);
 * rows past `rows` are not written. */
static void NP_NAME(np_had_epilogue)(const double *dots, const double *nt, int64_t groups,
                                     int64_t nb, int rows, const double *s, float *out,
                                     int64_t out_stride) {
    const __mmask8 mlo = (__mmask8)(rows >= 8 ? 0xFF : (1u << rows) - 1);
    const __mmask8 mhi = (__mmask8)(rows >= 16 ? 0xFF : rows <= 8 ? 0 : (1u << (rows - 8)) - 1);
    for (int64_t t = 0; t < nb; t++) {
        const double *d = dots + t * groups * 16;
        __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
        for (int64_t g = 0; g < groups; g++) {
            lo = _mm512_add_pd(lo, _mm512_mul_pd(_mm512_load_pd(nt + g * 16),
                                                 _mm512_load_pd(d + g * 16)));
            hi = _mm512_add_pd(hi, _mm512_mul_pd(_mm512_load_pd(nt + g * 16 + 8),
                                                 _mm512_load_pd(d + g * 16 + 8)));
        }
        const __m512d st = _mm512_set1_pd(s[t]), k = _mm512_set1_pd(0.08838834764831845);
        lo = _mm512_mul_pd(_mm512_mul_pd(lo, st), k);
        hi = _mm512_mul_pd(_mm512_mul_pd(hi, st), k);
        float *o = out + t * out_stride;
        _mm256_mask_storeu_ps(o, mlo, _mm512_cvtpd_ps(lo));
        _mm256_mask_storeu_ps(o + 8, mhi, _mm512_cvtpd_ps(hi));
    }
}

/* D of 16 weight rows (one block, group g) for NB activation rows [b0, b0 + NB) (NB = 8, 4,
 * 2, 1, each a function of its own with its accumulators in named variables, so that they
 * stay in the 32 vector registers): vpdpbusd of the block's planes u against broadcast dwords
 * of q, then np_had_dots into dots[((b0 + b) * groups + g) * 16]. */
/* acc += u8 w x s8 q in place (vpdpbusd): the intrinsic's register allocation in GCC copies
 * each accumulator out and back and keeps a stack copy every iteration */
#define NP_HAD_VPDPBUSD(acc, w, q) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(q))
#define NP_HAD_TILE_N(NB)                                                                      \
    static __attribute__((noinline)) void NP_NAME(np_had_tile##NB)(                            \
        const __m512i *u, const int8_t *q8, int64_t in_pad, const int32_t *v0,                \
        const int32_t *tot, int64_t groups, int64_t g, int64_t b0, const double *cb,          \
        double *dots) {                                                                       \
        const int nb = NB;                                                                    \
        const __m512i z = _mm512_setzero_si512();                                             \
        __m512i a00 = z, a01 = z, a02 = z, a10 = z, a11 = z, a12 = z, a20 = z, a21 = z;       \
        __m512i a22 = z, a30 = z, a31 = z, a32 = z, a40 = z, a41 = z, a42 = z, a50 = z;       \
        __m512i a51 = z, a52 = z, a60 = z, a61 = z, a62 = z, a70 = z, a71 = z, a72 = z;       \
        const int8_t *q = q8 + b0 * in_pad + g * 128;                                         \
        for (int k4 = 0; k4 < 32; k4++) {                                                     \
            const __m512i w0 = _mm512_load_si512((const void *)(u + k4 * 3));                 \
            const __m512i w1 = _mm512_load_si512((const void *)(u + k4 * 3 + 1));             \
            const __m512i w2 = _mm512_load_si512((const void *)(u + k4 * 3 + 2));             \
            NP_HAD_DP(0) NP_HAD_DP(1) NP_HAD_DP(2) NP_HAD_DP(3)                               \
            NP_HAD_DP(4) NP_HAD_DP(5) NP_HAD_DP(6) NP_HAD_DP(7)                               \
        }                                                                                     \
        NP_HAD_OUT(0) NP_HAD_OUT(1) NP_HAD_OUT(2) NP_HAD_OUT(3)                               \
        NP_HAD_OUT(4) NP_HAD_OUT(5) NP_HAD_OUT(6) NP_HAD_OUT(7)                               \
    }
#define NP_HAD_DP(b)                                                                           \
    if (b < nb) {                                                                              \
        int32_t d;                                                                             \
        memcpy(&d, q + b * in_pad + 4 * k4, 4);                                                \
        const __m512i qb = _mm512_set1_epi32(d);                                               \
        NP_HAD_VPDPBUSD(a##b##0, w0, qb);                                                      \
        NP_HAD_VPDPBUSD(a##b##1, w1, qb);                                                      \
        NP_HAD_VPDPBUSD(a##b##2, w2, qb);                                                      \
    }
#define NP_HAD_OUT(b)                                                                          \
    if (b < nb) {                                                                              \
        int64_t at = (b0 + b) * groups + g;                                                    \
        NP_NAME(np_had_dots)(a##b##0, a##b##1, a##b##2, 64 * v0[at], tot[at], cb,            \
                             dots + at * 16);                                                  \
    }
NP_HAD_TILE_N(8)
NP_HAD_TILE_N(4)
NP_HAD_TILE_N(2)
NP_HAD_TILE_N(1)
#undef NP_HAD_TILE_N
#undef NP_HAD_VPDPBUSD
#undef NP_HAD_DP
#undef NP_HAD_OUT

/* np_cq_matmul for 2-bit storage and at most 4 levels by the transform on the weights.
 * NP_BADARG (nothing written) when v is not 128-group Walsh-Hadamard images of int8 vectors
 * within [-2^14, 2^14) (np_had_acts): np_cq_int then runs another kernel. */
static int NP_NAME(np_cq_had2)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                               const double *cb, const np_cq_part *parts, int64_t n_parts,
                               float *out, int64_t out_stride, int64_t r_first, int64_t r_last) {
    int64_t groups = in_pad / 128;
    int64_t sub = T < NP_HAD_SUB ? T : NP_HAD_SUB;
    int8_t *q8 = (int8_t *)malloc((size_t)(T * in_pad + 64));
    int32_t *v0 = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T * groups + 1));
    int32_t *tot = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T * groups + 1));
    __m512i *u = (__m512i *)aligned_alloc(64, sizeof(__m512i) * 96);
    double *dots = (double *)aligned_alloc(64, sizeof(double) * (size_t)(16 * sub * groups + 8));
    double *nt = (double *)aligned_alloc(64, sizeof(double) * (size_t)(16 * groups + 8));
    double *sc = (double *)malloc(sizeof(double) * (size_t)(T + 1));
    __m256i *lp = (__m256i *)aligned_alloc(32, sizeof(__m256i) * (size_t)(groups * 48 + 1));
    if (!q8 || !v0 || !tot || !u || !dots || !nt || !sc || !lp) {
        free(q8), free(v0), free(tot), free(u), free(dots), free(nt), free(sc), free(lp);
        return NP_NOMEM;
    }
    int status = NP_NAME(np_had_acts)(v, T, in_pad, q8, v0, tot);
    for (int64_t t = 0; t < T; t++) sc[t] = (double)scale[t];
    int32_t lut32[16];
    for (int n = 0; n < 16; n++) {
        uint32_t word = 0;
        for (int j = 0; j < 4; j++) {
            int y = 0;
            for (int s = 0; s < 4; s++)
                if (n >> s & 1) y += __builtin_popcount((unsigned)(j & s)) & 1 ? -1 : 1;
            word |= (uint32_t)(uint8_t)y << (8 * j);
        }
        lut32[n] = (int32_t)word;
    }
    const __m512i lut = _mm512_loadu_si512((const void *)lut32);
    uint8_t own[NP_LUT_BLOCK] __attribute__((aligned(64)));
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += sub) {
        int64_t nb = T - t0 < sub ? T - t0 : sub;
        int64_t base = 0;
        for (int64_t pi = 0; pi < n_parts; pi++) {
            const np_cq_part *part = &parts[pi];
            int64_t a = r_first > base ? r_first - base : 0;
            int64_t z = r_last - base < part->rows ? r_last - base : part->rows;
            base += part->rows;
            for (int64_t r16 = a, end; r16 < z; r16 = end) {
                end = (r16 | 15) + 1; /* blocks end at multiples of 16: the interleaved ones */
                if (end > z) end = z;
                int rows = (int)(end - r16);
                const uint8_t *il = part->interleaved && !(r16 & 15)
                                        ? part->interleaved + r16 * part->row_bytes : NULL;
                if (!il) /* without the copy: the lookup kernel's in-register transpose */
                    NP_NAME(np_lut_planes)(part->packed + r16 * part->row_bytes, part->row_bytes,
                                           rows, groups, NULL, lp);
                for (int64_t g = 0; g < groups; g++) {
                    const uint8_t *nib = il ? il + g * NP_LUT_BLOCK : own;
                    if (!il) /* the transposed planes b0, b1 as the copy's b0 | b1 << 4 */
                        for (int o = 0; o < 16; o++) {
                            const __m256i *pl = lp + (g * 16 + o) * 3;
                            _mm256_store_si256((__m256i *)(own + o * 32),
                                               _mm256_or_si256(pl[0], _mm256_slli_epi16(pl[1], 4)));
                        }
                    NP_NAME(np_had_planes)(nib, lut, u);
                    for (int64_t b = 0; b < nb;) {
                        int64_t left = nb - b;
                        const int8_t *q = q8 + t0 * in_pad;
                        const int32_t *w0 = v0 + t0 * groups, *tt = tot + t0 * groups;
                        if (left >= 8) {
                            NP_NAME(np_had_tile8)(u, q, in_pad, w0, tt, groups, g, b, cb, dots);
                            b += 8;
                        } else if (left >= 4) {
                            NP_NAME(np_had_tile4)(u, q, in_pad, w0, tt, groups, g, b, cb, dots);
                            b += 4;
                        } else if (left >= 2) {
                            NP_NAME(np_had_tile2)(u, q, in_pad, w0, tt, groups, g, b, cb, dots);
                            b += 2;
                        } else {
                            NP_NAME(np_had_tile1)(u, q, in_pad, w0, tt, groups, g, b, cb, dots);
                            b += 1;
                        }
                    }
                }
                for (int64_t g = 0; g < groups; g++)
                    for (int i = 0; i < 16; i++)
                        nt[g * 16 + i] = i < rows ? (double)part->norms[(r16 + i) * groups + g] : 0.0;
                NP_NAME(np_had_epilogue)(dots, nt, groups, nb, rows, sc + t0,
                                         out + t0 * out_stride + part->out_col + r16, out_stride);
            }
        }
    }
    free(q8), free(v0), free(tot), free(u), free(dots), free(nt), free(sc), free(lp);
    return status;
}
#undef NP_HAD_BFLY
#endif /* NP_SIMD_AVX512 */
