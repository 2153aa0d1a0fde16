/* Exact CQ x A8 products of 4-bit storage by 16-bit word lookups (vpermw) and vpdpwssd,
 * AVX-512 VNNI only (AVX-512 BW's vpermw has no AVX2 form), included by np_cq_int.h.
 * docs/numerics.md "Exact CQ x A8 products" is the contract, kernels/exact.py
 * `cq_matmul_reference` the numpy reference with the same bits.
 *
 * The sums are np_cq_int16.h's: every level is k_j quanta, u_j = (k_j - kc) / gc cut into
 * P <= 3 balanced base-2^14 digits d_jp in [-8191, 8192], and
 *   sum_c k[idx_c] v_c = gc * W + kc * tot,  W = sum_p 2^(14 p) sum_c d_p[idx_c] v_c.
 * What differs is how a code becomes its 16-bit digit. The packed codes are read as stored
 * (LSB first, two per byte): a 512-bit register holds a whole group, its 16-bit word e the
 * codes of columns 4e .. 4e + 3 in nibbles 0..3. vpermw looks a word up by its low 5 bits in a
 * table of 32 words; the table holds d_p[j] at j and at 16 + j, so word >> 4s indexes digit
 * d_p of nibble s whatever bit 4 holds: one shift and one lookup per 32 codes and digit, no
 * masking, byte tables or unpacking (np_cq_int16.h: an and, two vpshufb and two unpacks). The
 * activation comes as int16 in the matching order, v of column 4e + s at s * 32 + e of its
 * group. An int32 lane adds 8 products (2 per vpdpwssd, 4 shifts), each in
 * [-2^27, 2^27 - 8192], so two lanes added hold 16 in [-2^31, 2^31) (as np_cq_int16.h's);
 * per group and digit those 8 sums go to float64 (integers, exact) and W = sum_p 2^(14 p)
 * (lane sums) stays below 2^53 as in np_cq_int16.h, so D = (gc W + kc tot) qu is the exact
 * sum, and the shared epilogue (np_tile_epilogue) gives the float64 reference's bits. v
 * outside [-2^14, 2^14) returns NP_BADARG: the float64 kernel runs.
 *
 * The second kernel below (np_cq_blk4) reads the 16-row blocked copy of the codes a load
 * builds and needs no reduction across lanes; np_cq_int picks it whenever every part carries
 * that copy, this one (np_cq_perm4) otherwise up to NP_P4_TMAX activation rows. */

#ifdef NP_SIMD_AVX512
#define NP_P4_RB 4 /* activation rows per pass over the weights */
/* Activation rows up to which np_cq_int picks this kernel for 4-bit parts without the blocked
 * copy (measured in one process against np_cq_int16.h: about 1.2x faster at 1-2 rows, even
 * from 4) */
#define NP_P4_TMAX 3

/* v of rows [0, T) as int16 in the order above (w [T, in_pad]) and the group totals
 * tot [T, g4] (g4 = groups rounded up to 4, padding zero); NP_BADARG when some v is outside
 * [-2^14, 2^14). */
static int NP_NAME(np_p4_prepare)(const int32_t *v, int64_t T, int64_t in_pad, int16_t *w,
                                  int32_t *tot, int64_t g4) {
    int64_t groups = in_pad / 128;
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            int16_t *out = w + t * in_pad + g * 128;
            int32_t sum = 0, bad = 0;
            for (int c = 0; c < 128; c++) {
                bad |= x[c] < -16384 || x[c] >= 16384;
                sum += x[c];
                out[(c & 3) * 32 + (c >> 2)] = (int16_t)x[c];
            }
            if (bad) return NP_BADARG;
            tot[t * g4 + g] = sum;
        }
    return NP_OK;
}

/* One group (64 code bytes) against nb activation rows: four float64 lanes of
 * sum_p 2^(14 p) (digit p's sum) to q[b * qstride + 0..3] (exact integers; np_d16_dots4 adds
 * them). An int32 lane holds 8 products, two lanes 16: in [-2^31, 2^31) (np_cq_int16.h), so
 * the halves are added in int32 before the conversion. */
