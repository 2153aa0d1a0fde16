/* Exact integer products over GGUF weight blocks as stored (kernels/blockweight.py is the
 * contract and the numpy reference; both give the same bits, tests/kernels/test_wtypes_native.py).
 * Included once per instruction-set variant (np_variant.h); every name through NP_NAME().
 *
 * A tile of WT_R = 4 weight rows is unpacked once into the generic form (kernels/wtypes_unpack.py:
 * per block of 32 inputs int8 codes, sub-scales s0 / s1, float32 a and m, min sub-scales u0 / u1)
 * in a small buffer, then dotted against every activation row: a decode step (T = 1) reads
 * each weight byte once; a prefill chunk unpacks each tile once for all its rows. Per output
 * and row, over the blocks in order: P = s0 * dot(x[0:16], q[0:16]) + s1 * dot(x[16:32],
 * q[16:32]) (exact int32, any order), M = u0 * sum(x[0:16]) + u1 * sum(x[16:32]) (exact),
 * inner = a * P (+ m * M for the types with an offset; the others add +0 in the reference,
 * which no sign of zero survives: acc starts at +0), term = inner * xs, acc = acc + term, all
 * float64 with no FMA (-ffp-contract=off); y = float32(acc) (+ bias). The SIMD variants form
 * the dots with the sign trick (|q| unsigned times x with q's sign: vpmaddubsw + vpmaddwd on
 * AVX2, vpdpbusd on AVX-512 VNNI) and run the epilogue of the tile's 4 outputs in one float64
 * vector: the same IEEE operations, per output, in the same order. */

#ifndef NP_WT_ONCE
#define NP_WT_ONCE
#define WT_R 4
#define WT_Q8_0 1
#define WT_Q4_0 2
#define WT_Q4_1 3
#define WT_Q5_0 4
#define WT_Q5_1 5
#define WT_IQ4_NL 6
#define WT_Q2_K 7
#define WT_Q3_K 8
#define WT_Q4_K 9
#define WT_Q5_K 10
#define WT_Q6_K 11
#define WT_LAST 11

/* A tile's unpacked blocks, block-major: block b of tile row r at index b * WT_R + r. */
typedef struct {
    int8_t *q;        /* [nb][WT_R][32] codes */
    int32_t *s;       /* [nb][WT_R][8]: s0 x 4, s1 x 4 */
    float *a, *m;     /* [nb][WT_R] */
    int32_t *u0, *u1; /* [nb][WT_R] */
} wt_tile;

static const int8_t wt_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

static inline int wt_has_offset(int t) {
    return t == WT_Q4_1 || t == WT_Q5_1 || t == WT_Q2_K || t == WT_Q4_K || t == WT_Q5_K;
}

/* Bytes per block (per super-block for the K-quants) and 32-blocks in it. */
static inline int64_t wt_block_bytes(int t) {
    static const int64_t size[WT_LAST + 1] = {0, 34, 18, 20, 22, 24, 18, 84, 110, 144, 176, 210};
    return size[t];
}

static inline float wt_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return i8_half(h);
}

