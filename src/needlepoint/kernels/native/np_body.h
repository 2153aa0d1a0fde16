/* The kernels of needlepoint_native.c, included once per instruction-set variant: every
 * function name goes through NP_NAME(), which appends the variant's suffix. */
/* -- A8 + integer Walsh-Hadamard ------------------------------------------------------ */
/* For each row t of x [T, cols]: s = max|x| / 127 (float32 division; 1 when the row is all
 * zero), q = clip(rint(x / s), -128, 127); the row is zero-padded to in_pad and every
 * 128-wide group is rotated by the unnormalised Walsh-Hadamard transform, in integers:
 * v [T, in_pad] int32 (|v| <= 128 * 128). Returns NP_NONFINITE if any x is NaN or inf. */
/* peak = max |x_c| of a row; 0 if any x_c is NaN or inf (max is exact in any order) */
static inline int NP_NAME(np_absmax)(const float *row, int64_t cols, float *peak_out) {
    float peak = 0.0f;
    int finite = 1;
    int64_t c = 0;
#if defined(NP_SIMD_AVX2)
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(3.4028234663852886e38f);
    __m256 vpeak = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (; c + 8 <= cols; c += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(row + c), absmask);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
        vpeak = _mm256_max_ps(vpeak, a);
    }
    if (_mm256_movemask_ps(ok) != 0xff) finite = 0;
    float lanes[8];
    _mm256_storeu_ps(lanes, vpeak);
    for (int j = 0; j < 8; j++)
        if (lanes[j] > peak) peak = lanes[j];
#endif
    for (; c < cols; c++) {
        float a = fabsf(row[c]);
        if (!(a <= 3.4028234663852886e38f)) finite = 0;
        if (a > peak) peak = a;
    }
    *peak_out = peak;
    return finite;
}

/* the unnormalised Walsh-Hadamard transform of one 128-wide int32 group, in place (integer
 * butterflies: exact in any order, |v| <= 128 * 128) */
static inline void NP_NAME(np_fwht128)(int32_t *grp) {
#if defined(NP_SIMD_AVX2)
    __m256i r[16];
    for (int i = 0; i < 16; i++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(grp + 8 * i)), s;
        s = _mm256_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)); /* half 1 */
        x = _mm256_blend_epi32(_mm256_add_epi32(x, s), _mm256_sub_epi32(s, x), 0xAA);
        s = _mm256_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)); /* half 2 */
        x = _mm256_blend_epi32(_mm256_add_epi32(x, s), _mm256_sub_epi32(s, x), 0xCC);
        s = _mm256_permute2x128_si256(x, x, 0x01); /* half 4 */
        r[i] = _mm256_blend_epi32(_mm256_add_epi32(x, s), _mm256_sub_epi32(s, x), 0xF0);
    }
    for (int h = 1; h < 16; h <<= 1) /* halves 8 .. 64: whole registers */
        for (int base = 0; base < 16; base += 2 * h)
            for (int i = base; i < base + h; i++) {
                __m256i a = r[i], b = r[i + h];
                r[i] = _mm256_add_epi32(a, b);
                r[i + h] = _mm256_sub_epi32(a, b);
            }
    for (int i = 0; i < 16; i++) _mm256_storeu_si256((__m256i *)(grp + 8 * i), r[i]);
#else
    for (int half = 1; half < 128; half <<= 1)
        for (int base = 0; base < 128; base += 2 * half)
            for (int j = base; j < base + half; j++) {
                int32_t a = grp[j], b = grp[j + half];
                grp[j] = a + b;
                grp[j + half] = a - b;
            }
#endif
}

static int NP_NAME(np_a8_rotate)(const float *x, int64_t T, int64_t cols, int64_t x_stride, int64_t in_pad,
                 int32_t *v, float *scale) {
    if (in_pad % 128 || cols > in_pad) return NP_BADARG;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * x_stride;
        float peak;
        if (!NP_NAME(np_absmax)(row, cols, &peak)) return NP_NONFINITE;
        float s = peak > 0.0f ? peak / 127.0f : 1.0f;
        scale[t] = s;
        int32_t *out = v + t * in_pad;
        for (int64_t c = 0; c < cols; c++) {
            float q = nearbyintf(row[c] / s);
            if (q > 127.0f) q = 127.0f;
            if (q < -128.0f) q = -128.0f;
            out[c] = (int32_t)q;
        }
        for (int64_t c = cols; c < in_pad; c++) out[c] = 0;
        for (int64_t g = 0; g < in_pad; g += 128) NP_NAME(np_fwht128)(out + g);
    }
    return NP_OK;
}

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