static inline __attribute__((always_inline)) void NP_NAME(np_p4_group)(
    const uint8_t *bytes, const int16_t *w, int64_t w_stride, const int nb, const int P,
    const __m512i *tab, double *q, int64_t qstride) {
    __m512i acc[NP_P4_RB][3];
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < P; p++) acc[b][p] = _mm512_setzero_si512();
    const __m512i c = _mm512_loadu_si512((const void *)bytes);
    for (int s = 0; s < 4; s++) {
        const __m512i idx = s ? _mm512_srli_epi16(c, 4 * s) : c;
        for (int p = 0; p < P; p++) {
            const __m512i d = _mm512_permutexvar_epi16(idx, tab[p]);
            for (int b = 0; b < nb; b++)
                acc[b][p] = _mm512_dpwssd_epi32(
                    acc[b][p], d, _mm512_loadu_si512((const void *)(w + b * w_stride + s * 32)));
        }
    }
    for (int b = 0; b < nb; b++) {
        __m512d sum = _mm512_setzero_pd();
        for (int p = 0; p < P; p++) {
            __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(acc[b][p]),
                                            _mm512_extracti64x4_epi64(acc[b][p], 1));
            __m512d part = _mm512_cvtepi32_pd(half);
            sum = p ? _mm512_add_pd(sum, _mm512_mul_pd(part, _mm512_set1_pd((double)(1 << (14 * p)))))
                    : part;
        }
        _mm256_storeu_pd(q + b * qstride, _mm256_add_pd(_mm512_castpd512_pd256(sum),
                                                        _mm512_extractf64x4_pd(sum, 1)));
    }
}

/* All groups of weight rows [r0, r1) of `part` against activation rows [0, nb): D of row i,
 * activation row b and group g to dots[i * dstride + b * g4 + g], the epilogue 4 rows at a
 * time (np_cq_int16.h's np_d16_rows with the lookups above). */
static inline __attribute__((always_inline)) void NP_NAME(np_p4_rows)(
    const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1, const int16_t *w,
    int64_t w_stride, const int32_t *tot, const int nb, const int P, const __m512i *tab,
    const np_d16_levels *lv, const double *s, float *out, int64_t out_stride, double *dots,
    double *q) {
    int64_t g4 = (groups + 3) & ~(int64_t)3, dstride = NP_P4_RB * g4, qstride = g4 * 4;
    for (int64_t r4 = r0; r4 < r1; r4 += 4) {
        int rows = (int)(r1 - r4 < 4 ? r1 - r4 : 4);
        for (int i = 0; i < rows; i++) {
            const uint8_t *p = part->packed + (r4 + i) * part->row_bytes;
            for (int64_t g = 0; g < groups; g++)
                NP_NAME(np_p4_group)(p + g * 64, w + g * 128, w_stride, nb, P, tab, q + g * 4,
                                     qstride);
            for (int b = 0; b < nb; b++)
                for (int64_t g = 0; g < groups; g += 4)
                    NP_NAME(np_d16_dots4)(q + b * qstride + g * 4, tot + b * g4 + g, lv,
                                          dots + i * dstride + b * g4 + g);
        }
        NP_NAME(np_tile_epilogue)(part, groups, r4, rows, nb, dots, dstride, g4, s, out,
                                  out_stride);
    }
}

#define NP_P4_CASE(nb, P)                                                                  \
    NP_NAME(np_p4_rows)(&parts[p], groups, a, z, W, in_pad, tt, nb, P, tab, &lv, s, o,       \
                        out_stride, dots, q)
#define NP_P4_P(nb)                                                                        \
    switch (lv.pieces) {                                                                   \
    case 3: NP_P4_CASE(nb, 3); break;                                                      \
    case 2: NP_P4_CASE(nb, 2); break;                                                      \
    default: NP_P4_CASE(nb, 1); break;                                                     \
    }

/* np_cq_matmul for 4-bit storage by word lookups. NP_BADARG (nothing written) when the
 * codebook or v is outside what the integer sums cover: the float64 kernel runs. */
