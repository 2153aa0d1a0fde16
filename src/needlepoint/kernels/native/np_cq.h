/* Exact CQ x A8 products (docs/numerics.md "Exact CQ x A8 products"): the float64 table,
 * direct and AVX2 kernels, the integer kernels (np_cq_int.h) and np_cq_matmul, which picks
 * among them. Included once per instruction-set variant (np_variant.h). */
/* -- exact CQ x A8 products ------------------------------------------------------------ */

/* D = sum_c codebook[idx_c] * v_c of one (row, group), in float64. Every product is a
 * multiple of the codebook's smallest quantum and the partial sums stay below 2^53 quanta
 * (checked by the caller, exact.check_codebook), so the sum is exact in any order. The
 * epilogue is pinned: acc = sum_g (norm_g * D_g) in group order, y = (acc * s) * 2^-3.5. */
static inline float NP_NAME(np_epilogue)(const double *dots, const float *norms, int64_t groups,
                                double s) {
    double acc = 0.0;
    for (int64_t g = 0; g < groups; g++) {
        double term = (double)norms[g] * dots[g];
        acc = acc + term;
    }
    double y = acc * s;
    y = y * 0.08838834764831845; /* 1 / sqrt(128) as a float64 */
    return (float)y;
}

/* Byte tables: for 2-bit storage, position j covers columns 4j..4j+3 and
 * table[j][b] = sum_{s<4} cb[(b >> 2s) & 3] * v[4j + s]; for 4-bit, columns 2j, 2j+1 and
 * table[j][b] = cb[b & 15] * v[2j] + cb[b >> 4] * v[2j + 1]. Each entry is exact. */
static void NP_NAME(np_build_tables)(const int32_t *v, int64_t in_pad, int storage_bits,
                            const double *cb, double *table) {
    if (storage_bits == 2) {
        int64_t positions = in_pad / 4;
        for (int64_t j = 0; j < positions; j++) {
            double lo[16], hi[16];
            double v0 = v[4 * j], v1 = v[4 * j + 1], v2 = v[4 * j + 2], v3 = v[4 * j + 3];
            for (int a = 0; a < 16; a++) {
                lo[a] = cb[a & 3] * v0 + cb[a >> 2] * v1;
                hi[a] = cb[a & 3] * v2 + cb[a >> 2] * v3;
            }
            double *t = table + j * 256;
            for (int h = 0; h < 16; h++)
                for (int l = 0; l < 16; l++) t[h * 16 + l] = lo[l] + hi[h];
        }
    } else { /* 4 */
        int64_t positions = in_pad / 2;
        for (int64_t j = 0; j < positions; j++) {
            double lo[16], hi[16];
            double v0 = v[2 * j], v1 = v[2 * j + 1];
            for (int a = 0; a < 16; a++) {
                lo[a] = cb[a] * v0;
                hi[a] = cb[a] * v1;
            }
            double *t = table + j * 256;
            for (int h = 0; h < 16; h++)
                for (int l = 0; l < 16; l++) t[h * 16 + l] = lo[l] + hi[h];
        }
    }
}

static void NP_NAME(np_rows_by_table)(const double *table, const np_cq_part *part, int64_t groups,
                             int64_t bytes_per_group, int64_t r0, int64_t r1, double s,
                             float *out_row, double *dots) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = part->packed + r * part->row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            const double *t = table + g * bytes_per_group * 256;
            const uint8_t *b = p + g * bytes_per_group;
            double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            for (int64_t k = 0; k < bytes_per_group; k += 4) {
                a0 += t[(k + 0) * 256 + b[k + 0]];
                a1 += t[(k + 1) * 256 + b[k + 1]];
                a2 += t[(k + 2) * 256 + b[k + 2]];
                a3 += t[(k + 3) * 256 + b[k + 3]];
            }
            dots[g] = (a0 + a1) + (a2 + a3);
        }
        out_row[part->out_col + r] = NP_NAME(np_epilogue)(dots, part->norms + r * groups, groups, s);
    }
}

