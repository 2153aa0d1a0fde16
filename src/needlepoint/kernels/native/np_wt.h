/* Exact integer products over GGUF weight blocks as stored (kernels/blockweight.py is the
 * contract and the numpy reference; both give the same bits, tests/kernels/test_wtypes_native.py).
 * Included once per instruction-set variant (np_variant.h); every name through NP_NAME(); the
 * types and shared helpers are np_wt_types.h.
 *
 * Per output and activation row, over the blocks in order: P = s0 * dot(x[0:16], q[0:16]) +
 * s1 * dot(x[16:32], q[16:32]) (exact int32, any order), M = u0 * sum(x[0:16]) +
 * u1 * sum(x[16:32]) (exact), inner = a * P (+ m * M for the types with an offset; the
 * others add +0 in the reference, and no sign of zero survives: acc starts at +0),
 * term = inner * xs, acc = acc + term, all float64 with no FMA (-ffp-contract=off);
 * y = float32(acc) (+ bias). Work is cut in tiles of WT_R = 8 outputs.
 *
 * SIMD variants: per tile and block, the 8 rows' codes are unpacked straight into registers
 * (byte shifts and masks of the stored bytes) and dotted against every activation row's
 * block before the next block is read, so each weight byte is read once per call whatever T
 * is; the dots use the sign trick (|q| unsigned times x with q's sign: vpmaddubsw + vpmaddwd
 * on AVX2, vpdpbusd on AVX-512 VNNI), and the 8 outputs' epilogue runs in float64 vectors
 * (the same IEEE operations per output, in the same order). One activation row (decode)
 * skips the transpose: each row's block dot by itself, the 8 rows' half sums by a hadd tree,
 * codes unsigned where the type stores them so (wt_ubias), acc kept in registers; K-quant
 * scales are decoded for the 8 rows at once (wt_super8). Each type gets its own copy of
 * the tile loop (a constant type folds every per-type branch). The baseline variant unpacks
 * a tile into a small buffer (np_wt_types.h wt_tile) and runs plain loops. */

WT_INLINE float NP_NAME(wt_f16)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(NP_SIMD_AVX2)
    return _cvtsh_ss(h);
#else
    return i8_half(h);
#endif
}

/* Block b of a row: the scalars of its generic form. */
WT_INLINE wt_sc NP_NAME(wt_scal)(const int t, const uint8_t *row, int64_t b) {
    const uint8_t *k = row + (b / 8) * wt_block_bytes(t), *blk = row + b * wt_block_bytes(t);
    int j = (int)(b % 8);
    wt_sc o = {1, 1, 0, 0, 0.0f, 0.0f};
    switch (t) {
    case WT_Q8_0: case WT_Q4_0: case WT_Q5_0: case WT_IQ4_NL:
        o.a = NP_NAME(wt_f16)(blk);
        break;
    case WT_Q4_1: case WT_Q5_1:
        o.a = NP_NAME(wt_f16)(blk);
        o.m = NP_NAME(wt_f16)(blk + 2);
        o.u0 = o.u1 = 1;
        break;
    case WT_Q2_K:
        o.s0 = k[2 * j] & 15, o.s1 = k[2 * j + 1] & 15;
        o.u0 = k[2 * j] >> 4, o.u1 = k[2 * j + 1] >> 4;
        o.a = NP_NAME(wt_f16)(k + 80);
        o.m = -NP_NAME(wt_f16)(k + 82);
        break;
    case WT_Q3_K:
        o.s0 = wt_q3_scale(k + 96, 2 * j), o.s1 = wt_q3_scale(k + 96, 2 * j + 1);
        o.a = NP_NAME(wt_f16)(k + 108);
        break;
    case WT_Q4_K: case WT_Q5_K:
        wt_k4(k + 4, j, &o.s0, &o.u0);
        o.s1 = o.s0, o.u1 = o.u0;
        o.a = NP_NAME(wt_f16)(k);
        o.m = -NP_NAME(wt_f16)(k + 2);
        break;
    default: /* WT_Q6_K */
        o.s0 = (int8_t)k[192 + 2 * j], o.s1 = (int8_t)k[192 + 2 * j + 1];
        o.a = NP_NAME(wt_f16)(k + 208);
    }
    return o;
}