static int NP_NAME(np_cq_perm4)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                                const float *codebook, int64_t codebook_len,
                                const np_cq_part *parts, int64_t n_parts, float *out,
                                int64_t out_stride, int64_t r_first, int64_t r_last) {
    np_d16_levels lv;
    if (NP_NAME(np_d16_levels_of)(codebook, codebook_len, 4, &lv) != NP_OK) return NP_BADARG;
    __m512i tab[3];
    for (int p = 0; p < 3; p++) {
        int16_t words[32];
        for (int j = 0; j < 32; j++) words[j] = lv.digit[p][j & 15];
        tab[p] = _mm512_loadu_si512((const void *)words);
    }
    int64_t groups = in_pad / 128, g4 = (groups + 3) & ~(int64_t)3;
    int16_t *w = (int16_t *)malloc(sizeof(int16_t) * (size_t)(T * in_pad + 32));
    int32_t *tot = (int32_t *)calloc((size_t)(T * g4), sizeof(int32_t));
    double *dots = (double *)malloc(sizeof(double) * (size_t)(4 * NP_P4_RB * g4));
    double *q = (double *)calloc((size_t)(NP_P4_RB * g4 * 4), sizeof(double));
    if (!w || !tot || !dots || !q) {
        free(w), free(tot), free(dots), free(q);
        return NP_NOMEM;
    }
    int status = NP_NAME(np_p4_prepare)(v, T, in_pad, w, tot, g4);
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += NP_P4_RB) {
        int nb = (int)(T - t0 < NP_P4_RB ? T - t0 : NP_P4_RB);
        double s[NP_P4_RB];
        for (int b = 0; b < nb; b++) s[b] = (double)scale[t0 + b];
        const int16_t *W = w + t0 * in_pad;
        const int32_t *tt = tot + t0 * g4;
        float *o = out + t0 * out_stride;
        int64_t base = 0;
        for (int64_t p = 0; p < n_parts; p++) {
            int64_t a = r_first > base ? r_first - base : 0;
            int64_t z = r_last - base < parts[p].rows ? r_last - base : parts[p].rows;
            if (a < z) {
                switch (nb) {
                case 4: NP_P4_P(4) break;
                case 3: NP_P4_P(3) break;
                case 2: NP_P4_P(2) break;
                default: NP_P4_P(1) break;
                }
            }
            base += parts[p].rows;
        }
    }
    free(w), free(tot), free(dots), free(q);
    return status;
}

/* -- 16-row blocks (np_cq_part.interleaved of a 4-bit part, kernels/code_layout.py block_codes) --
 * A load copies the codes of every 16 weight rows and group into 16 registers of 64 bytes:
 * register k, 32-bit lane i = code bytes 4k .. 4k + 3 of row i (columns 8k .. 8k + 7), the
 * same bytes regrouped (rows past the part's end are zero: code 0). Lane i of a vpdpwssd then
 * belongs to row i alone: its low word holds columns 8k .. 8k + 3, its high word 8k + 4 .. 8k + 7,
 * and the activation operand is one 32-bit pair (v[8k + s], v[8k + 4 + s]) broadcast to every
 * lane. A lane thus sums its row's whole group, 128 products, with no reduction across lanes;
 * for that to stay in int32 the digits are balanced base 2^10, u_j = sum_p 2^(10 p) e_jp with
 * e_jp in [-511, 512] (P <= 4 for |u_j| <= 2^32): |lane| <= 128 * 512 * 2^14 = 2^30. W of 16
 * rows = sum_p 2^(10 p) (lane p) goes to float64 (below 2^53 as above), D = (gc W + kc tot) qu
 * exactly, and the epilogue is np_tile_epilogue's. */
#define NP_B4_RB 4 /* activation rows per pass over a block */

/* v of rows [0, T) as the broadcast pairs: pairs[(t * groups + g) * 64 + k * 4 + s] = v[8k + s]
 * (low word) and v[8k + 4 + s] (high word) of group g; the totals tot [T, groups].
 * NP_BADARG when some v is outside [-2^14, 2^14). */
static int NP_NAME(np_b4_prepare)(const int32_t *v, int64_t T, int64_t in_pad, uint32_t *pairs,
                                  int32_t *tot) {
    int64_t groups = in_pad / 128;
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            uint32_t *out = pairs + (t * groups + g) * 64;
            int32_t sum = 0, bad = 0;
            for (int c = 0; c < 128; c++) {
                bad |= x[c] < -16384 || x[c] >= 16384;
                sum += x[c];
            }
            if (bad) return NP_BADARG;
            for (int k = 0; k < 16; k++)
                for (int s = 0; s < 4; s++)
                    out[k * 4 + s] = (uint32_t)(uint16_t)x[8 * k + s] |
                                     (uint32_t)(uint16_t)x[8 * k + 4 + s] << 16;
            tot[t * groups + g] = sum;
        }
    return NP_OK;
}