/* Codes of any storage width, one at a time (1- and 3-bit storage; small matrices). */
static inline int NP_NAME(np_code)(const uint8_t *p, int64_t c, int bits) {
    int64_t bit = c * bits;
    int64_t byte = bit >> 3;
    int shift = (int)(bit & 7);
    unsigned word = p[byte] | ((bit + bits > (byte + 1) * 8) ? (unsigned)p[byte + 1] << 8 : 0u);
    return (int)((word >> shift) & ((1u << bits) - 1u));
}

static void NP_NAME(np_rows_direct)(const int32_t *v, const double *cb, int storage_bits,
                           const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1,
                           double s, float *out_row, double *dots) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = part->packed + r * part->row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            double acc = 0.0;
            if (storage_bits == 2) {
                const uint8_t *b = p + g * 32;
                const int32_t *x = v + g * 128;
                for (int k = 0; k < 32; k++) {
                    unsigned byte = b[k];
                    acc += cb[byte & 3] * x[4 * k] + cb[(byte >> 2) & 3] * x[4 * k + 1] +
                           cb[(byte >> 4) & 3] * x[4 * k + 2] + cb[byte >> 6] * x[4 * k + 3];
                }
            } else if (storage_bits == 4) {
                const uint8_t *b = p + g * 64;
                const int32_t *x = v + g * 128;
                for (int k = 0; k < 64; k++) {
                    unsigned byte = b[k];
                    acc += cb[byte & 15] * x[2 * k] + cb[byte >> 4] * x[2 * k + 1];
                }
            } else {
                for (int64_t c = g * 128; c < (g + 1) * 128; c++)
                    acc += cb[NP_NAME(np_code)(p, c, storage_bits)] * v[c];
            }
            dots[g] = acc;
        }
        out_row[part->out_col + r] = NP_NAME(np_epilogue)(dots, part->norms + r * groups, groups, s);
    }
}

/* y[t, out_col + r] for every part and row: the exact CQ x A8 product of the prepared
 * activation (v, s) = NP_NAME(np_a8_rotate)(x). Parts share one storage width and codebook. Rows in
 * [r_first, r_last) of the concatenation of the parts (so callers may split the rows of a
 * product between threads). */

#ifdef NP_SIMD_AVX2
#define NP_RB 4

/* 2-bit storage: one packed byte is four codes, and a 256-entry table of their four levels as
 * float64 (8 KB, L1-resident) turns it into one 256-bit load; four accumulator chains per row
 * hide the fused multiply-add latency. Exact sums, so equal to np_rows_direct. */
static inline __attribute__((always_inline)) void NP_NAME(np_simd2_block)(
    const double *vd, const int nrb, int64_t in_pad, const double *levels4,
    const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1, const double *s,
    float *out, int64_t out_stride, double *dots) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = part->packed + r * part->row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            __m256d acc[NP_RB][4];
            for (int b = 0; b < nrb; b++)
                for (int u = 0; u < 4; u++) acc[b][u] = _mm256_setzero_pd();
            const uint8_t *bytes = p + g * 32;
            const double *col = vd + g * 128;
            for (int k = 0; k < 32; k += 4) {
                for (int u = 0; u < 4; u++) {
                    __m256d lv = _mm256_load_pd(levels4 + 4 * bytes[k + u]);
                    for (int b = 0; b < nrb; b++)
                        acc[b][u] = _mm256_fmadd_pd(
                            lv, _mm256_loadu_pd(col + b * in_pad + 4 * (k + u)), acc[b][u]);
                }
            }
            for (int b = 0; b < nrb; b++) {
                __m256d sum = _mm256_add_pd(_mm256_add_pd(acc[b][0], acc[b][1]),
                                            _mm256_add_pd(acc[b][2], acc[b][3]));
                __m128d half = _mm_add_pd(_mm256_castpd256_pd128(sum),
                                          _mm256_extractf128_pd(sum, 1));
                dots[b * groups + g] = _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
            }
        }
        for (int b = 0; b < nrb; b++)
            out[b * out_stride + part->out_col + r] =
                NP_NAME(np_epilogue)(dots + b * groups, part->norms + r * groups, groups, s[b]);
    }
}

/* 4-bit storage: a byte is two codes; a 256-entry table of their two levels as float64
 * (4 KB) gives them in one 128-bit load, two bytes make one 256-bit operand. */