/* -- pinned-order float32 products ----------------------------------------------------- */
/* out[t, n] = (((0 + x[t,0] w[0,n]) + x[t,1] w[1,n]) + ...) in float32, k ascending, every
 * product and sum rounded on its own. The same operations whatever T is. */
static void NP_NAME(np_matmul_seq)(const float *x, int64_t T, int64_t K, int64_t x_stride, const float *w,
                   int64_t N, float *out) {
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * N;
        for (int64_t n = 0; n < N; n++) o[n] = 0.0f;
        const float *xr = x + t * x_stride;
        for (int64_t k = 0; k < K; k++) {
            float a = xr[k];
            const float *wr = w + k * N;
            for (int64_t n = 0; n < N; n++) {
                float prod = a * wr[n];
                o[n] = o[n] + prod;
            }
        }
    }
}

/* -- pinned exp ------------------------------------------------------------------------ */
#ifndef NP_EXP_TAYLOR_DEFINED /* this header is included once per variant; the table once */
#define NP_EXP_TAYLOR_DEFINED
/* Cody-Waite constants (log2 e, ln 2 split high/low) and the degree-11 Taylor coefficients
 * of exp, highest degree first: one table for the scalar and every vector form. */
#define NP_EXP_LOG2E 1.4426950408889634
#define NP_EXP_LN2_HI 0.6931471803691238
#define NP_EXP_LN2_LO 1.9082149292705877e-10
static const double np_exp_taylor[12] = {
    2.505210838544172e-08, 2.755731922398589e-07, 2.7557319223985893e-06,
    2.48015873015873e-05, 0.0001984126984126984, 0.001388888888888889,
    0.008333333333333333, 0.041666666666666664, 0.16666666666666666, 0.5, 1.0, 1.0};
#endif

/* exp of a float32 argument, as float32: Cody-Waite reduction by ln 2 and a degree-11
 * Taylor polynomial in float64 (Horner, no FMA), then one rounding. Plain IEEE operations
 * only, so kernels/exact.py's numpy version gives the same bits on every machine. */
static inline double NP_NAME(np_exp64)(double x) {
    if (x != x) return x;
    if (x < -745.0) return 0.0;
    if (x > 709.0) return INFINITY;
    double k = nearbyint(x * NP_EXP_LOG2E);
    double r = x - k * NP_EXP_LN2_HI;
    r = r - k * NP_EXP_LN2_LO;
    double p = np_exp_taylor[0];
    for (int j = 1; j < 12; j++) p = p * r + np_exp_taylor[j];
    int ki = (int)k;
    if (ki >= -1022 && ki <= 1023) { /* p * 2^k with 2^k a normal double: ldexp's result */
        union { uint64_t u; double d; } two = {(uint64_t)(ki + 1023) << 52};
        return p * two.d;
    }
    return ldexp(p, ki);
}

static float NP_NAME(np_exp32)(float x) { return (float)NP_NAME(np_exp64)((double)x); }

/* -- int8 attention -------------------------------------------------------------------- */
/* One query row (a head of one position) against `n` int8 keys/values of its kv head, in
 * position order: score_j = float32(((dot_j * sq) * sk_j) * inv_sqrt_qk) with dot_j the exact
 * int32 product of the codes; m = max_j score_j; e_j = exp32(score_j - m); total = sum_j e_j
 * (float32, j ascending); p_j = e_j / total; out = sum_j p_j * (vcode_j * sv_j) (float32, j
 * ascending, each product and sum rounded). Keys j are the slots listed in `slots`. */
