/* Exact CQ x A8 products of 2-bit storage by table lookups (T-MAC style),
 * AVX2 (also compiled into the AVX-512 variant), included by np_cq_int.h once per variant.
 * docs/numerics.md "Exact CQ x A8 products" is the contract, kernels/exact.py
 * `cq_matmul_reference` the numpy reference with the same bits.
 *
 * The level sums S_j = sum_{c: idx_c = j} v_c (np_cq_int.h) come from three bit planes of the
 * codes, b0 = idx & 1, b1 = idx >> 1, b01 = b0 & b1: with P_x = sum_c x_c v_c,
 *   S3 = P01, S2 = P1 - P01, S1 = P0 - P01, S0 = tot - P0 - P1 + P01.
 * Each v in [-2^14, 2^14) is cut into balanced base-16 digits, v = d0 + 16 d1 + 256 d2 +
 * 4096 d3 with d0..d2 in [-8, 7] and d3 in [-4, 4] (checked over the whole range in
 * tests/kernels/test_cq_lut.py), so P_x = sum_p 16^p sum_c x_c d_p(v_c). Per activation row,
 * group, quad of columns 4k..4k+3 and digit p, a 16-byte table holds the subset sums
 * e[n] = sum_{s: bit s of n} d_p(v_{4k+s}) (in [-32, 28], d3's in [-16, 16]); vpshufb looks up
 * 32 of them at once by the 4-bit plane nibbles of 16 weight rows (two quads per register).
 * Four looked-up quads summed in int8 stay in [-128, 112]; vpmaddubsw with 0/1/16 constants
 * widens the even / odd rows to int16 while combining digit pairs, A = sum d0 + 16 sum d1 and
 * B = sum d2 + 16 sum d3 over a group (|A| <= 32 * 32 * 17 = 17408, |B| <= 1024 + 16 * 512),
 * and P_x = A + 256 B in int32 (vpmaddwd, |P| <= 2^21). Every integer step is exact, so S_j and
 * D = sum_j cb[j] S_j are the values np_cq_int.h computes, the epilogue is np_tile_epilogue, and
 * the bits are the float64 reference's.
 *
 * Weights: 16 rows' 32-byte code groups are transposed in registers (4 unpack stages per
 * 128-bit lane) so that register o holds byte k = rev4(o) of every row in lane 0 and byte 16 + k
 * in lane 1 (a packed byte holds columns 4k..4k+3), and two vpshufb per plane turn each byte's
 * four 2-bit codes into a plane nibble. That work is done once per 16 weight rows and group and
 * serves every activation row of the tile; the lookups per weight and activation row are 12 / 16
 * of a vpshufb and about as many adds.
 *
 * Interleaved codes (np_cq_part.interleaved, built once at load by kernels/exact.py
 * interleave_codes): the same bytes regrouped so that each 32-byte register of a 16-row block
 * and group is what the transpose above yields, with each code byte replaced by its plane
 * nibbles b0 | b1 << 4 (bit s of b0 / b1: bit 0 / 1 of the byte's code s). np_lut_split turns a
 * register into the three plane registers with three ands and a shift, so a one-row product
 * (np_lut_group1) costs the lookups alone, one pass over the weights.
 *
 * AVX-512 (np_lut_group2, with the copy, where two full 16-row blocks lie in the row range):
 * two blocks per zmm register, block A's register o in the low 256 bits and block B's in the
 * high, each table broadcast to both halves (one table load serves 32 weight rows). vpshufb,
 * vpmaddubsw and vpmaddwd work per 128-bit lane and the cross-lane sum is a vpermt2q per pair
 * of halves, so every integer is the one-block form's and the epilogue is the same
 * (docs/numerics.md "Exact CQ x A8 products"). Each table register is looked up by the three
 * planes at once and the sums are kept in order, so no register spills (Zen 4's 512-bit
 * operations are double-pumped: the gain is in loads and spills, not in lookups per cycle). */

