/* The Needle 3 deploy forward of a batch of chunks in one call: the bodies, included once per
 * instruction-set variant (every name through NP_NAME); np_v3_types.h has the structs and
 * says what the call does. */
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

/* out[e] = out[e] + p * f32(v[e] * sv) for every e (one key's value row; a function of its
 * own so the compiler vectorises it across e instead of interleaving keys). */
static __attribute__((noinline)) void NP_NAME(np_v3_add_value)(float *restrict out,
                                                           const int8_t *restrict v, float sv,
                                                           float p, int64_t vd) {
    for (int64_t e = 0; e < vd; e++) {
        float value = (float)v[e] * sv;
        float prod = p * value;
        out[e] = out[e] + prod;
    }
}

/* One query row against positions lo .. p of its kv head, in position order (np_attend). */
static void NP_NAME(np_v3_attend_row)(const int8_t *q, float qscale, int64_t qk, int64_t vd,
                             const np_v3_cache *c, int64_t head, int64_t lo, int64_t p,
                             double inv_sqrt_qk, float *o, float *work) {
    const int8_t *kbase = c->kcode + head * c->capacity * qk;
    const int8_t *vbase = c->vcode + head * c->capacity * vd;
    const float *ks = c->kscale + head * c->capacity, *vs = c->vscale + head * c->capacity;
    double sq = (double)qscale;
    int64_t n = p - lo + 1;
    float peak = -INFINITY;
    const int64_t first = c->window ? lo % c->capacity : lo; /* slots in position order */
    for (int64_t j = 0, slot = first; j < n; j++, slot = slot + 1 == c->capacity ? 0 : slot + 1) {
        const int8_t *restrict k = kbase + slot * qk;
        int32_t dot = 0;
        for (int64_t e = 0; e < qk; e++) dot += (int32_t)q[e] * (int32_t)k[e];
        double t = (double)dot * sq;
        t = t * (double)ks[slot];
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
    for (int64_t e = 0; e < vd; e++) o[e] = 0.0f;
    for (int64_t j = 0, slot = first; j < n; j++, slot = slot + 1 == c->capacity ? 0 : slot + 1) {
        NP_NAME(np_v3_add_value)(o, vbase + slot * vd, vs[slot], work[j] / total, vd);
    }
}


/* query rows lo .. hi-1 of a block (row = (position - first) * H + head): o, times the gate */
static void NP_NAME(np_v3_attend_items)(void *arg, int64_t lo, int64_t hi, int64_t worker) {
    const np_v3_attend_job *job = (const np_v3_attend_job *)arg;
    const np_v3_model *m = job->m;
    const np_v3_cache *c = job->c;
    const int64_t H = m->heads, qk = m->qk, vd = m->vd, group = H / m->kv_heads;
    float o[1024];
    float *work = job->ws->work + worker * job->ws->work_stride;
    for (int64_t item = lo; item < hi; item++) {
        int64_t r = job->first + item / H, h = item % H;
        int64_t p = job->start + r;
        int64_t from = c->window ? (p - c->window + 1 > 0 ? p - c->window + 1 : 0) : 0;
        NP_NAME(np_v3_attend_row)(job->ws->qcode + (r * H + h) * qk, job->ws->qscale[r * H + h],
                                  qk, vd, c, h / group, from, p, job->inv_sqrt_qk, o, work);
        float *g = job->gate + r * H * vd + h * vd;
        for (int64_t e = 0; e < vd; e++) g[e] = g[e] * o[e];
    }
}

/* -- attention of one part (one session's chunk) ------------------------------------------- */

static int NP_NAME(np_v3_attention_part)(const np_v3_model *m, const np_v3_layer *L, const np_v3_part *P,
                                const np_v3_cache *c, const float *fused, int64_t fused_w,
                                float *gate, np_v3_attn_ws *ws) {
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
        if (NP_NAME(np_a8_codes)(row, H, qk, ws->qcode + r * H * qk, ws->qscale + r * H)) return NP_NONFINITE;
        if (NP_NAME(np_a8_codes)(row + H * qk, KV, qk, ws->kcode + r * KV * qk, ws->kscale + r * KV))
            return NP_NONFINITE;
        if (NP_NAME(np_a8_codes)(conv + r * v_end + k_end, KV, vd, ws->vcode + r * KV * vd,
                        ws->vscale + r * KV))
            return NP_NONFINITE;
    }
    /* store then attend, 64 positions at a time: a ring keeps 64 slots beyond its window, so
     * a block's stores never overwrite a key one of its queries sees */
    np_v3_attend_job job = {m, c, ws, gate + P->row0 * H * vd, start, 0,
                            1.0 / sqrt((double)qk), 0};
    for (int64_t b0 = 0; b0 < count; b0 += 64) {
        int64_t b1 = b0 + 64 < count ? b0 + 64 : count;
        for (int64_t r = b0; r < b1; r++) {
            int64_t p = start + r;
            int64_t slot = c->window ? p % c->capacity : p;
            for (int64_t h = 0; h < KV; h++) {
                memcpy(c->kcode + (h * c->capacity + slot) * qk, ws->kcode + (r * KV + h) * qk,
                       (size_t)qk);
                c->kscale[h * c->capacity + slot] = ws->kscale[r * KV + h];
                memcpy(c->vcode + (h * c->capacity + slot) * vd, ws->vcode + (r * KV + h) * vd,
                       (size_t)vd);
                c->vscale[h * c->capacity + slot] = ws->vscale[r * KV + h];
            }
        }
        /* the block's query rows (position, head), split between threads when worth it */
        int64_t keys = start + b1, items = (b1 - b0) * H;
        job.first = b0;
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

/* -- the block range ----------------------------------------------------------------------- */
static int64_t NP_NAME(np_v3_max)(int64_t a, int64_t b) { return a > b ? a : b; }

/* Blocks first .. last-1 of lanes [R, n, d] (in place) for the chunks `parts`; site_k /
 * site_v [sites] point at each engram site's key / tapped value [R, d] (NULL where no block
 * of the range reads it); cells [R, cells_stride, d] (or NULL) receives the lane mean after
 * block l at cells[:, l - first + cells_offset]. */
static int NP_NAME(np_v3_blocks)(const np_v3_model *m, int64_t first, int64_t last, float *lanes, int64_t R,
                 const np_v3_part *parts, int64_t n_parts, const float *const *site_k,
                 const float *const *site_v, float *cells, int64_t cells_stride,
                 int64_t cells_offset) {
    const int64_t n = m->lanes, d = m->d, nd = n * d, H = m->heads, KV = m->kv_heads;
    const int64_t qk = m->qk, vd = m->vd;
    const int64_t k_end = (H + KV) * qk, v_end = k_end + KV * vd;
    if (qk > 256 || vd > 1024 || n > 16) return NP_BADARG;
    int threads = (int)m->threads;
    int64_t in_pad = 0, mixed_w = 0, fused_w = 0, longest = 1, max_count = 1;
    for (int64_t l = first; l < last; l++) {
        const np_v3_layer *L = &m->layers[l];
        in_pad = NP_NAME(np_v3_max)(in_pad, NP_NAME(np_v3_max)(L->phi.in_pad, NP_NAME(np_v3_max)(L->qkvg.in_pad,
                                                                        L->out_proj.in_pad)));
        mixed_w = NP_NAME(np_v3_max)(mixed_w, L->phi.out);
        fused_w = NP_NAME(np_v3_max)(fused_w, L->qkvg.out);
    }
    for (int64_t p = 0; p < n_parts; p++) {
        max_count = NP_NAME(np_v3_max)(max_count, parts[p].count);
        longest = NP_NAME(np_v3_max)(longest, parts[p].start + parts[p].count);
    }
    size_t floats = (size_t)(longest * (np_v3_max_threads(threads) - 1) /* attention work */
                             + R * nd          /* normed / new lanes */
                             + R * mixed_w + R * n * n * 2 + R * n * 2 /* gates */
                             + R * d * 5       /* u, block, h, attn, mlp */
                             + R * fused_w + R * H * vd /* fused, gate */
                             + R + nd + max_count * v_end + max_count * (H + KV) * qk
                             + max_count * (H + 2 * KV) + longest);
    size_t bytes = floats * sizeof(float) + (size_t)(R * in_pad) * sizeof(int32_t) +
                   (size_t)(max_count * (H * qk + KV * qk + KV * vd)) + 64;
    char *mem = (char *)malloc(bytes);
    if (!mem) return NP_NOMEM;
    float *f = (float *)mem;
    float *normed = f; f += R * nd;
    float *mixed = f; f += R * mixed_w;
    float *logits = f; f += R * n * n;
    float *hres = f; f += R * n * n;
    float *hpre = f; f += R * n;
    float *hpost = f; f += R * n;
    float *u = f; f += R * d;
    float *block = f; f += R * d;
    float *h = f; f += R * d;
    float *attn = f; f += R * d;
    float *upd = f; f += R * d;
    float *fused = f; f += R * fused_w;
    float *gate = f; f += R * H * vd;
    float *scale = f; f += R;
    float *sq = f; f += nd;
    np_v3_attn_ws ws;
    ws.conv = f; f += max_count * v_end;
    ws.heads_rows = f; f += max_count * (H + KV) * qk;
    ws.qscale = f; f += max_count * H;
    ws.kscale = f; f += max_count * KV;
    ws.vscale = f; f += max_count * KV;
    ws.work = f; f += longest * np_v3_max_threads(threads);
    ws.work_stride = longest;
    ws.sq = sq;
    int32_t *v = (int32_t *)f;
    int8_t *codes = (int8_t *)(v + R * in_pad);
    ws.qcode = codes; codes += max_count * H * qk;
    ws.kcode = codes; codes += max_count * KV * qk;
    ws.vcode = codes;
    int status = NP_OK;
    const float sqrt_d = (float)sqrt((double)d);
    for (int64_t l = first; l < last && status == NP_OK; l++) {
        const np_v3_layer *L = &m->layers[l];
        /* mHC route (mhc.route) */
        for (int64_t t = 0; t < R; t++) NP_NAME(np_v3_rms_unit)(lanes + t * nd, nd, normed + t * nd, sq);
        status = NP_NAME(np_v3_product_run)(&L->phi, normed, R, nd, v, scale, mixed, threads);
        if (status) break;
        for (int64_t t = 0; t < R; t++) {
            const float *mx = mixed + t * L->phi.out;
            for (int64_t i = 0; i < n; i++) {
                float a = L->a_pre * mx[i];
                a = a + L->b_pre[i];
                a = a + L->pre_offset[i];
                hpre[t * n + i] = NP_NAME(np_v3_sigmoid)(a);
                float b = L->a_post * mx[n + i];
                b = b + L->b_post[i];
                b = b + L->post_offset[i];
                hpost[t * n + i] = NP_NAME(np_v3_sigmoid)(b) * 2.0f;
            }
            for (int64_t k = 0; k < n * n; k++) {
                float z = L->a_res * mx[2 * n + k];
                logits[t * n * n + k] = z + L->b_res[k];
            }
        }
        status = NP_NAME(np_sinkhorn)(logits, R, n, 20, hres);
        if (status) break;
        for (int64_t t = 0; t < R; t++) NP_NAME(np_v3_lane_sum)(hpre + t * n, lanes + t * nd, n, d, u + t * d);
        /* engram gate (engram.engram_gate) */
        if (L->engram_site >= 0) {
            const float *key = site_k[L->engram_site], *value = site_v[L->engram_site];
            if (!key || !value) { status = NP_BADARG; break; }
            float *ru = attn, *rk = upd; /* scratch rows */
            for (int64_t t = 0; t < R; t++) {
                NP_NAME(np_v3_rms_unit)(u + t * d, d, ru, sq);
                NP_NAME(np_v3_rms_unit)(key + t * d, d, rk, sq);
                for (int64_t e = 0; e < d; e++) ru[e] = ru[e] * rk[e];
                float aff = NP_NAME(np_v3_pairwise)(ru, d);
                float g = NP_NAME(np_v3_sigmoid)(aff / sqrt_d);
                for (int64_t e = 0; e < d; e++) {
                    float prod = g * value[t * d + e];
                    block[t * d + e] = u[t * d + e] + prod;
                }
            }
        } else {
            memcpy(block, u, sizeof(float) * (size_t)(R * d));
        }
        /* attention (attention.attention_parts) */
        for (int64_t t = 0; t < R; t++) NP_NAME(np_v3_zc)(block + t * d, d, L->norm_in, h + t * d, sq);
        status = NP_NAME(np_v3_product_run)(&L->qkvg, h, R, d, v, scale, fused, threads);
        if (status) break;
        for (int64_t t = 0; t < R; t++)
            for (int64_t e = 0; e < H * vd; e++)
                gate[t * H * vd + e] = NP_NAME(np_v3_sigmoid)(fused[t * L->qkvg.out + v_end + e]);
        for (int64_t p = 0; p < n_parts && status == NP_OK; p++)
            status = NP_NAME(np_v3_attention_part)(m, L, &parts[p], parts[p].caches[l - first], fused,
                                          L->qkvg.out, gate, &ws);
        if (status) break;
        status = NP_NAME(np_v3_product_run)(&L->out_proj, gate, R, H * vd, v, scale, attn, threads);
        if (status) break;
        /* block + gate * ZC(attn), then + MLP(ZC(.)) - u (block.run_block) */
        for (int64_t t = 0; t < R; t++) {
            float *a = attn + t * d;
            NP_NAME(np_v3_zc)(a, d, L->post_norm, h + t * d, sq);
            for (int64_t e = 0; e < d; e++) {
                float g = h[t * d + e] * L->attn_gate;
                a[e] = g + block[t * d + e];
            }
            NP_NAME(np_v3_zc)(a, d, L->pre_hada, h + t * d, sq);
        }
        np_v3_mlp_job mlp = {m, L, h, upd, {NP_OK}};
        np_v3_parallel(NP_NAME(np_v3_mlp_rows), &mlp, R,
                       R * m->hada_n * m->hada_n >= (1 << 20) ? threads : 1);
        for (int i = 0; i < 16; i++)
            if (mlp.status[i]) status = mlp.status[i];
        if (status) break;
        for (int64_t t = 0; t < R * d; t++) {
            float y = upd[t] + attn[t];
            upd[t] = y - u[t];
        }
        /* mHC scatter (exact_ops.mix_lanes) */
        for (int64_t t = 0; t < R; t++) {
            const float *x = lanes + t * nd;
            float *out = normed + t * nd;
            for (int64_t i = 0; i < n; i++) {
                float *oi = out + i * d;
                NP_NAME(np_v3_lane_sum)(hres + (t * n + i) * n, x, n, d, oi);
                float hp = hpost[t * n + i];
                for (int64_t e = 0; e < d; e++) {
                    float prod = hp * upd[t * d + e];
                    oi[e] = oi[e] + prod;
                }
            }
        }
        memcpy(lanes, normed, sizeof(float) * (size_t)(R * nd));
        if (cells)
            for (int64_t t = 0; t < R; t++)
                NP_NAME(np_v3_lane_mean)(lanes + t * nd, n, d,
                                cells + (t * cells_stride + l - first + cells_offset) * d);
    }
    free(mem);
    return status;
}

/* logits [count, lm_head.out] of rows `rows` of lanes [R, n, d]: ZC(final_norm) of the lane
 * mean, then the exact LM-head product (batch.chunk_pass). */
static int NP_NAME(np_v3_readout)(const np_v3_model *m, const float *lanes, const int64_t *rows, int64_t count,
                  float *out) {
    const int64_t n = m->lanes, d = m->d;
    size_t floats = (size_t)(2 * count * d + d + count);
    char *mem = (char *)malloc(floats * sizeof(float) +
                               (size_t)(count * m->lm_head.in_pad) * sizeof(int32_t) + 64);
    if (!mem) return NP_NOMEM;
    float *mean = (float *)mem, *hidden = mean + count * d, *sq = hidden + count * d;
    float *scale = sq + d;
    int32_t *v = (int32_t *)(scale + count);
    for (int64_t i = 0; i < count; i++) {
        NP_NAME(np_v3_lane_mean)(lanes + rows[i] * n * d, n, d, mean + i * d);
        NP_NAME(np_v3_zc)(mean + i * d, d, m->final_norm, hidden + i * d, sq);
    }
    int status = NP_NAME(np_v3_product_run)(&m->lm_head, hidden, count, d, v, scale, out,
                                   (int)m->threads);
    free(mem);
    return status;
}

/* -- engram sites (engram.EngramChunk) ------------------------------------------------------ */
/* keys / values [sites, R, d]: each site's key and tapped value of every row of `parts`, from
 * the hashed n-grams of the parts' tokens; records the raw value projections in each part's
 * engram ring. */
static int NP_NAME(np_v3_engram)(const np_v3_model *m, const np_v3_part *parts, int64_t n_parts, int64_t R,
                 float *keys, float *values) {
    const int64_t d = m->d, tables = m->tables;
    int64_t width = 0, in_pad = 0, groups = 1;
    for (int64_t s = 0; s < m->n_sites; s++) {
        const np_v3_site *S = &m->sites[s];
        width = NP_NAME(np_v3_max)(width, tables * S->cols);
        in_pad = NP_NAME(np_v3_max)(in_pad, S->key_value.in_pad);
        groups = NP_NAME(np_v3_max)(groups, S->groups);
    }
    size_t floats = (size_t)(R * width + R * 2 * d + R + 2 * R * tables * groups * 128);
    char *mem = (char *)malloc(floats * sizeof(float) + (size_t)(R * in_pad) * sizeof(int32_t) +
                               (size_t)(R * tables) * sizeof(int64_t) + 64);
    if (!mem) return NP_NOMEM;
    int64_t *rows = (int64_t *)mem;
    float *lookup = (float *)(rows + R * tables), *proj = lookup + R * width;
    float *scale = proj + R * 2 * d, *vals = scale + R, *deq = vals + R * tables * groups * 128;
    int32_t *v = (int32_t *)(deq + R * tables * groups * 128);
    /* table rows (ops.engram_slots); -1: the n-gram reaches before position 0 */
    for (int64_t p = 0; p < n_parts; p++) {
        const np_v3_part *P = &parts[p];
        for (int64_t r = 0; r < P->count; r++)
            for (int64_t j = 0; j < tables; j++) {
                int64_t order = m->table_order[j];
                uint64_t acc = (uint64_t)m->table_seed[j];
                for (int64_t back = 0; back < order; back++) {
                    int64_t at = P->known + r - back;
                    uint64_t previous = at >= 0 ? (uint64_t)P->tokens[at] : 0u;
                    acc = ((acc ^ previous) * 0x01000193u) & 0xFFFFFFFFu;
                }
                acc ^= acc >> 15;
                int64_t slot = (int64_t)(acc % (uint64_t)m->slots) + j * m->slots;
                rows[(P->row0 + r) * tables + j] = P->start + r >= order - 1 ? slot : -1;
            }
    }
    int status = NP_OK;
    for (int64_t s = 0; s < m->n_sites && status == NP_OK; s++) {
        const np_v3_site *S = &m->sites[s];
        const int64_t sub = S->cols, per = 8 / S->storage_bits, mask = (1 << S->storage_bits) - 1;
        const int64_t w = tables * sub;
        /* gather + dequantise (kernels/cq.gather_rows: codebook value * norm, then
         * np_dequant_rows in the fixtures' order), all rows of the site in one call */
        const int64_t span = S->groups * 128;
        for (int64_t t = 0; t < R; t++)
            for (int64_t j = 0; j < tables; j++) {
                float *src = vals + (t * tables + j) * span;
                int64_t row = rows[t * tables + j];
                if (row < 0) {
                    for (int64_t c = 0; c < span; c++) src[c] = 0.0f;
                    continue;
                }
                const uint8_t *b = S->packed + row * S->row_bytes;
                const float *nr = S->norms + row * S->groups;
                for (int64_t c = 0; c < span; c++) {
                    int code = (b[c / per] >> (S->storage_bits * (c % per))) & mask;
                    src[c] = S->codebook[code] * nr[c / 128];
                }
            }
        NP_NAME(np_dequant_rows)(vals, R * tables, S->groups, m->h, deq);
        for (int64_t t = 0; t < R; t++)
            for (int64_t j = 0; j < tables; j++) {
                float *dst = lookup + t * w + j * sub;
                if (rows[t * tables + j] < 0)
                    for (int64_t c = 0; c < sub; c++) dst[c] = 0.0f;
                else
                    memcpy(dst, deq + (t * tables + j) * span, sizeof(float) * (size_t)sub);
            }
        status = NP_NAME(np_v3_product_run)(&S->key_value, lookup, R, w, v, scale, proj, (int)m->threads);
        if (status) break;
        const int64_t reach = S->n_taps > 1 ? (S->n_taps - 1) * S->dilation : 0;
        for (int64_t p = 0; p < n_parts; p++) {
            const np_v3_part *P = &parts[p];
            float *ring = P->engram ? P->engram + s * P->engram_rows * d : NULL;
            for (int64_t r = 0; r < P->count; r++) {
                int64_t t = P->row0 + r;
                const float *raw = proj + t * 2 * d + d;
                memcpy(keys + (s * R + t) * d, proj + t * 2 * d, sizeof(float) * (size_t)d);
                float *out = values + (s * R + t) * d;
                for (int64_t e = 0; e < d; e++) out[e] = S->taps[e] * raw[e];
                for (int64_t tap = 1; tap < S->n_taps; tap++) {
                    int64_t back = tap * S->dilation;
                    const float *prev = NULL;
                    if (r - back >= 0)
                        prev = proj + (t - back) * 2 * d + d;
                    else if (P->start + r - back >= 0 && ring)
                        prev = ring + ((P->start + r - back) % P->engram_rows) * d;
                    const float *tp = S->taps + tap * d;
                    for (int64_t e = 0; e < d; e++) {
                        float term = tp[e] * (prev ? prev[e] : 0.0f);
                        out[e] = out[e] + term;
                    }
                }
            }
            if (reach && ring) {
                int64_t keep = P->count < P->engram_rows ? P->count : P->engram_rows;
                for (int64_t r = P->count - keep; r < P->count; r++)
                    memcpy(ring + ((P->start + r) % P->engram_rows) * d,
                           proj + (P->row0 + r) * 2 * d + d, sizeof(float) * (size_t)d);
            }
        }
    }
    free(mem);
    return status;
}