#if defined(NP_SIMD_AVX2)
/* The constant c a type's codes are stored above (code = v - c, v in 0 .. 63 unsigned), for
 * the one-row path's unsigned dots: dot(x, v - c) = dot(x, v) - c * sum(x), exact in int32
 * (v * x pairs stay far inside vpmaddubsw's int16). -1: signed codes, the sign trick (IQ4_NL,
 * Q3_K, Q8_0: code ^ 0x80 = code + 128 with vpdpbusd is exact too, but measured slower on a
 * memory-bound LM head). */
WT_INLINE int NP_NAME(wt_ubias)(int t) {
    switch (t) {
    case WT_Q4_0: return 8;
    case WT_Q5_0: return 16;
    case WT_Q6_K: return 32;
    case WT_Q4_1: case WT_Q5_1: case WT_Q2_K: case WT_Q4_K: case WT_Q5_K: return 0;
    default: return -1;
    }
}

/* Block b's 32 codes in one vector: whole-byte shifts and masks of 32 stored bytes; with
 * `raw`, v = code + wt_ubias(t) instead (unsigned) where that bias is not -1. */
WT_INLINE __m256i NP_NAME(wt_codes)(int t, int raw, const uint8_t *row, int64_t b, int j) {
    const uint8_t *blk = row + b * wt_block_bytes(t), *k = row + (b >> 3) * wt_block_bytes(t);
    int n = j / 4, jj = j % 4, g = j / 2, h = j % 2;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    if (t == WT_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    if (t <= WT_IQ4_NL) {
        int at = t == WT_Q4_0 || t == WT_IQ4_NL ? 2 : t == WT_Q4_1 ? 4 : t == WT_Q5_0 ? 6 : 8;
        /* the 16 bytes in both lanes by a broadcast load, the high lane shifted: no
         * cross-lane insert (the shuffle port is the busy one here) */
        __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + at)));
#if defined(NP_SIMD_AVX512)
        __m256i v = _mm256_and_si256(_mm256_srlv_epi16(qs, _mm256_set_epi64x(
                                         0x0004000400040004LL, 0x0004000400040004LL, 0, 0)), m4);
#else
        __m256i v = _mm256_and_si256(
            _mm256_blend_epi32(qs, _mm256_srli_epi16(qs, 4), 0xF0), m4);
#endif
        if (t == WT_Q4_0) return raw ? v : _mm256_sub_epi8(v, _mm256_set1_epi8(8));
        if (t == WT_IQ4_NL) {
            __m128i table = _mm_loadu_si128((const __m128i *)wt_iq4nl);
            return _mm256_shuffle_epi8(_mm256_set_m128i(table, table), v);
        }
        if (t == WT_Q4_1) return v;
        uint32_t qh; /* Q5: bit i of qh -> byte i (ggml's bytes_from_bits_32) */
        memcpy(&qh, blk + (t == WT_Q5_0 ? 2 : 4), 4);
#if defined(NP_SIMD_AVX512)
        /* qh is the byte mask itself: nib + 16 = nib | 16 where the bit is set */
        v = _mm256_mask_add_epi8(v, (__mmask32)qh, v, _mm256_set1_epi8(0x10));
#else
        __m256i bits = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL,
                              0));
        bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)),
                                 _mm256_set1_epi64x(-1));
        v = _mm256_or_si256(v, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
#endif
        return t == WT_Q5_0 && !raw ? _mm256_sub_epi8(v, _mm256_set1_epi8(16)) : v;
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
        __m256i v = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
        return raw ? v : _mm256_sub_epi8(v, _mm256_set1_epi8(32));
    }
    }
}

/* 8 rows of 8 dwords (row r: a block's 32 codes as 8 quads) -> 8 vectors, vector q holding
 * quad q of rows 0..7 in lanes 0..7 (the 8 x 8 transpose). */