static void NP_NAME(np_attend)(const int8_t *qcode, const float *qscale, int64_t Q, int64_t qk,
               const int8_t *kcode, const float *kscale, const int8_t *vcode,
               const float *vscale, int64_t vd, const int64_t *slots, const int64_t *count,
               int64_t slots_stride, double inv_sqrt_qk, float *out, float *work) {
    for (int64_t i = 0; i < Q; i++) {
        const int8_t *q = qcode + i * qk;
        double sq = (double)qscale[i];
        int64_t n = count[i];
        const int64_t *sl = slots + i * slots_stride;
        float peak = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            const int8_t *k = kcode + sl[j] * qk;
            int32_t dot = 0;
            for (int64_t e = 0; e < qk; e++) dot += (int32_t)q[e] * (int32_t)k[e];
            double t = (double)dot * sq;
            t = t * (double)kscale[sl[j]];
            t = t * inv_sqrt_qk;
            float score = (float)t;
            work[j] = score;
            if (score > peak) peak = score;
        }
        float total = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float e = NP_NAME(np_exp32)(work[j] - peak);
            work[j] = e;
            total = total + e;
        }
        float *o = out + i * vd;
        for (int64_t e = 0; e < vd; e++) o[e] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float p = work[j] / total;
            const int8_t *vv = vcode + sl[j] * vd;
            float sv = vscale[sl[j]];
            for (int64_t e = 0; e < vd; e++) {
                float value = (float)vv[e] * sv;
                float prod = p * value;
                o[e] = o[e] + prod;
            }
        }
    }
}

/* -- pinned dequantisation ------------------------------------------------------------- */
/* w = R @ H for one row of rotated weights R (codebook[idx] * norm, float32), H the
 * normalised Hadamard matrix (entries +-h, h = float32(1/sqrt(128))), in the order of the
 * reference the fixtures were made with: a row of several groups as one fused multiply-add
 * chain per output over k = 0..127; a row of a single group in blocks of 8 k (a chain from
 * zero per block), the block sums added in order. */

static void NP_NAME(np_dequant_rows)(const float *rotated, int64_t rows, int64_t groups, float h, float *out) {
    float hrow[128][128];
    /* hrow[k][j] = (-1)^popcount(k & j) * h, row k from row k - 2^t (2^t its top bit) by
     * negating the columns with bit t: the same +-h values, built without a popcount each */
    for (int j = 0; j < 128; j++) hrow[0][j] = h;
    for (int t = 1; t < 128; t <<= 1)
        for (int k = t; k < 2 * t; k++)
            for (int j = 0; j < 128; j++) hrow[k][j] = (j & t) ? -hrow[k - t][j] : hrow[k - t][j];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *src = rotated + (r * groups + g) * 128;
            float *dst = out + (r * groups + g) * 128;
            float acc[128];
            if (groups == 1) {
                for (int j = 0; j < 128; j++) acc[j] = 0.0f;
                for (int b = 0; b < 128; b += 8) {
                    float part[128];
                    for (int j = 0; j < 128; j++) part[j] = 0.0f;
                    for (int k = b; k < b + 8; k++)
                        for (int j = 0; j < 128; j++) part[j] = fmaf(src[k], hrow[k][j], part[j]);
                    for (int j = 0; j < 128; j++) acc[j] = acc[j] + part[j];
                }
            } else {
                for (int j = 0; j < 128; j++) acc[j] = 0.0f;
                for (int k = 0; k < 128; k++)
                    for (int j = 0; j < 128; j++) acc[j] = fmaf(src[k], hrow[k][j], acc[j]);
            }
            memcpy(dst, acc, sizeof(acc));
        }
    }
}

/* exp32 of n floats (the same polynomial as np_exp64). The AVX2 variant runs four at a time through the same float64
 * operations (round-to-nearest k, the two-part reduction, Horner without FMA) and scales by
 * 2^k built from its bits, which is ldexp's single rounding whenever 2^k is a normal double;
 * lanes outside [-700, 700] (and NaN) take the scalar path. */
static void NP_NAME(np_exp32_array)(const float *x, int64_t n, float *out) {
    int64_t i = 0;
#if defined(NP_SIMD_AVX512)
    for (; i + 8 <= n; i += 8) { /* the same operations eight at a time */
        __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        __mmask8 ok = _mm512_cmp_pd_mask(v, _mm512_set1_pd(-700.0), _CMP_GE_OQ) &
                      _mm512_cmp_pd_mask(v, _mm512_set1_pd(700.0), _CMP_LE_OQ);
        if (ok != 0xff) {
            for (int j = 0; j < 8; j++) out[i + j] = NP_NAME(np_exp32)(x[i + j]);
            continue;
        }
        __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(v, _mm512_set1_pd(NP_EXP_LOG2E)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512d r = _mm512_sub_pd(v, _mm512_mul_pd(k, _mm512_set1_pd(NP_EXP_LN2_HI)));
        r = _mm512_sub_pd(r, _mm512_mul_pd(k, _mm512_set1_pd(NP_EXP_LN2_LO)));
        __m512d p = _mm512_set1_pd(np_exp_taylor[0]);
        for (int j = 1; j < 12; j++)
            p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(np_exp_taylor[j]));
        __m512i bits = _mm512_slli_epi64(
            _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(k)), _mm512_set1_epi64(1023)), 52);
        __m512d y = _mm512_mul_pd(p, _mm512_castsi512_pd(bits));
        _mm256_storeu_ps(out + i, _mm512_cvtpd_ps(y));
    }
