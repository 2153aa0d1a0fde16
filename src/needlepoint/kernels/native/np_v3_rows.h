/* The row operations and the attention of the Needle 3 native step (np_v3_block.h includes
 * this once per instruction-set variant; every name through NP_NAME). Each is the numpy
 * reference's operation in its order: norms.py, exact_ops.py, attention.attention_parts,
 * exact_attention.py, docs/numerics.md. */
/* -- row operations (numpy's, operation for operation) ------------------------------------ */
/* numpy's pairwise add.reduce of a contiguous float32 row (docs/numerics.md "Row sums"). */
static float NP_NAME(np_v3_pairwise)(const float *a, int64_t n) {
    if (n < 8) {
        float res = 0.0f;
        for (int64_t i = 0; i < n; i++) res = res + a[i];
        return res;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] = r[j] + a[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res = res + a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return NP_NAME(np_v3_pairwise)(a, n2) + NP_NAME(np_v3_pairwise)(a + n2, n - n2);
}

/* f32(sqrt(mean(x^2) + 1e-6)), the mean as numpy's: f32 pairwise sum / count in f64. */
static float NP_NAME(np_v3_rms_den)(const float *x, int64_t n, float *sq) {
    for (int64_t i = 0; i < n; i++) sq[i] = x[i] * x[i];
    float mean = (float)((double)NP_NAME(np_v3_pairwise)(sq, n) / (double)n);
    mean = mean + 1e-6f;
    return sqrtf(mean);
}

/* rms_unit: x * (1 / den) */
static void NP_NAME(np_v3_rms_unit)(const float *x, int64_t n, float *out, float *sq) {
    float inv = 1.0f / NP_NAME(np_v3_rms_den)(x, n, sq);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv;
}

/* ZC(s)(x) = ((1 + s) * x) / den, with `one_plus` = 1 + s */
static void NP_NAME(np_v3_zc)(const float *x, int64_t n, const float *one_plus, float *out, float *sq) {
    float den = NP_NAME(np_v3_rms_den)(x, n, sq);
    for (int64_t i = 0; i < n; i++) {
        float v = one_plus[i] * x[i];
        out[i] = v / den;
    }
}

static inline float NP_NAME(np_v3_sigmoid)(float x) {
    float e = NP_NAME(np_exp32)(-x);
    e = e + 1.0f;
    return 1.0f / e;
}

/* out = (w0 x0 + w1 x1) + ... over the lanes, in lane order (exact_ops.lane_sum) */
static void NP_NAME(np_v3_lane_sum)(const float *w, const float *lanes, int64_t n, int64_t d,
                           float *out) {
    for (int64_t e = 0; e < d; e++) out[e] = w[0] * lanes[e];
    for (int64_t l = 1; l < n; l++) {
        const float *x = lanes + l * d;
        float wl = w[l];
        for (int64_t e = 0; e < d; e++) {
            float prod = wl * x[e];
            out[e] = out[e] + prod;
        }
    }
}

static void NP_NAME(np_v3_lane_mean)(const float *lanes, int64_t n, int64_t d, float *out) {
    for (int64_t e = 0; e < d; e++) out[e] = lanes[e];
    for (int64_t l = 1; l < n; l++)
        for (int64_t e = 0; e < d; e++) out[e] = out[e] + lanes[l * d + e];
    float count = (float)n;
    for (int64_t e = 0; e < d; e++) out[e] = out[e] / count;
}

/* y [T, P->out] = A8(x [T, cols]) @ W^T, exact (kernels/exact.py a8_product) */
static int NP_NAME(np_v3_product_run)(const np_v3_product *P, const float *x, int64_t T, int64_t cols,
                             int32_t *v, float *scale, float *y, int threads) {
    if (T == 0) return NP_OK;
    int status = NP_NAME(np_a8_rotate)(x, T, cols, cols, P->in_pad, v, scale);
    if (status) return status;
    for (int64_t k = 0; k < P->n_mats; k++) {
        const np_v3_mat *M = &P->mats[k];
        int64_t rows = 0;
        for (int64_t p = 0; p < M->n_parts; p++) rows += M->parts[p].rows;
        status = np_cq_matmul_threads(v, scale, T, P->in_pad, (int)M->storage_bits, M->codebook,
                                      M->codebook_len, M->parts, M->n_parts, y, P->out, 0, rows,
                                      threads);
        if (status) return status;
    }
    return NP_OK;
}

/* query rows lo .. hi-1 of a block (row = (position - first) * H + head): the one attention
 * row (np_attend.h) against the head's ring of the cache, in position order, times the gate */
static void NP_NAME(np_v3_attend_items)(void *arg, int64_t lo, int64_t hi, int64_t worker) {
    const np_v3_attend_job *job = (const np_v3_attend_job *)arg;
    const np_v3_model *m = job->m;
    const np_v3_cache *c = job->c;
    const int64_t H = m->heads, qk = m->qk, vd = m->vd, group = H / m->kv_heads;
    float o[NP_ATT_GMAX * 1024];
    float *work = job->ws->work + worker * job->ws->work_stride;
    for (int64_t item = lo, run; item < hi; item += run) {
        int64_t r = job->first + item / H, h = item % H, kvh = h / group;
        /* the following heads of the same kv head and position, in this range: one pass */
        run = (kvh + 1) * group - h;
        if (run > hi - item) run = hi - item;
        if (run > NP_ATT_GMAX) run = NP_ATT_GMAX;
        int64_t p = job->start + r;
        int64_t from = c->window ? (p - c->window + 1 > 0 ? p - c->window + 1 : 0) : 0;
        np_kv_view kv = {c->kcode + kvh * c->capacity * qk, c->vcode + kvh * c->capacity * vd,
                         c->kscale + kvh * c->capacity, c->vscale + kvh * c->capacity, qk, vd,
                         1, c->window ? from % c->capacity : from, c->capacity, NULL};
        if (c->ktile) {
            const int64_t cap16 = (c->capacity + 15) / 16 * 16;
            kv.kt = c->ktile + kvh * cap16 * qk;
            kv.ksum = c->ksum + kvh * cap16;
        }
        const int64_t q = (job->qrow0 + r) * H + h;
        NP_NAME(np_att_rows)(job->ws->qcode + q * qk, job->ws->qscale + q, run, qk, vd, &kv,
                             p - from + 1, job->inv_sqrt_qk, o, work);
        for (int64_t i = 0; i < run; i++) {
            float *g = job->gate + r * H * vd + (h + i) * vd;
            for (int64_t e = 0; e < vd; e++) g[e] = g[e] * o[i * vd + e];
        }
    }
}

/* -- attention of one part (one session's chunk) ------------------------------------------- */

static int NP_NAME(np_v3_attention_part)(const np_v3_model *m, const np_v3_layer *L, const np_v3_part *P,
                                const np_v3_cache *c, const float *fused, int64_t fused_w,
                                float *gate, np_v3_attn_ws *ws, np_v3_attend_job *deferred) {
    const int64_t H = m->heads, KV = m->kv_heads, qk = m->qk, vd = m->vd;
    const int64_t k_end = (H + KV) * qk, v_end = k_end + KV * vd;
    const int64_t count = P->count, start = P->start, half = qk / 2;
    const float *f0 = fused + P->row0 * fused_w;
    float *conv = ws->conv;
    /* causal depthwise taps (attention._conv), reading the tail from the raw ring */
    int64_t lag = L->n_taps ? L->n_taps - 1 : 0;
    for (int64_t r = 0; r < count; r++) {
        const float *raw = f0 + r * fused_w;
        float *out = conv + r * v_end;
        if (!L->n_taps) {
            memcpy(out, raw, sizeof(float) * (size_t)v_end);
            continue;
        }
        for (int64_t e = 0; e < v_end; e++) out[e] = L->taps[e] * raw[e];
        for (int64_t back = 1; back <= lag; back++) {
            const float *tap = L->taps + back * v_end;
            const float *prev = NULL;
            if (r - back >= 0)
                prev = f0 + (r - back) * fused_w;
            else if (start + r - back >= 0)
                prev = c->raw + ((start + r - back) % c->raw_rows) * v_end;
            for (int64_t e = 0; e < v_end; e++) {
                float term = tap[e] * (prev ? prev[e] : 0.0f);
                out[e] = out[e] + term;
            }
        }
    }
    if (lag) { /* record the raw rows (the last raw_rows of them) */
        int64_t keep = count < c->raw_rows ? count : c->raw_rows;
        for (int64_t r = count - keep; r < count; r++)
            memcpy(c->raw + ((start + r) % c->raw_rows) * v_end, f0 + r * fused_w,
                   sizeof(float) * (size_t)v_end);
    }
    c->meta[0] = start + count;
    /* ZC(q_norm) / ZC(k_norm) per head row, RoPE, A8 of q, k, v per head row */
    float *hr = ws->heads_rows;
    for (int64_t r = 0; r < count; r++) {
        const float *cs = m->rope_cos + (start + r) * qk, *sn = m->rope_sin + (start + r) * qk;
        for (int64_t h = 0; h < H + KV; h++) {
            float *row = hr + (r * (H + KV) + h) * qk;
            NP_NAME(np_v3_zc)(conv + r * v_end + h * qk, qk, L->qk_scale + h * qk, row, ws->sq);
            float rot[256];
            for (int64_t e = 0; e < qk; e++) {
                float a = row[e] * cs[e];
                float b = row[(e + half) % qk] * sn[e];
                rot[e] = a + b;
            }
            memcpy(row, rot, sizeof(float) * (size_t)qk);
        }
    }
    for (int64_t r = 0; r < count; r++) {
        const float *row = hr + r * (H + KV) * qk;
        const int64_t q = (P->row0 + r) * H;
        if (NP_NAME(np_a8_codes)(row, H, qk, ws->qcode + q * qk, ws->qscale + q))
            return NP_NONFINITE;
        if (NP_NAME(np_a8_codes)(row + H * qk, KV, qk, ws->kcode + r * KV * qk, ws->kscale + r * KV))
            return NP_NONFINITE;
        if (NP_NAME(np_a8_codes)(conv + r * v_end + k_end, KV, vd, ws->vcode + r * KV * vd,
                        ws->vscale + r * KV))
            return NP_NONFINITE;
    }
    /* store then attend, 64 positions at a time: a ring keeps 64 slots beyond its window, so
     * a block's stores never overwrite a key one of its queries sees */
    np_v3_attend_job job = {m, c, ws, gate + P->row0 * H * vd, start, 0,
                            1.0 / sqrt((double)qk), P->row0};
    for (int64_t b0 = 0; b0 < count; b0 += 64) {
        int64_t b1 = b0 + 64 < count ? b0 + 64 : count;
        for (int64_t r = b0; r < b1; r++) {
            int64_t p = start + r;
            int64_t slot = c->window ? p % c->capacity : p;
            for (int64_t h = 0; h < KV; h++) {
                memcpy(c->kcode + (h * c->capacity + slot) * qk, ws->kcode + (r * KV + h) * qk,
                       (size_t)qk);
                if (c->ktile) { /* the 16-key copy (np_kv_view.kt) */
                    const int64_t cap16 = (c->capacity + 15) / 16 * 16;
                    const int8_t *code = ws->kcode + (r * KV + h) * qk;
                    int8_t *tile = c->ktile + h * cap16 * qk + (slot / 16) * qk * 16 + (slot % 16) * 4;
                    int32_t sum = 0;
                    for (int64_t c4 = 0; c4 < qk / 4; c4++) memcpy(tile + c4 * 64, code + 4 * c4, 4);
                    for (int64_t e = 0; e < qk; e++) sum += code[e];
                    c->ksum[h * cap16 + slot] = sum;
                }
                c->kscale[h * c->capacity + slot] = ws->kscale[r * KV + h];
                memcpy(c->vcode + (h * c->capacity + slot) * vd, ws->vcode + (r * KV + h) * vd,
                       (size_t)vd);
                c->vscale[h * c->capacity + slot] = ws->vscale[r * KV + h];
            }
        }
        /* the block's query rows (position, head), split between threads when worth it; a
         * part of one block with `deferred` set leaves them to the caller, which runs the
         * rows of every such part of the step in one split (np_v3_attend_parts) */
        int64_t keys = start + b1, items = (b1 - b0) * H;
        job.first = b0;
        if (deferred && count <= 64) {
            *deferred = job;
            break;
        }
        int threads = items * keys * (qk + vd) >= (1 << 19) ? (int)m->threads : 1;
        np_v3_parallel(NP_NAME(np_v3_attend_items), &job, items, threads);
    }
    int64_t filled = start + count > c->meta[1] ? start + count : c->meta[1];
    c->meta[1] = filled < c->capacity ? filled : c->capacity;
    return NP_OK;
}


/* the Hadamard MLP of rows lo .. hi-1 (each row on its own: np_hadamard_mlp) */
static void NP_NAME(np_v3_mlp_rows)(void *arg, int64_t lo, int64_t hi, int64_t worker) {
    np_v3_mlp_job *job = (np_v3_mlp_job *)arg;
    const np_v3_model *m = job->m;
    const np_v3_layer *L = job->L;
    job->status[worker] = NP_NAME(np_hadamard_mlp)(
        job->x + lo * m->d, hi - lo, m->d, m->hada_n, m->ba, m->hada_n / m->ba, L->mlp_vec,
        L->mlp_mats, L->cond_v, L->cond_u, 8, m->p1, m->p2, job->out + lo * m->d);
}

/* items lo .. hi-1 of np_v3_attend_all: each part's share through np_v3_attend_items */
static void NP_NAME(np_v3_attend_parts)(void *arg, int64_t lo, int64_t hi, int64_t worker) {
    const np_v3_attend_all *all = (const np_v3_attend_all *)arg;
    for (int64_t i = 0; i < all->n; i++) {
        int64_t a = all->first_item[i], b = all->first_item[i + 1];
        int64_t from = lo > a ? lo : a, to = hi < b ? hi : b;
        if (from < to)
            NP_NAME(np_v3_attend_items)((void *)&all->jobs[i], from - a, to - a, worker);
    }
}