static inline __attribute__((always_inline)) void NP_NAME(np_simd4_block)(
    const double *vd, const int nrb, int64_t in_pad, const double *levels2,
    const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1, const double *s,
    float *out, int64_t out_stride, double *dots) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = part->packed + r * part->row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            __m256d acc[NP_RB][4];
            for (int b = 0; b < nrb; b++)
                for (int u = 0; u < 4; u++) acc[b][u] = _mm256_setzero_pd();
            const uint8_t *bytes = p + g * 64;
            const double *col = vd + g * 128;
            for (int k = 0; k < 64; k += 8) {
                for (int u = 0; u < 4; u++) {
                    int j = k + 2 * u;
                    __m256d lv = _mm256_insertf128_pd(
                        _mm256_castpd128_pd256(_mm_load_pd(levels2 + 2 * bytes[j])),
                        _mm_load_pd(levels2 + 2 * bytes[j + 1]), 1);
                    for (int b = 0; b < nrb; b++)
                        acc[b][u] = _mm256_fmadd_pd(
                            lv, _mm256_loadu_pd(col + b * in_pad + 2 * j), acc[b][u]);
                }
            }
            for (int b = 0; b < nrb; b++) {
                __m256d sum = _mm256_add_pd(_mm256_add_pd(acc[b][0], acc[b][1]),
                                            _mm256_add_pd(acc[b][2], acc[b][3]));
                __m128d half = _mm_add_pd(_mm256_castpd256_pd128(sum),
                                          _mm256_extractf128_pd(sum, 1));
                dots[b * groups + g] = _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
            }
        }
        for (int b = 0; b < nrb; b++)
            out[b * out_stride + part->out_col + r] =
                NP_NAME(np_epilogue)(dots + b * groups, part->norms + r * groups, groups, s[b]);
    }
}