#endif
#if defined(NP_SIMD_AVX2)
    const __m256d lo = _mm256_set1_pd(-700.0), hi = _mm256_set1_pd(700.0);
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        __m256d ok = _mm256_and_pd(_mm256_cmp_pd(v, lo, _CMP_GE_OQ),
                                   _mm256_cmp_pd(v, hi, _CMP_LE_OQ));
        if (_mm256_movemask_pd(ok) != 15) {
            for (int j = 0; j < 4; j++) out[i + j] = NP_NAME(np_exp32)(x[i + j]);
            continue;
        }
        __m256d k = _mm256_round_pd(_mm256_mul_pd(v, _mm256_set1_pd(NP_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256d r = _mm256_sub_pd(v, _mm256_mul_pd(k, _mm256_set1_pd(NP_EXP_LN2_HI)));
        r = _mm256_sub_pd(r, _mm256_mul_pd(k, _mm256_set1_pd(NP_EXP_LN2_LO)));
        __m256d p = _mm256_set1_pd(np_exp_taylor[0]);
        for (int j = 1; j < 12; j++)
            p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(np_exp_taylor[j]));
        __m128i k32 = _mm256_cvtpd_epi32(k);
        __m256i bits = _mm256_slli_epi64(
            _mm256_add_epi64(_mm256_cvtepi32_epi64(k32), _mm256_set1_epi64x(1023)), 52);
        __m256d y = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
        _mm_storeu_ps(out + i, _mm256_cvtpd_ps(y));
    }
#endif
    for (; i < n; i++) out[i] = NP_NAME(np_exp32)(x[i]);
}


/* exp64 of every element of an array (np_exp64). */

static void NP_NAME(np_exp64_array)(const double *x, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++) out[i] = NP_NAME(np_exp64)(x[i]);
}

/* Sinkhorn of every n x n matrix of logits [T, n, n] (models/needle3/sinkhorn.py
 * `sinkhorn_rows` with the pinned exp, operation for operation): K = exp64(z - max z) with the
 * subtraction in float32; `rounds` of r_i = 1 / sum_j K_ij c_j, then c_j = 1 / sum_i K_ij r_i
 * (float64, each sum in index order); out = float32((r_i K_ij) c_j). NP_NONFINITE when a
 * scaling under- or overflows (the caller then takes the reference, which falls back to the
 * log-domain form for that matrix). */
static int NP_NAME(np_sinkhorn)(const float *logits, int64_t T, int64_t n, int rounds,
                                float *out) {
    if (n > 16) return NP_BADARG;
    double K[256], r[16], c[16];
    for (int64_t t = 0; t < T; t++) {
        const float *z = logits + t * n * n;
        float peak = z[0];
        for (int64_t i = 1; i < n * n; i++)
            if (z[i] > peak) peak = z[i];
        for (int64_t i = 0; i < n * n; i++) {
            float shifted = z[i] - peak;
            K[i] = NP_NAME(np_exp64)((double)shifted);
        }
        for (int64_t j = 0; j < n; j++) c[j] = 1.0;
        for (int round = 0; round < rounds; round++) {
            for (int64_t i = 0; i < n; i++) {
                double sum = K[i * n] * c[0];
                for (int64_t j = 1; j < n; j++) sum = sum + K[i * n + j] * c[j];
                r[i] = 1.0 / sum;
            }
            for (int64_t j = 0; j < n; j++) {
                double sum = K[j] * r[0];
                for (int64_t i = 1; i < n; i++) sum = sum + K[i * n + j] * r[i];
                c[j] = 1.0 / sum;
            }
        }
        float *o = out + t * n * n;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) {
                double v = (r[i] * K[i * n + j]) * c[j];
                if (!(v <= 1.7976931348623157e308) || v != v) return NP_NONFINITE;
                o[i * n + j] = (float)v;
            }
    }
    return NP_OK;
}