#ifndef NP_LUT_ONCE
#define NP_LUT_ONCE
/* Which kernel the 2- and 4-bit products use (np_cq_kernel in needlepoint_native.c, for
 * benchmarks and tests that compare them in one process): 0 by variant, row count and layout
 * copy (np_cq_int), 1 the level-sum / digit kernels, 2 the lookup kernel below (2-bit), 3 the
 * transform on the weights (np_cq_had.h), 5 the lookup kernel one 16-row block at a time
 * (np_lut_group1, np_lut_split) where AVX-512 would take two full blocks with the copy
 * (np_lut_group2). The same bits in every case. */
static int np_cq_kernel_pick = 0;
#define NP_LUT_SUB 256 /* KiB of activation tables per pass over a block of weight rows */
/* Activation rows from which the lookup kernel is picked without the interleaved copy (AVX2)
 * and at all (AVX-512 VNNI, where up to NP_LUT_TMAX_IL_VNNI rows with the copy are picked too),
 * measured in one process against the level-sum / digit kernels
 * (bench/needlepoint_bench/products_curve.py, docs/benchmarks.md "Exact CQ x A8 products: the
 * per-row cost curve"): on AVX2 about 1.1-1.3x faster from 4 rows when the codes are transposed
 * per call; on VNNI 2-4 % faster from 16 rows, even or slower at 4-8 rows against vpdpbusd
 * level sums / vpdpwssd digits. With the copy, the two-block form (np_lut_group2) against the
 * level sums: 1.15-1.3x at one row, 1.04-1.08x at 2 and 1.1x at 3 (from 4 the transform on the
 * weights, np_cq_had.h, is faster still). */
#define NP_LUT_TMIN 4
#define NP_LUT_TMIN_VNNI 16
#define NP_LUT_TMAX_IL_VNNI 3
#define NP_LUT_BLOCK 512 /* interleaved bytes per 16-row block and group (16 x 32) */
#endif

#ifdef NP_SIMD_AVX2
/* The group totals tot [T, g8] of v; NP_BADARG when some v is outside [-2^14, 2^14) (the digits
 * below cover exactly that range). */
static int NP_NAME(np_lut_totals)(const int32_t *v, int64_t T, int64_t in_pad, int32_t *tot,
                                  int64_t g8) {
    int64_t groups = in_pad / 128;
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            int32_t sum = 0, bad = 0;
            for (int c = 0; c < 128; c++) {
                sum += x[c];
                bad |= x[c] < -16384 || x[c] >= 16384;
            }
            if (bad) return NP_BADARG;
            tot[t * g8 + g] = sum;
        }
    return NP_OK;
}

/* Tables of activation rows [0, nb) of v (in range: np_lut_totals): tab[((t * groups + g) * 16 +
 * rev4(k)) * 4 + p] holds the 32 bytes of quads k (lane 0) and k + 16 (lane 1) of digit p, in
 * the order of the plane registers (np_lut_planes). */
static void NP_NAME(np_lut_tables)(const int32_t *v, int64_t nb, int64_t in_pad, __m256i *tab) {
    static const uint8_t rev4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    int64_t groups = in_pad / 128;
    /* sel[s]: byte n of a table takes digit s of the quad when bit s of n is set */
    __m256i sel[4];
    for (int s = 0; s < 4; s++) {
        int8_t b[32];
        for (int n = 0; n < 32; n++) b[n] = (int8_t)(((n & 15) >> s & 1) ? s : -128);
        sel[s] = _mm256_loadu_si256((const __m256i *)b);
    }
    for (int64_t t = 0; t < nb; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            int8_t dg[4][128];
            for (int c = 0; c < 128; c++) { /* balanced base-16 digits, d3 in [-4, 4] */
                int32_t u = x[c];
                for (int p = 0; p < 3; p++) {
                    int32_t d = ((u + 8) & 15) - 8;
                    dg[p][c] = (int8_t)d;
                    u = (u - d) >> 4;
                }
                dg[3][c] = (int8_t)u;
            }
            __m256i *out = tab + (t * groups + g) * 64;
            for (int k = 0; k < 16; k++)
                for (int p = 0; p < 4; p++) {
                    int32_t lo, hi; /* the quad's four digits, lane 0 quad k, lane 1 k + 16 */
                    memcpy(&lo, dg[p] + 4 * k, 4);
                    memcpy(&hi, dg[p] + 4 * (k + 16), 4);
                    __m256i q = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
                    __m256i e = _mm256_add_epi8(
                        _mm256_add_epi8(_mm256_shuffle_epi8(q, sel[0]), _mm256_shuffle_epi8(q, sel[1])),
                        _mm256_add_epi8(_mm256_shuffle_epi8(q, sel[2]), _mm256_shuffle_epi8(q, sel[3])));
                    _mm256_store_si256(out + rev4[k] * 4 + p, e); /* slot of register rev4(k) */
                }
        }
}