WT_INLINE void NP_NAME(wt_transpose8)(__m256i *v) {
    __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    v[0] = _mm256_permute2x128_si256(u0, u4, 0x20), v[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    v[1] = _mm256_permute2x128_si256(u1, u5, 0x20), v[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    v[2] = _mm256_permute2x128_si256(u2, u6, 0x20), v[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    v[3] = _mm256_permute2x128_si256(u3, u7, 0x20), v[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* The float16 at byte `at` of each of the 8 rows, as float32 lanes. */
WT_INLINE __m256 NP_NAME(wt_half8)(const uint8_t *const *rows, int64_t at) {
    __m128i h = _mm_setzero_si128();
    uint16_t v;
#define WT_LANE(r) memcpy(&v, rows[r] + at, 2), h = _mm_insert_epi16(h, v, r)
    WT_LANE(0); WT_LANE(1); WT_LANE(2); WT_LANE(3);
    WT_LANE(4); WT_LANE(5); WT_LANE(6); WT_LANE(7);
#undef WT_LANE
    return _mm256_cvtph_ps(h);
}

/* A K-quant super-block's integer scales, for its 8 blocks j, of one row r: [j][r]. */
WT_INLINE void NP_NAME(wt_super)(const int t, const uint8_t *k, int r, int32_t S0[8][8],
                                 int32_t S1[8][8], int32_t U0[8][8], int32_t U1[8][8]) {
    for (int j = 0; j < 8; j++) {
        int32_t sc, mn;
        switch (t) {
        case WT_Q2_K:
            S0[j][r] = k[2 * j] & 15, S1[j][r] = k[2 * j + 1] & 15;
            U0[j][r] = k[2 * j] >> 4, U1[j][r] = k[2 * j + 1] >> 4;
            break;
        case WT_Q3_K:
            S0[j][r] = wt_q3_scale(k + 96, 2 * j), S1[j][r] = wt_q3_scale(k + 96, 2 * j + 1);
            break;
        case WT_Q6_K:
            S0[j][r] = (int8_t)k[192 + 2 * j], S1[j][r] = (int8_t)k[192 + 2 * j + 1];
            break;
        default: /* Q4_K, Q5_K */
            wt_k4(k + 4, j, &sc, &mn);
            S0[j][r] = sc, U0[j][r] = mn;
        }
    }
}

/* 8 rows' 8 bytes each (v[r], byte j = column j) -> dst[j][r] as int32 (bytes signed or
 * not): an 8 x 8 byte transpose. */
WT_INLINE void NP_NAME(wt_t8x8)(const uint64_t *v, int sgn, int32_t dst[8][8]) {
    const __m128i inter = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    __m128i y[4], z[4];
    for (int i = 0; i < 4; i++) /* word j of y[i]: rows 2i, 2i + 1 of column j */
        y[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(v + 2 * i)), inter);
    z[0] = _mm_unpacklo_epi16(y[0], y[1]), z[1] = _mm_unpackhi_epi16(y[0], y[1]);
    z[2] = _mm_unpacklo_epi16(y[2], y[3]), z[3] = _mm_unpackhi_epi16(y[2], y[3]);
    __m128i w[4] = {_mm_unpacklo_epi32(z[0], z[2]), _mm_unpackhi_epi32(z[0], z[2]),
                    _mm_unpacklo_epi32(z[1], z[3]), _mm_unpackhi_epi32(z[1], z[3])};
    for (int j = 0; j < 8; j++) { /* column j: 64-bit half j % 2 of w[j / 2] */
        __m128i c = j % 2 ? _mm_unpackhi_epi64(w[j / 2], w[j / 2]) : w[j / 2];
        _mm256_storeu_si256((__m256i *)dst[j],
                            sgn ? _mm256_cvtepi8_epi32(c) : _mm256_cvtepu8_epi32(c));
    }
}

/* A K-quant super-block's integer scales ([j][r], as wt_super gives them) for the 8 rows,
 * whole rows at a time, for Q4_K / Q5_K (ggml's 32-bit mask form of get_scale_min_k4 gives a
 * row's 8 scales and 8 mins as bytes) and Q6_K (16 int8 scales, even and odd split). */
WT_INLINE void NP_NAME(wt_super8)(const int t, const uint8_t *const *rows, int64_t base,
                                  int32_t S0[8][8], int32_t S1[8][8], int32_t U0[8][8]) {
    uint64_t sc[8], mn[8];
    for (int r = 0; r < WT_R; r++) {
        if (t == WT_Q6_K) {
            __m128i v = _mm_shuffle_epi8(
                _mm_loadu_si128((const __m128i *)(rows[r] + base + 192)),
                _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
            sc[r] = (uint64_t)_mm_cvtsi128_si64(v);
            mn[r] = (uint64_t)_mm_extract_epi64(v, 1);
            continue;
        }
        uint32_t u[4];
        memcpy(u, rows[r] + base + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
        const uint32_t m_low = u[1] & 0x3f3f3f3fu;
        u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        u[0] &= 0x3f3f3f3fu;
        sc[r] = (uint64_t)u[0] | (uint64_t)u[1] << 32;
        mn[r] = (uint64_t)m_low | (uint64_t)u[3] << 32;
    }
    NP_NAME(wt_t8x8)(sc, t == WT_Q6_K, S0);
    NP_NAME(wt_t8x8)(mn, t == WT_Q6_K, t == WT_Q6_K ? S1 : U0);
}

/* One tile (outputs n0 .. n0 + nr - 1, rows row_bytes apart from row0) against every
 * activation row; acc [T][WT_R] float64 work space. `t` is a constant at every call. Per
 * block the 8 rows' codes are unpacked and transposed so that lane j of vector q holds quad q
 * (inputs 4q .. 4q + 3) of row j: each activation quad is broadcast and one vpdpbusd (or
 * vpmaddubsw + vpmaddwd) adds it into all 8 outputs' dots, halves 0-15 and 16-31 in two
 * sums; no horizontal reduction. A K-quant's scalars are decoded once per super-block. Rows
 * past nr read row 0 again (their lanes are never stored). */
WT_INLINE void NP_NAME(wt_tile_simd)(const int t, const int one, const uint8_t *row0,
                                     int64_t row_bytes,
                                     int nr, int64_t nb, const int8_t *codes,
                                     const double *xs, const int32_t *xh, int64_t T,
                                     double *acc) {
    const int kq = t >= WT_Q2_K;
    const int per_half = t == WT_Q2_K || t == WT_Q3_K || t == WT_Q6_K; /* s0 != s1 */
    const int unit = t <= WT_IQ4_NL;                                   /* s0 = s1 = 1 */
    const int off = wt_has_offset(t);
    const int64_t k_pad = nb * 32, span = WT_R * row_bytes, bb = wt_block_bytes(t);
    const uint8_t *ahead = row0 + WT_AHEAD * span;
    const int64_t pf_step = nb ? ((span + nb - 1) / nb + 63) / 64 * 64 : 0; /* per block */
    const int ub = one ? NP_NAME(wt_ubias)(t) : -1;
    const uint8_t *rows[WT_R];
    for (int r = 0; r < WT_R; r++) rows[r] = row0 + (r < nr ? r : 0) * row_bytes;
    int32_t S0[8][8], S1[8][8], U0[8][8], U1[8][8];
    __m256d alo = _mm256_setzero_pd(), ahi = alo, mlo = alo, mhi = alo;
    __m256d acc_lo = alo, acc_hi = alo; /* the one-row path's acc, in registers */
    for (int64_t i = 0; i < T * WT_R; i++) acc[i] = 0.0;
    /* K-quants: the 8 blocks of a super-block unrolled, so that j (the shifts and offsets
     * of its codes, its scale row) is a constant in each copy */
    const int step = kq ? 8 : 1;
    for (int64_t b0 = 0; b0 < nb; b0 += step)
#pragma GCC unroll 8
    for (int j = 0; j < step; j++) {
        const int64_t b = b0 + j;
        __m256i w[WT_R], aw[WT_R];
        /* The tile after next, in address order, its share per block: the 8 rows are read
         * side by side in short runs the hardware prefetcher does not follow, and a decode
         * step is bound by this memory traffic. Prefetches never fault. */
        for (int64_t at = b * pf_step, end = at + pf_step < span ? at + pf_step : span;
             at < end; at += 64)
            _mm_prefetch((const char *)(ahead + at), _MM_HINT_T0);
        for (int r = 0; r < WT_R; r++) w[r] = NP_NAME(wt_codes)(t, ub >= 0, rows[r], b, j);
        __m256i done0 = _mm256_setzero_si256(), done1 = done0;
        if (one) { /* one activation row: each row's dot, then the 8 rows' half sums by a
                    * hadd tree (fewer shuffles than the transpose when nothing amortises
                    * it); unsigned codes where the type allows (wt_ubias), else the sign
                    * trick */
            __m256i xv = _mm256_loadu_si256((const __m256i *)(codes + b * 32)), p[WT_R];
            for (int r = 0; r < WT_R; r++) {
                __m256i a = w[r], sx = xv;
                if (ub < 0) a = _mm256_sign_epi8(w[r], w[r]), sx = _mm256_sign_epi8(xv, w[r]);
#if defined(NP_SIMD_AVX512)
                p[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, sx);
#else
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(a, sx), _mm256_set1_epi16(1));
#endif
            }
            /* 128-bit lane 0 of p[r] is inputs 0-15, lane 1 inputs 16-31 */
            __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]),
                                           _mm256_hadd_epi32(p[2], p[3]));
            __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]),
                                           _mm256_hadd_epi32(p[6], p[7]));
            done0 = _mm256_permute2x128_si256(h0, h1, 0x20);
            done1 = _mm256_permute2x128_si256(h0, h1, 0x31);
            if (ub > 0) {
                done0 = _mm256_sub_epi32(done0, _mm256_set1_epi32(ub * xh[2 * b]));
                done1 = _mm256_sub_epi32(done1, _mm256_set1_epi32(ub * xh[2 * b + 1]));
            }
        } else {
            NP_NAME(wt_transpose8)(w);
            for (int q = 0; q < 8; q++) aw[q] = _mm256_sign_epi8(w[q], w[q]);
        }
        if (!kq || j == 0) { /* float scalars: per block, or per K-quant super-block */
            int64_t base = kq ? (b / 8) * bb : b * bb;
            int64_t at_d = t == WT_Q2_K ? 80 : t == WT_Q3_K ? 108 : t == WT_Q6_K ? 208 : 0;
            __m256 a8 = NP_NAME(wt_half8)(rows, base + at_d);
            alo = _mm256_cvtps_pd(_mm256_castps256_ps128(a8));
            ahi = _mm256_cvtps_pd(_mm256_extractf128_ps(a8, 1));
            if (off) {
                __m256 m8 = NP_NAME(wt_half8)(rows, base + (t == WT_Q2_K ? 82 : 2));
                if (kq) m8 = _mm256_xor_ps(m8, _mm256_set1_ps(-0.0f)); /* m = -dmin */
                mlo = _mm256_cvtps_pd(_mm256_castps256_ps128(m8));
                mhi = _mm256_cvtps_pd(_mm256_extractf128_ps(m8, 1));
            }
            if (t == WT_Q4_K || t == WT_Q5_K || t == WT_Q6_K)
                NP_NAME(wt_super8)(t, rows, base, S0, S1, U0);
            else if (kq)
                for (int r = 0; r < WT_R; r++)
                    NP_NAME(wt_super)(t, rows[r] + base, r, S0, S1, U0, U1);
        }
        __m256i s0 = _mm256_set1_epi32(1), s1 = s0, u0 = s0, u1 = s0;
        if (kq) {
            s0 = _mm256_loadu_si256((const __m256i *)S0[j]);
            s1 = per_half ? _mm256_loadu_si256((const __m256i *)S1[j]) : s0;
            if (off) {
                u0 = _mm256_loadu_si256((const __m256i *)U0[j]);
                u1 = t == WT_Q2_K ? _mm256_loadu_si256((const __m256i *)U1[j]) : u0;
            }
        }
        /* One scale per block (s0 = s1, u0 = u1): a * P = (a * s) * D and m * M = (m * u) * S
         * with D = the block dot, S = the activation block sum: a * s (f32 times at most
         * 6 bits) and a * s * D (|D| < 2^19) are exact in float64, as are m * u and m * u * S,
         * so these are the reference's two exact products, and their sum rounds once as
         * there. Two scales per block (Q2_K, Q3_K, Q6_K) keep the integer P and M. */
        __m256d as_lo = alo, as_hi = ahi, mu_lo = mlo, mu_hi = mhi;
        if (!per_half && !unit) {
            as_lo = _mm256_mul_pd(alo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(s0)));
            as_hi = _mm256_mul_pd(ahi, _mm256_cvtepi32_pd(_mm256_extracti128_si256(s0, 1)));
        }
        if (!per_half && off && kq) {
            mu_lo = _mm256_mul_pd(mlo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(u0)));
            mu_hi = _mm256_mul_pd(mhi, _mm256_cvtepi32_pd(_mm256_extracti128_si256(u0, 1)));
        }
        for (int64_t tt = 0; tt < T; tt++) {
            __m256i d0 = done0, d1 = done1;
            if (!one) {
                const wt_i32u *x4 = (const wt_i32u *)(codes + tt * k_pad + b * 32);
                /* four short chains (the sums are exact in any order) */
                __m256i d[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                                _mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int q = 0; q < 8; q++) {
                    __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(x4[q]), w[q]);
#if defined(NP_SIMD_AVX512)
                    d[q / 2] = _mm256_dpbusd_epi32(d[q / 2], aw[q], sx);
#else
                    d[q / 2] = _mm256_add_epi32(
                        d[q / 2], _mm256_madd_epi16(_mm256_maddubs_epi16(aw[q], sx),
                                                    _mm256_set1_epi16(1)));
#endif
                }
                d0 = _mm256_add_epi32(d[0], d[1]), d1 = _mm256_add_epi32(d[2], d[3]);
            }
            const int32_t *h = xh + (tt * nb + b) * 2;
            __m256d ilo, ihi;
            if (per_half) {
                __m256i P = _mm256_add_epi32(_mm256_mullo_epi32(d0, s0),
                                             _mm256_mullo_epi32(d1, s1));
                ilo = _mm256_mul_pd(alo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(P)));
                ihi = _mm256_mul_pd(ahi, _mm256_cvtepi32_pd(_mm256_extracti128_si256(P, 1)));
                if (off) {
                    __m256i M = _mm256_add_epi32(_mm256_mullo_epi32(u0, _mm256_set1_epi32(h[0])),
                                                 _mm256_mullo_epi32(u1, _mm256_set1_epi32(h[1])));
                    __m256d mm_lo = _mm256_mul_pd(mlo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(M)));
                    __m256d mm_hi = _mm256_mul_pd(mhi, _mm256_cvtepi32_pd(_mm256_extracti128_si256(M, 1)));
                    ilo = _mm256_add_pd(ilo, mm_lo);
                    ihi = _mm256_add_pd(ihi, mm_hi);
                }
            } else {
                __m256i D = _mm256_add_epi32(d0, d1);
                ilo = _mm256_mul_pd(as_lo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(D)));
                ihi = _mm256_mul_pd(as_hi, _mm256_cvtepi32_pd(_mm256_extracti128_si256(D, 1)));
                if (off) {
                    __m256d S = _mm256_set1_pd((double)(h[0] + h[1]));
                    ilo = _mm256_add_pd(ilo, _mm256_mul_pd(mu_lo, S));
                    ihi = _mm256_add_pd(ihi, _mm256_mul_pd(mu_hi, S));
                }
            }
            const __m256d x = _mm256_set1_pd(xs[tt * nb + b]);
            if (one) {
                acc_lo = _mm256_add_pd(acc_lo, _mm256_mul_pd(ilo, x));
                acc_hi = _mm256_add_pd(acc_hi, _mm256_mul_pd(ihi, x));
                continue;
            }
            double *at = acc + tt * WT_R;
            _mm256_storeu_pd(at, _mm256_add_pd(_mm256_loadu_pd(at), _mm256_mul_pd(ilo, x)));
            _mm256_storeu_pd(at + 4, _mm256_add_pd(_mm256_loadu_pd(at + 4), _mm256_mul_pd(ihi, x)));
        }
    }
    if (one) _mm256_storeu_pd(acc, acc_lo), _mm256_storeu_pd(acc + 4, acc_hi);
}

