/* Pinned-order float kernels (docs/numerics.md): the float32 products, the dequantised
 * rows, Sinkhorn and the Hadamard (Monarch) MLP, each the numpy reference's operations in its
 * order. Included once per instruction-set variant (np_variant.h); needs np_exp.h. */
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

/* Sinkhorn of every n x n matrix of logits [T, n, n] (`models.ops.sinkhorn_reference`,
 * operation for operation): K = exp64(z - max z) with the
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