/* The three plane registers of 16 weight rows (rows past `rows` read as code 0) for every
 * group: planes[(g * 16 + o) * 3 + x], register o holding quads rev4(o) and rev4(o) + 16. */
static void NP_NAME(np_lut_planes)(const uint8_t *packed, int64_t row_bytes, int rows,
                                   int64_t groups, const uint8_t *next, __m256i *planes) {
    const __m256i m15 = _mm256_set1_epi8(15);
    const __m256i b0lo = _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3,
                                          0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3);
    const __m256i b1lo = _mm256_setr_epi8(0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3,
                                          0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3);
    const __m256i b0hi = _mm256_slli_epi16(b0lo, 2), b1hi = _mm256_slli_epi16(b1lo, 2);
    for (int64_t g = 0; g < groups; g++) {
        __m256i a[16], b[16];
        if (next) /* the next block's bytes of this group, while this one is worked on */
            for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(next + r * row_bytes + g * 32), _MM_HINT_T0);
        if (rows == 16)
            for (int r = 0; r < 16; r++)
                a[r] = _mm256_loadu_si256((const __m256i *)(packed + r * row_bytes + g * 32));
        else
            for (int r = 0; r < 16; r++)
                a[r] = r < rows ? _mm256_loadu_si256((const __m256i *)(packed + r * row_bytes + g * 32))
                                : _mm256_setzero_si256();
        for (int x = 0; x < 16; x += 2) { /* bytes */
            b[x] = _mm256_unpacklo_epi8(a[x], a[x + 1]);
            b[x + 1] = _mm256_unpackhi_epi8(a[x], a[x + 1]);
        }
        for (int x = 0; x < 16; x++) { /* 16-bit pairs, partner x + 2 */
            if (x & 2) continue;
            a[x] = _mm256_unpacklo_epi16(b[x], b[x + 2]);
            a[x + 2] = _mm256_unpackhi_epi16(b[x], b[x + 2]);
        }
        for (int x = 0; x < 16; x++) { /* 32-bit, partner x + 4 */
            if (x & 4) continue;
            b[x] = _mm256_unpacklo_epi32(a[x], a[x + 4]);
            b[x + 4] = _mm256_unpackhi_epi32(a[x], a[x + 4]);
        }
        for (int x = 0; x < 8; x++) { /* 64-bit, partner x + 8 */
            a[x] = _mm256_unpacklo_epi64(b[x], b[x + 8]);
            a[x + 8] = _mm256_unpackhi_epi64(b[x], b[x + 8]);
        }
        __m256i *out = planes + g * 48;
        for (int o = 0; o < 16; o++) {
            __m256i lo = _mm256_and_si256(a[o], m15);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(a[o], 4), m15);
            __m256i p0 = _mm256_or_si256(_mm256_shuffle_epi8(b0lo, lo), _mm256_shuffle_epi8(b0hi, hi));
            __m256i p1 = _mm256_or_si256(_mm256_shuffle_epi8(b1lo, lo), _mm256_shuffle_epi8(b1hi, hi));
            out[o * 3] = p0;
            out[o * 3 + 1] = p1;
            out[o * 3 + 2] = _mm256_and_si256(p0, p1);
        }
    }
}

/* The three plane registers of one 16-row block for `groups` groups from its interleaved codes
 * il (NP_LUT_BLOCK bytes per group; rows past the part's end are zero bytes: code 0), in
 * np_lut_planes' order: planes[(g * 16 + o) * 3 + x]. */