/* ggml's get_scale_min_k4: 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K. */
static inline void wt_k4(const uint8_t *q, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q3_K's scale of 16-value sub-block i (0..15), minus 32. */
static inline int wt_q3_scale(const uint8_t *q, int i) {
    int low = i < 8 ? q[i] & 0xF : q[i - 8] >> 4;
    int high = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (low | (high << 4)) - 32;
}

static inline void wt_scalars(const wt_tile *W, int64_t at, int s0, int s1, float a, float m,
                              int u0, int u1) {
    for (int i = 0; i < 4; i++) {
        W->s[at * 8 + i] = s0;
        W->s[at * 8 + 4 + i] = s1;
    }
    W->a[at] = a;
    W->m[at] = m;
    W->u0[at] = u0;
    W->u1[at] = u1;
}

/* Block b of a row: its scalars (the generic form), the pointer its codes come from. */
static inline void wt_block_scalars(int t, const uint8_t *row, int64_t b, const wt_tile *W,
                                    int64_t at) {
    const uint8_t *k = row + (b / 8) * wt_block_bytes(t);
    int j = (int)(b % 8), sc, mn;
    switch (t) {
    case WT_Q8_0: case WT_Q4_0: case WT_Q5_0: case WT_IQ4_NL:
        wt_scalars(W, at, 1, 1, wt_f16(row + b * wt_block_bytes(t)), 0.0f, 0, 0);
        break;
    case WT_Q4_1: case WT_Q5_1: {
        const uint8_t *blk = row + b * wt_block_bytes(t);
        wt_scalars(W, at, 1, 1, wt_f16(blk), wt_f16(blk + 2), 1, 1);
        break;
    }
    case WT_Q2_K:
        wt_scalars(W, at, k[2 * j] & 15, k[2 * j + 1] & 15, wt_f16(k + 80), -wt_f16(k + 82),
                   k[2 * j] >> 4, k[2 * j + 1] >> 4);
        break;
    case WT_Q3_K:
        wt_scalars(W, at, wt_q3_scale(k + 96, 2 * j), wt_q3_scale(k + 96, 2 * j + 1),
                   wt_f16(k + 108), 0.0f, 0, 0);
        break;
    case WT_Q4_K: case WT_Q5_K:
        wt_k4(k + 4, j, &sc, &mn);
        wt_scalars(W, at, sc, sc, wt_f16(k), -wt_f16(k + 2), mn, mn);
        break;
    default: /* WT_Q6_K */
        wt_scalars(W, at, (int8_t)k[192 + 2 * j], (int8_t)k[192 + 2 * j + 1], wt_f16(k + 208),
                   0.0f, 0, 0);
    }
}

/* Block b's 32 codes, one value at a time (the portable unpack). */
static inline void wt_codes_scalar(int t, const uint8_t *row, int64_t b, int8_t *q) {
    const uint8_t *blk = row + b * wt_block_bytes(t), *k = row + (b / 8) * wt_block_bytes(t);
    int j = (int)(b % 8), n = j / 4, jj = j % 4, g = j / 2, h = j % 2;
    for (int i = 0; i < 32; i++) {
        int nib = 0, fifth = 0, c;
        if (t >= WT_Q4_0 && t <= WT_IQ4_NL) {
            int at = t == WT_Q4_0 || t == WT_IQ4_NL ? 2 : t == WT_Q4_1 ? 4 : t == WT_Q5_0 ? 6 : 8;
            uint8_t byte = blk[at + i % 16];
            nib = i < 16 ? byte & 15 : byte >> 4;
            if (t == WT_Q5_0 || t == WT_Q5_1) {
                uint32_t qh;
                memcpy(&qh, blk + (t == WT_Q5_0 ? 2 : 4), 4);
                fifth = (int)((qh >> i) & 1) << 4;
            }
        }
        switch (t) {
        case WT_Q8_0: c = (int8_t)blk[2 + i]; break;
        case WT_Q4_0: c = nib - 8; break;
        case WT_Q4_1: c = nib; break;
        case WT_Q5_0: c = (nib | fifth) - 16; break;
        case WT_Q5_1: c = nib | fifth; break;
        case WT_IQ4_NL: c = wt_iq4nl[nib]; break;
        case WT_Q2_K: c = (k[16 + 32 * n + i] >> (2 * jj)) & 3; break;
        case WT_Q3_K:
            c = ((k[32 + 32 * n + i] >> (2 * jj)) & 3) - (((k[i] >> (4 * n + jj)) & 1) ? 0 : 4);
            break;
        case WT_Q4_K: c = (k[16 + 32 * g + i] >> (4 * h)) & 15; break;
        case WT_Q5_K:
            c = ((k[48 + 32 * g + i] >> (4 * h)) & 15) | (((k[16 + i] >> (2 * g + h)) & 1) << 4);
            break;
        default: { /* WT_Q6_K */
            int low = (k[64 * n + 32 * (jj % 2) + i] >> (4 * (jj / 2))) & 15;
            int high = (k[128 + 32 * n + i] >> (2 * jj)) & 3;
            c = (low | (high << 4)) - 32;
        }
        }
        q[i] = (int8_t)c;
    }
}
#endif /* NP_WT_ONCE */

#if defined(NP_SIMD_AVX2)
/* Block b's 32 codes in one vector: whole-byte shifts and masks of 32 stored bytes. */
static inline __m256i NP_NAME(wt_codes)(int t, const uint8_t *row, int64_t b) {
    const uint8_t *blk = row + b * wt_block_bytes(t), *k = row + (b / 8) * wt_block_bytes(t);
    int j = (int)(b % 8), n = j / 4, jj = j % 4, g = j / 2, h = j % 2;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    if (t == WT_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    if (t <= WT_IQ4_NL) {
        int at = t == WT_Q4_0 || t == WT_IQ4_NL ? 2 : t == WT_Q4_1 ? 4 : t == WT_Q5_0 ? 6 : 8;
        __m128i qs = _mm_loadu_si128((const __m128i *)(blk + at));
        __m256i v = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), m4);
        if (t == WT_Q4_0) return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
        if (t == WT_IQ4_NL) {
            __m128i table = _mm_loadu_si128((const __m128i *)wt_iq4nl);
            return _mm256_shuffle_epi8(_mm256_set_m128i(table, table), v);
        }
        if (t == WT_Q4_1) return v;
        uint32_t qh; /* Q5: bit i of qh -> byte i (ggml's bytes_from_bits_32) */
        memcpy(&qh, blk + (t == WT_Q5_0 ? 2 : 4), 4);
        __m256i bits = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL,
                              0));
        bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)),
                                 _mm256_set1_epi64x(-1));
        v = _mm256_or_si256(v, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
        return t == WT_Q5_0 ? _mm256_sub_epi8(v, _mm256_set1_epi8(16)) : v;
    }
    __m128i sh;
    switch (t) {
    case WT_Q2_K: case WT_Q3_K: {
        sh = _mm_cvtsi32_si128(2 * jj);
        __m256i low = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(k + (t == WT_Q2_K ? 16 : 32) + 32 * n)), sh),
            m2);
        if (t == WT_Q2_K) return low;
        __m256i high = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)k), _mm_cvtsi32_si128(4 * n + jj)),
            m1);
        return _mm256_sub_epi8(low, _mm256_slli_epi16(_mm256_xor_si256(high, m1), 2));
    }
    case WT_Q4_K: case WT_Q5_K: {
        sh = _mm_cvtsi32_si128(4 * h);
        __m256i v = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(k + (t == WT_Q4_K ? 16 : 48) + 32 * g)), sh),
            m4);
        if (t == WT_Q4_K) return v;
        __m256i fifth = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(k + 16)), _mm_cvtsi32_si128(2 * g + h)),
            m1);
        return _mm256_or_si256(v, _mm256_slli_epi16(fifth, 4));
    }
    default: { /* WT_Q6_K */
        __m256i low = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(k + 64 * n + 32 * (jj % 2))),
                             _mm_cvtsi32_si128(4 * (jj / 2))),
            m4);
        __m256i high = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(k + 128 + 32 * n)),
                             _mm_cvtsi32_si128(2 * jj)),
            m2);
        return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                               _mm256_set1_epi8(32));
    }
    }
}
#endif

