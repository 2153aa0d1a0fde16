/* One pre-norm transformer block in int8 numerics, in one call (included once by np_i8.h).
 *
 * The same operations, in the same order, as the Python block over the kernels one at a time
 * (models/transformer/block.py with int8 weights: norm, int8 q|k|v product, RoPE, int8 KV
 * rows (keys and queries at 16 bits), pinned attention, int8 o product, residual, norm, int8
 * gate|up product, pinned activation, int8 down product, residual); every float operation is one IEEE operation, so
 * both give the same bits (tests/models/transformer/test_transformer_int8_fused.py). It only
 * saves the interpreter's work between the kernels, which dominates a decode step. */

static int i8_apply(const i8_lin *L, const float *x, int64_t T, float *y, int8_t *codes,
                    float *xs, int32_t *sums) {
    int st = i8_quantize(x, T, L->k_in, L->k_pad, codes, xs, sums);
    if (st) return st;
    int64_t col = 0;
    for (int64_t i = 0; i < L->n_parts; i++) {
        const i8_part *p = &L->parts[i];
        const float *bias = L->bias ? L->bias + col : NULL;
        if (p->wtype)
            st = wt_matmul(codes, xs, sums, T, p->nb, p->wtype, p->data, p->row_bytes,
                           p->n_out, bias, y + col, L->n_total, p->threads);
        else
            st = i8_matmul(codes, xs, sums, T, p->nb, p->bits, p->data, p->scale, p->offset,
                           p->half, p->groups, p->n_out, bias, y + col, L->n_total,
                           p->threads);
        if (st) return st;
        col += p->n_out;
    }
    return I8_OK;
}

/* x [hd] rotated by the half-split rule into out: x*cos + rotate_half(x)*sin. */
static void i8_rope_row(const float *x, const float *cs, const float *sn, int64_t hd,
                        float *out) {
    int64_t half = hd / 2;
    for (int64_t i = 0; i < hd; i++) {
        float rot = i < half ? -x[i + half] : x[i - half];
        float a = x[i] * cs[i];
        float b = rot * sn[i];
        out[i] = a + b;
    }
}

/* The pinned activation's exp argument: -x (SiLU), or -2 sqrt(2/pi) (x + 0.044715 x^3)
 * (GELU-tanh), in models/transformer/int8.py's float32 order. */
static inline float i8_act_arg(float x, int gelu) {
    if (!gelu) return -x;
    float u = x * x;
    u = u * x;
    u = u * I8_GELU_C;
    u = u + x;
    return u * I8_GELU_K;
}

#define I8_MAX(a, b) ((a) > (b) ? (a) : (b))

/* h [T, d] (positions start ..) -> the block's output, in place; appends the chunk's keys
 * and values at rows (start + t) * kv_heads + g of the int8 cache (capacity >= start + T). */
int i8_block(const i8_layer *L, float *h, int64_t T, int64_t start, const float *cos,
             const float *sin, int16_t *kcode, float *kscale, int8_t *vcode, float *vscale) {
    int64_t d = L->d, H = L->heads, G = L->kv_heads, hd = L->head_dim;
    int64_t nq = H * hd, nkv = G * hd;
    int64_t kmax = I8_MAX(I8_MAX(L->qkv.k_pad, L->o.k_pad), I8_MAX(L->up.k_pad, L->down.k_pad));
    int64_t wide = I8_MAX(L->qkv.n_total, L->up.n_total);
    size_t floats = (size_t)(T * d + T * wide + T * nq * 2 + T * L->d_ff + T * d + (start + T) +
                             hd + T * (kmax / 32) + T * H);
    float *buf = (float *)malloc(sizeof(float) * floats);
    /* the activation codes of each product, and the queries' int16 codes in turn */
    int8_t *codes = (int8_t *)malloc((size_t)(T * I8_MAX(kmax, 2 * nq)));
    int32_t *sums = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T * (kmax / 32)));
    int st = I8_NOMEM;
    if (!buf || !codes || !sums) goto done;
    float *x = buf, *y = x + T * d, *qrows = y + T * wide, *att = qrows + T * nq;
    float *act = att + T * nq, *ob = act + T * L->d_ff, *work = ob + T * d;
    float *rowbuf = work + (start + T), *xs = rowbuf + hd, *qscale = xs + T * (kmax / 32);

    st = i8_norm(h, T, d, L->n1w, L->n1b, L->eps, L->center, x);
    if (st) goto done;
    st = i8_apply(&L->qkv, x, T, y, codes, xs, sums);
    if (st) goto done;
    for (int64_t t = 0; t < T; t++) {
        const float *yr = y + t * L->qkv.n_total;
        const float *cs = cos ? cos + t * hd : NULL, *sn = sin ? sin + t * hd : NULL;
        for (int64_t hh = 0; hh < H; hh++) {
            float *qr = qrows + (t * H + hh) * hd;
            if (L->rope)
                i8_rope_row(yr + hh * hd, cs, sn, hd, qr);
            else
                memcpy(qr, yr + hh * hd, sizeof(float) * (size_t)hd);
            if (L->factor != 1.0f)
                for (int64_t e = 0; e < hd; e++) qr[e] = qr[e] * L->factor;
        }
        for (int64_t g = 0; g < G; g++) {
            int64_t row = (start + t) * G + g;
            const float *k = yr + nq + g * hd;
            if (L->rope) {
                i8_rope_row(k, cs, sn, hd, rowbuf);
                k = rowbuf;
            }
            st = NP_DISPATCH(np_a16_codes, k, 1, hd, kcode + row * hd, kscale + row);
            if (st) goto done;
            st = NP_DISPATCH(np_a8_codes, yr + nq + nkv + g * hd, 1, hd, vcode + row * hd,
                             vscale + row);
            if (st) goto done;
        }
    }
    st = NP_DISPATCH(np_a16_codes, qrows, T * H, hd, (int16_t *)codes, qscale);
    if (st) goto done;
    NP_DISPATCH(i8_attend_causal, (const int16_t *)codes, qscale, T, start, H, G, hd, kcode, kscale, vcode,
                vscale, att, work);
    st = i8_apply(&L->o, att, T, ob, codes, xs, sums);
    if (st) goto done;
    for (int64_t i = 0; i < T * d; i++) h[i] = h[i] + ob[i];
    st = i8_norm(h, T, d, L->n2w, L->n2b, L->eps, L->center, x);
    if (st) goto done;
    st = i8_apply(&L->up, x, T, y, codes, xs, sums);
    if (st) goto done;
    for (int64_t t = 0; t < T; t++) {
        const float *yr = y + t * L->up.n_total;
        float *ar = act + t * L->d_ff;
        for (int64_t j = 0; j < L->d_ff; j++) ar[j] = i8_act_arg(yr[j], L->gelu);
        NP_DISPATCH(np_exp32_array, ar, L->d_ff, ar);
        for (int64_t j = 0; j < L->d_ff; j++) {
            float e = ar[j] + 1.0f;
            float a = yr[j] / e;
            if (L->gated) a = a * yr[L->d_ff + j];
            ar[j] = a;
        }
    }
    st = i8_apply(&L->down, act, T, ob, codes, xs, sums);
    if (st) goto done;
    for (int64_t i = 0; i < T * d; i++) h[i] = ob[i] + h[i];
done:
    free(buf);
    free(codes);
    free(sums);
    return st;
}