static void NP_NAME(np_cq_simd)(const int32_t *v, const float *scale, int64_t T,
                                int64_t in_pad, int storage_bits, const float *codebook,
                                int64_t codebook_len, const np_cq_part *parts, int64_t n_parts,
                                float *out, int64_t out_stride, int64_t r_first,
                                int64_t r_last, double *vd, double *dots) {
    float cb16[16] = {0};
    for (int64_t k = 0; k < codebook_len && k < 16; k++) cb16[k] = codebook[k];
    int64_t groups = in_pad / 128;
    double levels4[256 * 4] __attribute__((aligned(32)));
    if (storage_bits == 2)
        for (int b = 0; b < 256; b++)
            for (int u = 0; u < 4; u++) levels4[4 * b + u] = (double)cb16[(b >> (2 * u)) & 3];
    double levels2[256 * 2] __attribute__((aligned(32)));
    if (storage_bits == 4)
        for (int b = 0; b < 256; b++) {
            levels2[2 * b] = (double)cb16[b & 15];
            levels2[2 * b + 1] = (double)cb16[b >> 4];
        }
    for (int64_t t0 = 0; t0 < T; t0 += NP_RB) {
        int nrb = (int)(T - t0 < NP_RB ? T - t0 : NP_RB);
        double s[NP_RB];
        for (int b = 0; b < nrb; b++) {
            s[b] = (double)scale[t0 + b];
            for (int64_t c = 0; c < in_pad; c++) vd[b * in_pad + c] = (double)v[(t0 + b) * in_pad + c];
        }
        int64_t base = 0;
        for (int64_t p = 0; p < n_parts; p++) {
            int64_t lo = r_first > base ? r_first - base : 0;
            int64_t hi = r_last - base < parts[p].rows ? r_last - base : parts[p].rows;
            if (lo < hi) {
                float *o = out + t0 * out_stride;
                if (storage_bits == 2) {
                    switch (nrb) {
                    case 4: NP_NAME(np_simd2_block)(vd, 4, in_pad, levels4, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                    case 3: NP_NAME(np_simd2_block)(vd, 3, in_pad, levels4, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                    case 2: NP_NAME(np_simd2_block)(vd, 2, in_pad, levels4, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                    default: NP_NAME(np_simd2_block)(vd, 1, in_pad, levels4, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                    }
                } else switch (nrb) {
                case 4: NP_NAME(np_simd4_block)(vd, 4, in_pad, levels2, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                case 3: NP_NAME(np_simd4_block)(vd, 3, in_pad, levels2, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                case 2: NP_NAME(np_simd4_block)(vd, 2, in_pad, levels2, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                default: NP_NAME(np_simd4_block)(vd, 1, in_pad, levels2, &parts[p], groups, lo, hi, s, o, out_stride, dots); break;
                }
            }
            base += parts[p].rows;
        }
    }
}
#endif

#include "np_cq_int.h"

static int NP_NAME(np_cq_matmul)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                 int storage_bits, const float *codebook, int64_t codebook_len,
                 const np_cq_part *parts, int64_t n_parts, float *out, int64_t out_stride,
                 int64_t r_first, int64_t r_last) {
    if (in_pad % 128) return NP_BADARG;
    int64_t groups = in_pad / 128;
    double cb[256];
    if (codebook_len > 256) return NP_BADARG;
    for (int64_t k = 0; k < codebook_len; k++) cb[k] = (double)codebook[k];
    for (int64_t k = codebook_len; k < 256; k++) cb[k] = 0.0;
    int64_t total = 0;
    for (int64_t p = 0; p < n_parts; p++) total += parts[p].rows;
    if (r_last > total) r_last = total;
    int64_t span = r_last - r_first;
    { /* the integer kernels (np_cq_int.h) where they cover the product */
        int status = NP_NAME(np_cq_int)(v, scale, T, in_pad, storage_bits, codebook,
                                        codebook_len, cb, parts, n_parts, out, out_stride,
                                        r_first, r_last);
        if (status != NP_BADARG) return status;
    }
#ifdef NP_SIMD_AVX2
    if ((storage_bits == 2 || storage_bits == 4) && codebook_len <= 16) {
        double *vd = (double *)malloc(sizeof(double) * (size_t)(NP_RB * in_pad));
        double *dots4 = (double *)malloc(sizeof(double) * (size_t)(NP_RB * groups));
        if (!vd || !dots4) {
            free(vd);
            free(dots4);
            return NP_NOMEM;
        }
        NP_NAME(np_cq_simd)(v, scale, T, in_pad, storage_bits, codebook, codebook_len, parts,
                            n_parts, out, out_stride, r_first, r_last, vd, dots4);
        free(vd);
        free(dots4);
        return NP_OK;
    }
#endif
    /* tables pay off once enough rows share them (their build costs ~1.2 row sweeps) */
    int use_table = (storage_bits == 2 || storage_bits == 4) && span >= 64;
    int64_t bytes_per_group = storage_bits == 2 ? 32 : 64;
    double *table = NULL;
    double *dots = (double *)malloc(sizeof(double) * (size_t)(groups > 0 ? groups : 1));
    if (!dots) return NP_NOMEM;
    if (use_table) {
        table = (double *)malloc(sizeof(double) * 256 * (size_t)(groups * bytes_per_group));
        if (!table) {
            free(dots);
            return NP_NOMEM;
        }
    }
    for (int64_t t = 0; t < T; t++) {
        const int32_t *row = v + t * in_pad;
        double s = (double)scale[t];
        float *out_row = out + t * out_stride;
        if (use_table) NP_NAME(np_build_tables)(row, in_pad, storage_bits, cb, table);
        int64_t base = 0;
        for (int64_t p = 0; p < n_parts; p++) {
            int64_t lo = r_first > base ? r_first - base : 0;
            int64_t hi = r_last - base < parts[p].rows ? r_last - base : parts[p].rows;
            if (lo < hi) {
                if (use_table)
                    NP_NAME(np_rows_by_table)(table, &parts[p], groups, bytes_per_group, lo, hi, s,
                                     out_row, dots);
                else
                    NP_NAME(np_rows_direct)(row, cb, storage_bits, &parts[p], groups, lo, hi, s,
                                   out_row, dots);
            }
            base += parts[p].rows;
        }
    }
    free(table);
    free(dots);
    return NP_OK;
}