static inline void NP_NAME(np_lut_split)(const uint8_t *il, int64_t groups, __m256i *planes) {
    const __m256i m15 = _mm256_set1_epi8(15);
    for (int64_t i = 0; i < groups * 16; i++) {
        __m256i r = _mm256_loadu_si256((const __m256i *)(il + i * 32));
        __m256i p0 = _mm256_and_si256(r, m15);
        __m256i p1 = _mm256_and_si256(_mm256_srli_epi16(r, 4), m15);
        planes[i * 3] = p0;
        planes[i * 3 + 1] = p1;
        planes[i * 3 + 2] = _mm256_and_si256(p0, p1);
    }
}

/* D of 8 rows (row 2 i + parity at dots[(2 i + parity) * dstride]) from their plane sums. */
static inline void NP_NAME(np_lut_dots8)(__m256i p0, __m256i p1, __m256i p01, int32_t total,
                                         const double *cb, double *dots, int64_t dstride,
                                         int parity) {
    __m256i s1 = _mm256_sub_epi32(p0, p01), s2 = _mm256_sub_epi32(p1, p01);
    __m256i s0 = _mm256_sub_epi32(_mm256_add_epi32(_mm256_set1_epi32(total), p01),
                                  _mm256_add_epi32(p0, p1));
    const __m256i sj[4] = {s0, s1, s2, p01};
    double d[8];
    for (int half = 0; half < 2; half++) {
        __m256d acc = _mm256_setzero_pd();
        for (int j = 0; j < 4; j++) {
            __m128i part = half ? _mm256_extracti128_si256(sj[j], 1) : _mm256_castsi256_si128(sj[j]);
            acc = _mm256_add_pd(acc, _mm256_mul_pd(_mm256_cvtepi32_pd(part), _mm256_set1_pd(cb[j])));
        }
        _mm256_storeu_pd(d + 4 * half, acc);
    }
    for (int i = 0; i < 8; i++) dots[(2 * i + parity) * dstride] = d[i];
}

/* Digits 2 h and 2 h + 1 of plane x for 16 rows of one group and nr (1 or 2) activation rows
 * (tables tab[b]): the int16 sums d_2h + 16 d_2h+1 of the even rows (0, 2, .., 14; lane 0
 * quads 0..15, lane 1 16..31) in even[b], of the odd rows in odd[b]. One digit pair at a time
 * keeps AVX2's 16 registers enough; two activation rows share each plane load. */
static inline __attribute__((always_inline)) void NP_NAME(np_lut_pair)(
    const __m256i *planes, const int x, const __m256i *const *tab, const int h, const int nr,
    __m256i *even, __m256i *odd) {
    const __m256i c_e1 = _mm256_set1_epi16(1), c_o1 = _mm256_set1_epi16(1 << 8);
    const __m256i c_e16 = _mm256_set1_epi16(16), c_o16 = _mm256_set1_epi16(16 << 8);
    __m256i e[2], o[2];
    for (int b = 0; b < nr; b++) e[b] = o[b] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int o0 = 0; o0 < 16; o0 += 4) {
        __m256i lo[2], hi[2];
        for (int b = 0; b < nr; b++) lo[b] = hi[b] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int r = o0; r < o0 + 4; r++) {
            const __m256i idx = _mm256_load_si256(planes + r * 3 + x);
            for (int b = 0; b < nr; b++) {
                const __m256i *t = tab[b] + r * 4 + 2 * h;
                lo[b] = _mm256_add_epi8(lo[b], _mm256_shuffle_epi8(_mm256_load_si256(t), idx));
                hi[b] = _mm256_add_epi8(hi[b], _mm256_shuffle_epi8(_mm256_load_si256(t + 1), idx));
            }
        }
        for (int b = 0; b < nr; b++) {
            e[b] = _mm256_add_epi16(e[b], _mm256_add_epi16(_mm256_maddubs_epi16(c_e1, lo[b]),
                                                           _mm256_maddubs_epi16(c_e16, hi[b])));
            o[b] = _mm256_add_epi16(o[b], _mm256_add_epi16(_mm256_maddubs_epi16(c_o1, lo[b]),
                                                           _mm256_maddubs_epi16(c_o16, hi[b])));
        }
    }
    for (int b = 0; b < nr; b++) even[b] = e[b], odd[b] = o[b];
}