/* A8 codes of each row of x [T, cols] as int8 plus one float32 scale (np_a8_rotate without
 * the rotation): the int8 KV cache and the int8 queries. */
static int NP_NAME(np_a8_codes)(const float *x, int64_t T, int64_t cols, int8_t *codes,
                                float *scale) {
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * cols;
        float peak;
        if (!NP_NAME(np_absmax)(row, cols, &peak)) return NP_NONFINITE;
        float s = peak > 0.0f ? peak / 127.0f : 1.0f;
        scale[t] = s;
        for (int64_t c = 0; c < cols; c++) {
            float q = nearbyintf(row[c] / s);
            if (q > 127.0f) q = 127.0f;
            if (q < -128.0f) q = -128.0f;
            codes[t * cols + c] = (int8_t)q;
        }
    }
    return NP_OK;
}

/* The Hadamard (Monarch) MLP of models/needle3/mlp.py `hadamard_mlp(pinned=True)`, operation
 * for operation, for each row of x [T, d] -> out [T, d] (fixture README step 5):
 * cond = 1 + softmax(x cond_v) cond_u (products summed in index order, the softmax's 8-term
 * sum as numpy reduces a contiguous row of 8: ((e0+e1)+(e2+e3))+((e4+e5)+(e6+e7)));
 * z = d1 * pad(x); z = K1(z)[p1]; z = K2(silu(d2 cond z + b2))[p2]; out = (d4 * K3(d3 z))[:d],
 * K(z) = flatten(wa^T Z wb) for Z = z as [ba, bb]: Y = Z wb, then wa^T Y, each in index order. */
#if defined(NP_SIMD_AVX2)
/* out[x][0..32) = sum_y A(x, y) * B[y][0..32) for two rows x at once, y ascending (each output
 * lane's products added in index order, as the scalar loops), A(x, y) = a[x * xs + y * ys],
 * the 32 output lanes of both rows held in registers across the sum */
static inline void NP_NAME(np_mm32_pair)(const float *a, int64_t xs, int64_t ys, int64_t inner,
                                         const float *B, float *out) {
    __m256 r0 = _mm256_setzero_ps(), r1 = r0, r2 = r0, r3 = r0;
    __m256 t0 = r0, t1 = r0, t2 = r0, t3 = r0;
    for (int64_t y = 0; y < inner; y++) {
        const float *w = B + y * 32;
        __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
        __m256 w2 = _mm256_loadu_ps(w + 16), w3 = _mm256_loadu_ps(w + 24);
        __m256 u = _mm256_set1_ps(a[y * ys]), v = _mm256_set1_ps(a[xs + y * ys]);
        r0 = _mm256_add_ps(r0, _mm256_mul_ps(u, w0));
        r1 = _mm256_add_ps(r1, _mm256_mul_ps(u, w1));
        r2 = _mm256_add_ps(r2, _mm256_mul_ps(u, w2));
        r3 = _mm256_add_ps(r3, _mm256_mul_ps(u, w3));
        t0 = _mm256_add_ps(t0, _mm256_mul_ps(v, w0));
        t1 = _mm256_add_ps(t1, _mm256_mul_ps(v, w1));
        t2 = _mm256_add_ps(t2, _mm256_mul_ps(v, w2));
        t3 = _mm256_add_ps(t3, _mm256_mul_ps(v, w3));
    }
    _mm256_storeu_ps(out, r0), _mm256_storeu_ps(out + 8, r1);
    _mm256_storeu_ps(out + 16, r2), _mm256_storeu_ps(out + 24, r3);
    _mm256_storeu_ps(out + 32, t0), _mm256_storeu_ps(out + 40, t1);
    _mm256_storeu_ps(out + 48, t2), _mm256_storeu_ps(out + 56, t3);
}
#endif