/* D of the 16 rows of one block and group g (codes il, 1024 bytes) for nb activation rows:
 * row i, activation row b at d[i * dstride + b * groups]. */
static inline __attribute__((always_inline)) void NP_NAME(np_b4_group)(
    const uint8_t *il, const uint32_t *pairs, int64_t pstride, const int32_t *tot,
    int64_t groups, const int nb, const int P, const __m512i *tab, const np_d16_levels *lv,
    double *d, int64_t dstride) {
    /* C independent sums per activation row and digit (the fields s alternate between them):
     * one chain of 64 dependent vpdpwssd per group would wait on their latency */
    const int C = nb == 1 ? 4 : nb == 2 ? 2 : 1;
    __m512i acc[NP_B4_RB][4][4];
    for (int b = 0; b < nb; b++)
        for (int x = 0; x < C; x++)
            for (int p = 0; p < P; p++) acc[b][x][p] = _mm512_setzero_si512();
    for (int k = 0; k < 16; k++) {
        const __m512i c = _mm512_loadu_si512((const void *)(il + k * 64));
        for (int s = 0; s < 4; s++) {
            const __m512i idx = s ? _mm512_srli_epi16(c, 4 * s) : c;
            for (int p = 0; p < P; p++) {
                const __m512i w = _mm512_permutexvar_epi16(idx, tab[p]);
                for (int b = 0; b < nb; b++)
                    acc[b][s % C][p] = _mm512_dpwssd_epi32(
                        acc[b][s % C][p], w,
                        _mm512_set1_epi32((int32_t)pairs[b * pstride + k * 4 + s]));
            }
        }
    }
    for (int b = 0; b < nb; b++) /* partial sums of one lane's 128 products: in int32 */
        for (int x = 1; x < C; x++)
            for (int p = 0; p < P; p++) acc[b][0][p] = _mm512_add_epi32(acc[b][0][p], acc[b][x][p]);
    const __m512d gc = _mm512_set1_pd(lv->gc), kc = _mm512_set1_pd(lv->kc);
    const __m512d qu = _mm512_set1_pd(lv->quantum);
    for (int b = 0; b < nb; b++) {
        double out[16];
        const __m512d t = _mm512_set1_pd((double)tot[b * groups]);
        for (int h = 0; h < 2; h++) {
            __m512d W = _mm512_setzero_pd();
            for (int p = 0; p < P; p++) {
                __m256i lanes = h ? _mm512_extracti64x4_epi64(acc[b][0][p], 1)
                                  : _mm512_castsi512_si256(acc[b][0][p]);
                __m512d part = _mm512_cvtepi32_pd(lanes);
                W = p ? _mm512_add_pd(W, _mm512_mul_pd(part, _mm512_set1_pd((double)(1LL << (10 * p)))))
                      : part;
            }
            __m512d k = _mm512_add_pd(_mm512_mul_pd(W, gc), _mm512_mul_pd(t, kc));
            _mm512_storeu_pd(out + 8 * h, _mm512_mul_pd(k, qu));
        }
        for (int i = 0; i < 16; i++) d[i * dstride + b * groups] = out[i];
    }
}

/* Weight rows [r0, r1) of `part` (its blocks in part->interleaved) against activation rows
 * [0, nb): whole 16-row blocks are computed, the rows in [r0, r1) written. */
static inline __attribute__((always_inline)) void NP_NAME(np_b4_rows)(
    const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1, const uint32_t *pairs,
    const int32_t *tot, const int nb, const int P, const __m512i *tab, const np_d16_levels *lv,
    const double *s, float *out, int64_t out_stride, double *dots) {
    int64_t dstride = NP_B4_RB * groups;
    for (int64_t r16 = r0 & ~(int64_t)15; r16 < r1; r16 += 16) {
        const uint8_t *il = part->interleaved + r16 * part->row_bytes;
        for (int64_t g = 0; g < groups; g++)
            NP_NAME(np_b4_group)(il + g * 1024, pairs + g * 64, groups * 64, tot + g, groups, nb,
                                 P, tab, lv, dots + g, dstride);
        int64_t lo = r16 > r0 ? r16 : r0, hi = r16 + 16 < r1 ? r16 + 16 : r1;
        for (int64_t r = lo; r < hi; r += 4)
            NP_NAME(np_tile_epilogue)(part, groups, r, (int)(hi - r < 4 ? hi - r : 4), nb,
                                      dots + (r - r16) * dstride, dstride, groups, s, out,
                                      out_stride);
    }
}