/* P_x of plane x for 16 rows of one group and nr activation rows: even rows (0, 2, .., 14) in
 * even[b * 3 + x], odd rows in odd[b * 3 + x], 8 int32 each. tab[b]: activation row b's 64
 * table registers of the group. */
static inline __attribute__((always_inline)) void NP_NAME(np_lut_plane)(
    const __m256i *planes, const int x, const __m256i *const *tab, const int nr, __m256i *even,
    __m256i *odd) {
    __m256i ea[2], oa[2], eb[2], ob[2];
    NP_NAME(np_lut_pair)(planes, x, tab, 0, nr, ea, oa);
    NP_NAME(np_lut_pair)(planes, x, tab, 1, nr, eb, ob);
    /* A + 256 B per row; lane 0 (quads 0..15) and lane 1 (quads 16..31) added */
    const __m256i w = _mm256_set1_epi32(1 | (256 << 16));
    for (int b = 0; b < nr; b++) {
        __m256i el = _mm256_madd_epi16(_mm256_unpacklo_epi16(ea[b], eb[b]), w); /* rows 0..6 */
        __m256i eh = _mm256_madd_epi16(_mm256_unpackhi_epi16(ea[b], eb[b]), w); /* 8..14 */
        __m256i ol = _mm256_madd_epi16(_mm256_unpacklo_epi16(oa[b], ob[b]), w);
        __m256i oh = _mm256_madd_epi16(_mm256_unpackhi_epi16(oa[b], ob[b]), w);
        even[b * 3 + x] = _mm256_add_epi32(_mm256_permute2x128_si256(el, eh, 0x20),
                                           _mm256_permute2x128_si256(el, eh, 0x31));
        odd[b * 3 + x] = _mm256_add_epi32(_mm256_permute2x128_si256(ol, oh, 0x20),
                                          _mm256_permute2x128_si256(ol, oh, 0x31));
    }
}

/* D of 16 weight rows for nr activation rows (b0, b0 + 1) of group g. */
static inline __attribute__((always_inline)) void NP_NAME(np_lut_group)(
    const __m256i *pg, const __m256i *tab, const int32_t *tot, int64_t groups, int64_t g8,
    int64_t g, int64_t b0, const int nr, const double *cb, double *dots, int64_t dstride) {
    const __m256i *tg[2] = {tab + (b0 * groups + g) * 64,
                            tab + ((b0 + nr - 1) * groups + g) * 64};
    __m256i e[6], o[6];
    NP_NAME(np_lut_plane)(pg, 0, tg, nr, e, o);
    NP_NAME(np_lut_plane)(pg, 1, tg, nr, e, o);
    NP_NAME(np_lut_plane)(pg, 2, tg, nr, e, o);
    for (int b = 0; b < nr; b++) {
        int32_t total = tot[(b0 + b) * g8 + g];
        double *dg = dots + (b0 + b) * groups + g;
        NP_NAME(np_lut_dots8)(e[b * 3], e[b * 3 + 1], e[b * 3 + 2], total, cb, dg, dstride, 0);
        NP_NAME(np_lut_dots8)(o[b * 3], o[b * 3 + 1], o[b * 3 + 2], total, cb, dg, dstride, 1);
    }
}

/* D of 16 weight rows of group g for one activation row b0, from the block's interleaved codes
 * il: the group's planes are split into registers that stay in L1 and looked up at once, so a
 * one-row product makes one pass over the weights. */
static inline __attribute__((always_inline)) void NP_NAME(np_lut_group1)(
    const uint8_t *il, const __m256i *tab, const int32_t *tot, int64_t groups, int64_t g8,
    int64_t g, int64_t b0, const double *cb, double *dots, int64_t dstride) {
    __m256i pg[48];
    NP_NAME(np_lut_split)(il + g * NP_LUT_BLOCK, 1, pg);
    NP_NAME(np_lut_group)(pg, tab, tot, groups, g8, g, b0, 1, cb, dots, dstride);
}