/* Tile rows r < nr of weight rows row0.. into W (rows nr..WT_R-1: zero codes and scales). */
static void NP_NAME(wt_unpack)(int t, const uint8_t *row0, int64_t row_bytes, int nr,
                               int64_t nb, const wt_tile *W) {
    for (int r = 0; r < WT_R; r++) {
        const uint8_t *row = row0 + r * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            int64_t at = b * WT_R + r;
            if (r >= nr) {
                memset(W->q + at * 32, 0, 32);
                wt_scalars(W, at, 0, 0, 0.0f, 0.0f, 0, 0);
                continue;
            }
            wt_block_scalars(t, row, b, W, at);
#if defined(NP_SIMD_AVX2)
            _mm256_storeu_si256((__m256i *)(W->q + at * 32), NP_NAME(wt_codes)(t, row, b));
#else
            wt_codes_scalar(t, row, b, W->q + at * 32);
#endif
        }
    }
}

/* Every activation row against one unpacked tile (outputs n0 .. n0 + nr - 1). xs: float64
 * activation scales [T][nb]; xh: the activation codes' half-block sums [T][nb][2]. */
static void NP_NAME(wt_tile_rows)(const wt_tile *W, int64_t nb, int offset, const int8_t *codes,
                                  const double *xs, const int32_t *xh, int64_t T, int nr,
                                  int64_t n0, const float *bias, float *out,
                                  int64_t out_stride) {
    int64_t k_pad = nb * 32;
    for (int64_t t = 0; t < T; t++) {
        const int8_t *x = codes + t * k_pad;
        double acc[WT_R];
#if defined(NP_SIMD_AVX2)
        __m256d vacc = _mm256_setzero_pd();
        for (int64_t b = 0; b < nb; b++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x + b * 32));
            __m256i p[WT_R];
            for (int r = 0; r < WT_R; r++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(W->q + (b * WT_R + r) * 32));
                __m256i s = _mm256_loadu_si256((const __m256i *)(W->s + (b * WT_R + r) * 8));
                __m256i aw = _mm256_sign_epi8(w, w), sx = _mm256_sign_epi8(xv, w);
#if defined(NP_SIMD_AVX512)
                p[r] = _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx), s);