static void NP_NAME(np_monarch_row)(const float *z, int64_t ba, int64_t bb, const float *wa,
                                    const float *wb, float *right, float *out) {
    /* right[a][b] = sum_j z[a][j] wb[j][b] and out[i][b] = sum_a right[a][b] wa[a][i], each
     * output's terms added in index order; the loops run the output index b innermost so the
     * compiler vectorises across outputs, never across a sum. */
#if defined(NP_SIMD_AVX2)
    if (bb == 32 && ba % 2 == 0) {
        for (int64_t a = 0; a < ba; a += 2)
            NP_NAME(np_mm32_pair)(z + a * bb, bb, 1, bb, wb, right + a * bb);
        for (int64_t i = 0; i < ba; i += 2)
            NP_NAME(np_mm32_pair)(wa + i, 1, ba, ba, right, out + i * bb);
        return;
    }
#endif
    for (int64_t a = 0; a < ba; a++) {
        float *r = right + a * bb;
        for (int64_t b = 0; b < bb; b++) r[b] = 0.0f;
        for (int64_t j = 0; j < bb; j++) {
            float zj = z[a * bb + j];
            const float *w = wb + j * bb;
            for (int64_t b = 0; b < bb; b++) {
                float prod = zj * w[b];
                r[b] = r[b] + prod;
            }
        }
    }
    for (int64_t i = 0; i < ba * bb; i++) out[i] = 0.0f;
    for (int64_t a = 0; a < ba; a++) {
        const float *r = right + a * bb;
        for (int64_t i = 0; i < ba; i++) {
            float w = wa[a * ba + i];
            float *o = out + i * bb;
            for (int64_t b = 0; b < bb; b++) {
                float prod = r[b] * w;
                o[b] = o[b] + prod;
            }
        }
    }
}

static int NP_NAME(np_hadamard_mlp)(const float *x, int64_t T, int64_t d, int64_t n, int64_t ba,
                                    int64_t bb, const float *const *vec, const float *const *mats,
                                    const float *cond_v, const float *cond_u, int64_t rank,
                                    const int64_t *p1, const int64_t *p2, float *out) {
    if (rank != 8 || ba * bb != n) return NP_BADARG;
    const float *d1 = vec[0], *d2 = vec[1], *b2 = vec[2], *d3 = vec[3], *d4 = vec[4];
    float *work = (float *)malloc(sizeof(float) * (size_t)(5 * n));
    if (!work) return NP_NOMEM;
    float *z = work, *m = work + n, *right = work + 2 * n, *cond = work + 3 * n, *act = work + 4 * n;
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * d;
        float logits[8], e[8];
        for (int k = 0; k < 8; k++) logits[k] = 0.0f;
        for (int64_t j = 0; j < d; j++) {
            float xj = xr[j];
            for (int k = 0; k < 8; k++) {
                float prod = xj * cond_v[j * 8 + k];
                logits[k] = logits[k] + prod;
            }
        }
        float peak = logits[0];
        for (int k = 1; k < 8; k++)
            if (logits[k] > peak) peak = logits[k];
        for (int k = 0; k < 8; k++) e[k] = NP_NAME(np_exp32)(logits[k] - peak);
        float total = ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
        for (int k = 0; k < 8; k++) e[k] = e[k] / total;
        for (int64_t c = 0; c < n; c++) cond[c] = 0.0f;
        for (int k = 0; k < 8; k++)
            for (int64_t c = 0; c < n; c++) {
                float prod = e[k] * cond_u[k * n + c];
                cond[c] = cond[c] + prod;
            }
        for (int64_t c = 0; c < n; c++) cond[c] = cond[c] + 1.0f;
        for (int64_t c = 0; c < n; c++) z[c] = c < d ? d1[c] * xr[c] : 0.0f;
        NP_NAME(np_monarch_row)(z, ba, bb, mats[0], mats[1], right, m);
        for (int64_t c = 0; c < n; c++) z[c] = m[p1[c]];
        for (int64_t c = 0; c < n; c++) { /* silu(a) = a * (1 / (exp32(-a) + 1)) */
            float a = d2[c] * cond[c];
            a = a * z[c];
            a = a + b2[c];
            act[c] = a;
            m[c] = -a;
        }
        NP_NAME(np_exp32_array)(m, n, m);
        for (int64_t c = 0; c < n; c++) {
            float s = m[c] + 1.0f;
            s = 1.0f / s;
            act[c] = act[c] * s;
        }
        NP_NAME(np_monarch_row)(act, ba, bb, mats[2], mats[3], right, m);
        for (int64_t c = 0; c < n; c++) z[c] = m[p2[c]];
        for (int64_t c = 0; c < n; c++) z[c] = z[c] * d3[c];
        NP_NAME(np_monarch_row)(z, ba, bb, mats[4], mats[5], right, m);
        float *o = out + t * d;
        for (int64_t c = 0; c < d; c++) o[c] = m[c] * d4[c];
    }
    free(work);
    return NP_OK;
}