#define WT_CASE(T_)                                                                          \
    case T_:                                                                                 \
        if (T == 1)                                                                          \
            NP_NAME(wt_tile_simd)(T_, 1, row0, row_bytes, nr, nb, codes, xs, xh, T, acc);    \
        else                                                                                 \
            NP_NAME(wt_tile_simd)(T_, 0, row0, row_bytes, nr, nb, codes, xs, xh, T, acc);    \
        break;

static void NP_NAME(wt_tile_any)(int t, const uint8_t *row0, int64_t row_bytes, int nr,
                                 int64_t nb, const int8_t *codes, const double *xs,
                                 const int32_t *xh, int64_t T, double *acc) {
    switch (t) {
    WT_CASE(WT_Q8_0) WT_CASE(WT_Q4_0) WT_CASE(WT_Q4_1) WT_CASE(WT_Q5_0) WT_CASE(WT_Q5_1)
    WT_CASE(WT_IQ4_NL) WT_CASE(WT_Q2_K) WT_CASE(WT_Q3_K) WT_CASE(WT_Q4_K) WT_CASE(WT_Q5_K)
    WT_CASE(WT_Q6_K)
    }
}
#undef WT_CASE

/* Outputs of tiles tile_lo .. tile_hi - 1, every activation row. */
static int NP_NAME(wt_matmul_tiles)(const int8_t *codes, const double *xs, const int32_t *xh,
                                    int64_t T, int64_t nb, int t, const uint8_t *data,
                                    int64_t row_bytes, int64_t n_out, const float *bias,
                                    float *out, int64_t out_stride, int64_t tile_lo,
                                    int64_t tile_hi) {
    double *acc = (double *)malloc(sizeof(double) * (size_t)(T * WT_R + 1));
    if (!acc) return I8_NOMEM;
    for (int64_t tile = tile_lo; tile < tile_hi; tile++) {
        int64_t n0 = tile * WT_R;
        int nr = n_out - n0 < WT_R ? (int)(n_out - n0) : WT_R;
        NP_NAME(wt_tile_any)(t, data + n0 * row_bytes, row_bytes, nr, nb, codes, xs, xh, T,
                             acc);
        for (int64_t tt = 0; tt < T; tt++) {
            float *o = out + tt * out_stride + n0;
            for (int r = 0; r < nr; r++) {
                float y = (float)acc[tt * WT_R + r];
                if (bias) y = y + bias[n0 + r];
                o[r] = y;
            }
        }
    }
    free(acc);
    return I8_OK;
}