#define NP_B4_CASE(nb, P)                                                                  \
    NP_NAME(np_b4_rows)(&parts[p], groups, a, z, pairs + t0 * groups * 64, tot + t0 * groups,  \
                        nb, P, tab, &lv, s, o, out_stride, dots)
#define NP_B4_P(nb)                                                                        \
    switch (pieces) {                                                                      \
    case 4: NP_B4_CASE(nb, 4); break;                                                      \
    case 3: NP_B4_CASE(nb, 3); break;                                                      \
    case 2: NP_B4_CASE(nb, 2); break;                                                      \
    default: NP_B4_CASE(nb, 1); break;                                                     \
    }

/* np_cq_matmul for 4-bit storage whose parts all carry the 16-row blocks. NP_BADARG (nothing
 * written) when the codebook or v is outside what the integer sums cover. */
static int NP_NAME(np_cq_blk4)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                               const float *codebook, int64_t codebook_len,
                               const np_cq_part *parts, int64_t n_parts, float *out,
                               int64_t out_stride, int64_t r_first, int64_t r_last) {
    np_d16_levels lv;
    if (NP_NAME(np_d16_levels_of)(codebook, codebook_len, 4, &lv) != NP_OK) return NP_BADARG;
    int16_t e[4][16] = {{0}};
    int pieces = 1;
    for (int j = 0; j < 16; j++) { /* u_j from its base-2^14 digits, then base 2^10 */
        int64_t u = lv.digit[0][j] + ((int64_t)lv.digit[1][j] << 14) +
                    ((int64_t)lv.digit[2][j] << 28);
        for (int p = 0; u != 0; p++) {
            if (p == 4) return NP_BADARG; /* |u| <= 2^32 (np_d16_levels_of): unreachable */
            int64_t d = ((u + 511) & 1023) - 511;
            e[p][j] = (int16_t)d;
            u = (u - d) >> 10;
            if (p + 1 > pieces) pieces = p + 1;
        }
    }
    __m512i tab[4];
    for (int p = 0; p < 4; p++) {
        int16_t words[32];
        for (int j = 0; j < 32; j++) words[j] = e[p][j & 15];
        tab[p] = _mm512_loadu_si512((const void *)words);
    }
    int64_t groups = in_pad / 128;
    uint32_t *pairs = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(T * groups * 64 + 16));
    int32_t *tot = (int32_t *)calloc((size_t)(T * groups + 1), sizeof(int32_t));
    double *dots = (double *)malloc(sizeof(double) * (size_t)(16 * NP_B4_RB * groups + 1));
    if (!pairs || !tot || !dots) {
        free(pairs), free(tot), free(dots);
        return NP_NOMEM;
    }
    int status = NP_NAME(np_b4_prepare)(v, T, in_pad, pairs, tot);
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += NP_B4_RB) {
        int nb = (int)(T - t0 < NP_B4_RB ? T - t0 : NP_B4_RB);
        double s[NP_B4_RB];
        for (int b = 0; b < nb; b++) s[b] = (double)scale[t0 + b];
        float *o = out + t0 * out_stride;
        int64_t base = 0;
        for (int64_t p = 0; p < n_parts; p++) {
            int64_t a = r_first > base ? r_first - base : 0;
            int64_t z = r_last - base < parts[p].rows ? r_last - base : parts[p].rows;
            if (a < z) {
                switch (nb) {
                case 4: NP_B4_P(4) break;
                case 3: NP_B4_P(3) break;
                case 2: NP_B4_P(2) break;
                default: NP_B4_P(1) break;
                }
            }
            base += parts[p].rows;
        }
    }
    free(pairs), free(tot), free(dots);
    return status;
}
#undef NP_B4_CASE
#undef NP_B4_P
#undef NP_B4_RB
#undef NP_P4_CASE
#undef NP_P4_P
#undef NP_P4_RB
#endif /* NP_SIMD_AVX512 */