#else
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_packs_epi32(s, s));
#endif
            }
            __m256i hsum = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]),
                                             _mm256_hadd_epi32(p[2], p[3]));
            __m128i P = _mm_add_epi32(_mm256_castsi256_si128(hsum),
                                      _mm256_extracti128_si256(hsum, 1));
            __m256d inner = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(W->a + b * WT_R)),
                                          _mm256_cvtepi32_pd(P));
            if (offset) {
                const int32_t *h = xh + (t * nb + b) * 2;
                __m128i M = _mm_add_epi32(
                    _mm_mullo_epi32(_mm_loadu_si128((const __m128i *)(W->u0 + b * WT_R)),
                                    _mm_set1_epi32(h[0])),
                    _mm_mullo_epi32(_mm_loadu_si128((const __m128i *)(W->u1 + b * WT_R)),
                                    _mm_set1_epi32(h[1])));
                __m256d mm = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(W->m + b * WT_R)),
                                           _mm256_cvtepi32_pd(M));
                inner = _mm256_add_pd(inner, mm);
            }
            __m256d term = _mm256_mul_pd(inner, _mm256_set1_pd(xs[t * nb + b]));
            vacc = _mm256_add_pd(vacc, term);
        }
        _mm256_storeu_pd(acc, vacc);
#else
        for (int r = 0; r < WT_R; r++) acc[r] = 0.0;
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *xb = x + b * 32;
            for (int r = 0; r < WT_R; r++) {
                int64_t at = b * WT_R + r;
                const int8_t *q = W->q + at * 32;
                int32_t d0 = 0, d1 = 0;
                for (int i = 0; i < 16; i++) d0 += (int32_t)xb[i] * q[i];
                for (int i = 16; i < 32; i++) d1 += (int32_t)xb[i] * q[i];
                int32_t P = W->s[at * 8] * d0 + W->s[at * 8 + 4] * d1;
                double inner = (double)W->a[at] * (double)P;
                if (offset) {
                    const int32_t *h = xh + (t * nb + b) * 2;
                    int32_t M = W->u0[at] * h[0] + W->u1[at] * h[1];
                    double mm = (double)W->m[at] * (double)M;
                    inner = inner + mm;
                }
                double term = inner * xs[t * nb + b];
                acc[r] = acc[r] + term;
            }
        }
#endif
        float *o = out + t * out_stride + n0;
        for (int r = 0; r < nr; r++) {
            float y = (float)acc[r];
            if (bias) y = y + bias[n0 + r];
            o[r] = y;
        }
    }
}

/* Outputs of tiles tile_lo .. tile_hi - 1 (4 weight rows each), every activation row. */
static int NP_NAME(wt_matmul_tiles)(const int8_t *codes, const double *xs, const int32_t *xh,
                                    int64_t T, int64_t nb, int t, const uint8_t *data,
                                    int64_t row_bytes, int64_t n_out, const float *bias,
                                    float *out, int64_t out_stride, int64_t tile_lo,
                                    int64_t tile_hi) {
    size_t per = (size_t)(nb * WT_R);
    char *buf = (char *)malloc(per * (32 + 32 + 4 * 4) + 64);
    if (!buf) return I8_NOMEM;
    wt_tile W;
    W.q = (int8_t *)buf;
    W.s = (int32_t *)(buf + per * 32);
    W.a = (float *)(buf + per * 64);
    W.m = W.a + per;
    W.u0 = (int32_t *)(W.m + per);
    W.u1 = W.u0 + per;
    int offset = wt_has_offset(t);
    for (int64_t tile = tile_lo; tile < tile_hi; tile++) {
        int64_t n0 = tile * WT_R;
        int nr = n_out - n0 < WT_R ? (int)(n_out - n0) : WT_R;
        NP_NAME(wt_unpack)(t, data + n0 * row_bytes, row_bytes, nr, nb, &W);
        NP_NAME(wt_tile_rows)(&W, nb, offset, codes, xs, xh, T, nr, n0, bias, out, out_stride);
    }
    free(buf);
    return I8_OK;
}
