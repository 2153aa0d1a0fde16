/* The GGUF block types of np_wt.h: type numbers (kernels/wtypes.py `native_id`), block sizes
 * and the scalar decoding helpers every variant shares. Included once, from np_i8.h's types,
 * outside every instruction-set target (so the baseline variant never calls AVX2 code). */

#define WT_R 8 /* weight rows per tile */
#ifndef WT_AHEAD
#define WT_AHEAD 2 /* tiles between the one read and the one prefetched */
#endif
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
#define WT_INLINE static inline __attribute__((always_inline))
typedef int32_t wt_i32u __attribute__((may_alias, aligned(1))); /* 4 activation codes */

/* A tile's unpacked blocks (the portable kernel), block-major: block b of tile row r at index
 * b * WT_R + r. */
typedef struct {
    int8_t *q;        /* [nb][WT_R][32] codes */
    int32_t *s;       /* [nb][WT_R][2]: s0, s1 */
    float *a, *m;     /* [nb][WT_R] */
    int32_t *u0, *u1; /* [nb][WT_R] */
} wt_tile;

/* One block's scalars of the generic form. */
typedef struct {
    int32_t s0, s1, u0, u1;
    float a, m;
} wt_sc;

static const int8_t wt_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

/* Types whose blocks carry an offset (m * u); the others' m and u are zero. */
static inline int wt_has_offset(int t) {
    return t == WT_Q4_1 || t == WT_Q5_1 || t == WT_Q2_K || t == WT_Q4_K || t == WT_Q5_K;
}

/* Bytes per block (per super-block of 8 blocks for the K-quants). */
static inline int64_t wt_block_bytes(int t) {
    static const int64_t size[WT_LAST + 1] = {0, 34, 18, 20, 22, 24, 18, 84, 110, 144, 176, 210};
    return size[t];
}

/* ggml's get_scale_min_k4: 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K. */
static inline void wt_k4(const uint8_t *q, int j, int32_t *sc, int32_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q3_K's scale of 16-value sub-block i (0..15), minus 32. */
static inline int32_t wt_q3_scale(const uint8_t *q, int i) {
    int low = i < 8 ? q[i] & 0xF : q[i - 8] >> 4;
    int high = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (low | (high << 4)) - 32;
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