#else /* the portable kernel */

/* Tile rows r < nr of weight rows row0.. into W (rows nr..WT_R-1: zero codes and scales). */
static void NP_NAME(wt_unpack)(int t, const uint8_t *row0, int64_t row_bytes, int nr,
                               int64_t nb, const wt_tile *W) {
    for (int r = 0; r < WT_R; r++) {
        const uint8_t *row = row0 + r * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            int64_t at = b * WT_R + r;
            wt_sc c = {0, 0, 0, 0, 0.0f, 0.0f};
            if (r < nr) {
                c = NP_NAME(wt_scal)(t, row, b);
                wt_codes_scalar(t, row, b, W->q + at * 32);
            } else {
                memset(W->q + at * 32, 0, 32);
            }
            W->s[at * 2] = c.s0, W->s[at * 2 + 1] = c.s1;
            W->a[at] = c.a, W->m[at] = c.m, W->u0[at] = c.u0, W->u1[at] = c.u1;
        }
    }
}

/* Every activation row against one unpacked tile (outputs n0 .. n0 + nr - 1). */
static void NP_NAME(wt_tile_rows)(const wt_tile *W, int64_t nb, int offset, const int8_t *codes,
                                  const double *xs, const int32_t *xh, int64_t T, int nr,
                                  int64_t n0, const float *bias, float *out,
                                  int64_t out_stride) {
    int64_t k_pad = nb * 32;
    for (int64_t t = 0; t < T; t++) {
        const int8_t *x = codes + t * k_pad;
        double acc[WT_R];
        for (int r = 0; r < WT_R; r++) acc[r] = 0.0;
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *xb = x + b * 32;
            for (int r = 0; r < WT_R; r++) {
                int64_t at = b * WT_R + r;
                const int8_t *q = W->q + at * 32;
                int32_t d0 = 0, d1 = 0;
                for (int i = 0; i < 16; i++) d0 += (int32_t)xb[i] * q[i];
                for (int i = 16; i < 32; i++) d1 += (int32_t)xb[i] * q[i];
                int32_t P = W->s[at * 2] * d0 + W->s[at * 2 + 1] * d1;
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
    char *buf = (char *)malloc(per * (32 + 8 + 4 * 4) + 64);
    if (!buf) return I8_NOMEM;
    wt_tile W;
    W.q = (int8_t *)buf;
    W.s = (int32_t *)(buf + per * 32);
    W.a = (float *)(buf + per * 40);
    W.m = W.a + per;
    W.u0 = (int32_t *)(W.m + per);
    W.u1 = W.u0 + per;
    for (int64_t tile = tile_lo; tile < tile_hi; tile++) {
        int64_t n0 = tile * WT_R;
        int nr = n_out - n0 < WT_R ? (int)(n_out - n0) : WT_R;
        NP_NAME(wt_unpack)(t, data + n0 * row_bytes, row_bytes, nr, nb, &W);
        NP_NAME(wt_tile_rows)(&W, nb, wt_has_offset(t), codes, xs, xh, T, nr, n0, bias, out,
                              out_stride);
    }
    free(buf);
    return I8_OK;
}
#endif