#ifdef NP_SIMD_AVX512
/* D of 8 rows of each of two blocks (half 0: block A's rows 2 i + parity at
 * dots[(2 i + parity) * dstride], half 1: block B's at dots[(16 + 2 i + parity) * dstride]) from
 * their plane sums: np_lut_dots8's float operations in its order, 8 rows per operation. */
static inline void NP_NAME(np_lut_dots16)(__m512i p0, __m512i p1, __m512i p01, int32_t total,
                                          const double *cb, double *dots, int64_t dstride,
                                          int parity) {
    __m512i s1 = _mm512_sub_epi32(p0, p01), s2 = _mm512_sub_epi32(p1, p01);
    __m512i s0 = _mm512_sub_epi32(_mm512_add_epi32(_mm512_set1_epi32(total), p01),
                                  _mm512_add_epi32(p0, p1));
    const __m512i sj[4] = {s0, s1, s2, p01};
    double d[16];
    for (int half = 0; half < 2; half++) {
        __m512d acc = _mm512_setzero_pd();
        for (int j = 0; j < 4; j++) {
            __m256i part = half ? _mm512_extracti64x4_epi64(sj[j], 1) : _mm512_castsi512_si256(sj[j]);
            acc = _mm512_add_pd(acc, _mm512_mul_pd(_mm512_cvtepi32_pd(part), _mm512_set1_pd(cb[j])));
        }
        _mm512_storeu_pd(d + 8 * half, acc);
    }
    for (int i = 0; i < 8; i++) {
        dots[(2 * i + parity) * dstride] = d[i];
        dots[(16 + 2 * i + parity) * dstride] = d[8 + i];
    }
}

/* Digits 2 h and 2 h + 1 of the three planes of two 16-row blocks (half 0 block A, half 1
 * block B) of one group for one activation row (tables tg): np_lut_pair's int16 sums of the
 * even rows in even[x], of the odd rows in odd[x], per 256-bit half. Each table register is
 * broadcast to both halves and looked up by the three planes at once. split: the planes from
 * the codes ila / ilb (stored to st), else loaded from st. */
static inline __attribute__((always_inline)) void NP_NAME(np_lut_pass2)(
    const uint8_t *ila, const uint8_t *ilb, const __m256i *tg, const int h, const int split,
    __m512i *st, __m512i *even, __m512i *odd) {
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i c_e1 = _mm512_set1_epi16(1), c_o1 = _mm512_set1_epi16(1 << 8);
    const __m512i c_e16 = _mm512_set1_epi16(16), c_o16 = _mm512_set1_epi16(16 << 8);
    __m512i e[3], o[3];
    for (int x = 0; x < 3; x++) e[x] = o[x] = _mm512_setzero_si512();
#pragma GCC unroll 1 /* unrolled, GCC loads every chunk first and spills */
    for (int o0 = 0; o0 < 16; o0 += 4) {
        __m512i lo[3], hi[3];
        for (int x = 0; x < 3; x++) lo[x] = hi[x] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int r = o0; r < o0 + 4; r++) {
            __m512i pl[3];
            if (split) {
                const __m512i raw = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ila + r * 32))),
                    _mm256_loadu_si256((const __m256i *)(ilb + r * 32)), 1);
                pl[0] = _mm512_and_si512(raw, m15);
                pl[1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m15);
                pl[2] = _mm512_and_si512(pl[0], pl[1]);
                for (int x = 0; x < 3; x++) _mm512_store_si512(st + r * 3 + x, pl[x]);
            } else {
                for (int x = 0; x < 3; x++) pl[x] = _mm512_load_si512(st + r * 3 + x);
            }
            const __m512i t0 = _mm512_broadcast_i64x4(_mm256_load_si256(tg + r * 4 + 2 * h));
            const __m512i t1 = _mm512_broadcast_i64x4(_mm256_load_si256(tg + r * 4 + 2 * h + 1));
            for (int x = 0; x < 3; x++) {
                lo[x] = _mm512_add_epi8(lo[x], _mm512_shuffle_epi8(t0, pl[x]));
                hi[x] = _mm512_add_epi8(hi[x], _mm512_shuffle_epi8(t1, pl[x]));
                /* the sums in this order: reassociated, the 24 lookups of a chunk are live at
                 * once and spill */
                __asm__("" : "+v"(lo[x]), "+v"(hi[x]));
            }
        }
        for (int x = 0; x < 3; x++) {
            e[x] = _mm512_add_epi16(e[x], _mm512_add_epi16(_mm512_maddubs_epi16(c_e1, lo[x]),
                                                           _mm512_maddubs_epi16(c_e16, hi[x])));
            o[x] = _mm512_add_epi16(o[x], _mm512_add_epi16(_mm512_maddubs_epi16(c_o1, lo[x]),
                                                           _mm512_maddubs_epi16(c_o16, hi[x])));
        }
    }
    for (int x = 0; x < 3; x++) even[x] = e[x], odd[x] = o[x];
}

/* D of two consecutive full 16-row blocks (interleaved codes ila, ilb of group g) for one
 * activation row (tables tg of the group, total its group total): np_lut_group's integers, two
 * blocks per zmm register (half 0 block A's register o, half 1 block B's), so one table load
 * serves 32 weight rows and vpshufb / vpmaddubsw / vpmaddwd work per 128-bit lane as in the
 * AVX2 form. One digit pair per pass (np_lut_pass2: about 24 of the 32 registers live); the
 * planes split in the first pass are read back from L1 by the second (splitting them again
 * measured about 8 % slower). The same integers as np_lut_group, hence the same bits
 * (docs/numerics.md "Exact CQ x A8 products"). */
static inline __attribute__((always_inline)) void NP_NAME(np_lut_group2)(
    const uint8_t *ila, const uint8_t *ilb, const __m256i *tg, int32_t total, const double *cb,
    double *dots, int64_t dstride) {
    __m512i st[48];
    __m512i ev[2][3], od[2][3]; /* [digit pair h][plane x], int16 */
    NP_NAME(np_lut_pass2)(ila, ilb, tg, 0, 1, st, ev[0], od[0]);
    /* GCC would otherwise keep pass 0's 48 planes in registers for pass 1, and spill */
    __asm__ volatile("" ::: "memory");
    NP_NAME(np_lut_pass2)(ila, ilb, tg, 1, 0, st, ev[1], od[1]);
    /* A + 256 B per row; per 256-bit half, lane 0 (quads 0..15) and lane 1 (16..31) added:
     * np_lut_plane's vperm2i128 0x20 / 0x31 as one vpermt2q per half pair */
    const __m512i w = _mm512_set1_epi32(1 | (256 << 16));
    const __m512i q20 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i q31 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    __m512i ep[3], op[3];
    for (int x = 0; x < 3; x++) {
        __m512i el = _mm512_madd_epi16(_mm512_unpacklo_epi16(ev[0][x], ev[1][x]), w);
        __m512i eh = _mm512_madd_epi16(_mm512_unpackhi_epi16(ev[0][x], ev[1][x]), w);
        __m512i ol = _mm512_madd_epi16(_mm512_unpacklo_epi16(od[0][x], od[1][x]), w);
        __m512i oh = _mm512_madd_epi16(_mm512_unpackhi_epi16(od[0][x], od[1][x]), w);
        ep[x] = _mm512_add_epi32(_mm512_permutex2var_epi64(el, q20, eh),
                                 _mm512_permutex2var_epi64(el, q31, eh));
        op[x] = _mm512_add_epi32(_mm512_permutex2var_epi64(ol, q20, oh),
                                 _mm512_permutex2var_epi64(ol, q31, oh));
    }
    NP_NAME(np_lut_dots16)(ep[0], ep[1], ep[2], total, cb, dots, dstride, 0);
    NP_NAME(np_lut_dots16)(op[0], op[1], op[2], total, cb, dots, dstride, 1);
}
#endif /* NP_SIMD_AVX512 */

/* np_cq_matmul for 2-bit storage and at most 4 levels by table lookups. NP_BADARG (nothing
 * written) when some v is outside [-2^14, 2^14): the float64 kernel runs. */
static int NP_NAME(np_cq_lut2)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                               const double *cb, const np_cq_part *parts, int64_t n_parts,
                               float *out, int64_t out_stride, int64_t r_first, int64_t r_last) {
    int64_t groups = in_pad / 128, g8 = (groups + 7) & ~(int64_t)7;
    /* activation rows per pass: their tables (2 KiB per group and row) within NP_LUT_SUB KiB */
    int64_t sub = groups > 0 ? (NP_LUT_SUB / 2) / groups : T;
    if (sub < 1) sub = 1;
    if (sub > T) sub = T;
    __m256i *tab = (__m256i *)aligned_alloc(32, sizeof(__m256i) * (size_t)(sub * groups * 64));
    __m256i *planes = (__m256i *)aligned_alloc(32, sizeof(__m256i) * (size_t)(groups * 48));
    int32_t *tot = (int32_t *)calloc((size_t)(T * g8), sizeof(int32_t));
    /* 32 weight rows per activation row (two blocks on AVX-512) */
    double *dots = (double *)malloc(sizeof(double) * (size_t)(32 * sub * groups));
    double *sc = (double *)malloc(sizeof(double) * (size_t)T);
    if (!tab || !planes || !tot || !dots || !sc) {
        free(tab), free(planes), free(tot), free(dots), free(sc);
        return NP_NOMEM;
    }
    int status = NP_NAME(np_lut_totals)(v, T, in_pad, tot, g8);
    for (int64_t t = 0; t < T; t++) sc[t] = (double)scale[t];
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += sub) {
        int nb = (int)(T - t0 < sub ? T - t0 : sub);
        NP_NAME(np_lut_tables)(v + t0 * in_pad, nb, in_pad, tab);
        const int32_t *tot0 = tot + t0 * g8;
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
                /* dots of row i, activation row b, group g at (i * nb + b) * groups + g */
                int64_t dstride = nb * groups;
                const uint8_t *il = part->interleaved && !(r16 & 15)
                                        ? part->interleaved + r16 * part->row_bytes : NULL;
#ifdef NP_SIMD_AVX512
                if (il && z - r16 >= 32 && np_cq_kernel_pick != 5) {
                    end = r16 + 32, rows = 32; /* two full blocks, B's codes 16 rows on */
                    const uint8_t *ilb = il + 16 * part->row_bytes;
                    for (int64_t g = 0; g < groups; g++)
                        for (int b = 0; b < nb; b++) /* the group's codes stay in L1 */
                            NP_NAME(np_lut_group2)(il + g * NP_LUT_BLOCK, ilb + g * NP_LUT_BLOCK,
                                                   tab + (b * groups + g) * 64, tot0[b * g8 + g],
                                                   cb, dots + b * groups + g, dstride);
                } else
#endif
                if (il && nb == 1) {
                    for (int64_t g = 0; g < groups; g++)
                        NP_NAME(np_lut_group1)(il, tab, tot0, groups, g8, g, 0, cb, dots, dstride);
                } else {
                    if (il) {
                        NP_NAME(np_lut_split)(il, groups, planes);
                    } else {
                        const uint8_t *next = z - r16 >= 48
                                                  ? part->packed + (r16 + 32) * part->row_bytes
                                                  : NULL;
                        NP_NAME(np_lut_planes)(part->packed + r16 * part->row_bytes,
                                               part->row_bytes, rows, groups, next, planes);
                    }
                    for (int64_t g = 0; g < groups; g++) {
                        const __m256i *pg = planes + g * 48;
                        for (int b = 0; b < nb; b++) /* (two rows per plane load: no faster) */
                            NP_NAME(np_lut_group)(pg, tab, tot0, groups, g8, g, b, 1, cb, dots,
                                                  dstride);
                    }
                }
                for (int i = 0; i < rows; i += 4)
                    NP_NAME(np_tile_epilogue)(part, groups, r16 + i, rows - i < 4 ? rows - i : 4,
                                              nb, dots + i * dstride, dstride, groups, sc + t0,
                                              out + t0 * out_stride, out_stride);
            }
        }
    }
    free(tab), free(planes), free(tot), free(dots), free(sc);
    return status;
}
#endif /* NP_SIMD_AVX2 */
