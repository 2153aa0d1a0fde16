/* The Needle 3 deploy forward of a batch of chunks in one call: the bodies, included once per
 * instruction-set variant (every name through NP_NAME); np_v3_types.h has the structs and
 * says what the call does. */
#include "np_v3_rows.h"

/* -- the block range ----------------------------------------------------------------------- */
static int64_t NP_NAME(np_v3_max)(int64_t a, int64_t b) { return a > b ? a : b; }

/* Blocks first .. last-1 of lanes [R, n, d] (in place) for the chunks `parts`; site_k /
 * site_v [sites] point at each engram site's key / tapped value [R, d] (NULL where no block
 * of the range reads it); cells [R, cells_stride, d] (or NULL) receives the lane mean after
 * block l at cells[:, l - first + cells_offset]. */
static int NP_NAME(np_v3_blocks)(const np_v3_model *m, int64_t first, int64_t last, float *lanes, int64_t R,
                 const np_v3_part *parts, int64_t n_parts, const float *const *site_k,
                 const float *const *site_v, float *cells, int64_t cells_stride,
                 int64_t cells_offset, np_arena *arena) {
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
    size_t floats = (size_t)(longest * (NP_ATT_GMAX * np_v3_max_threads(threads) - 1) /* attention work */
                             + R * nd          /* normed / new lanes */
                             + R * mixed_w + R * n * n * 2 + R * n * 2 /* gates */
                             + R * d * 5       /* u, block, h, attn, mlp */
                             + R * fused_w + R * H * vd /* fused, gate */
                             + R + nd + max_count * v_end + max_count * (H + KV) * qk
                             + R * H + max_count * 2 * KV + longest);
    size_t bytes = floats * sizeof(float) + (size_t)(R * in_pad) * sizeof(int32_t) +
                   (size_t)(R * H * qk + max_count * (KV * qk + KV * vd)) + 64 +
                   (size_t)n_parts * (sizeof(np_v3_attend_job) + sizeof(int64_t)) + 16;
    char *mem = (char *)np_scratch(arena, NP_SLOT_BLOCKS, bytes);
    if (!mem) return NP_NOMEM;
    /* the step's attention rows of every session at once (np_v3_attend_parts) */
    np_v3_attend_job *att_jobs = (np_v3_attend_job *)mem;
    int64_t *att_first = (int64_t *)(att_jobs + n_parts);
    float *f = (float *)(att_first + n_parts + 1);
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
    ws.qscale = f; f += R * H;
    ws.kscale = f; f += max_count * KV;
    ws.vscale = f; f += max_count * KV;
    ws.work = f; f += longest * NP_ATT_GMAX * np_v3_max_threads(threads);
    ws.work_stride = longest * NP_ATT_GMAX; /* np_att_rows: a row of scores per head */
    ws.sq = sq;
    int32_t *v = (int32_t *)f;
    int8_t *codes = (int8_t *)(v + R * in_pad);
    ws.qcode = codes; codes += R * H * qk;
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
        for (int64_t t = 0; t < R; t++) { /* sigmoid = 1 / (exp32(-x) + 1), exps eight at a time */
            float *g = gate + t * H * vd;
            const float *x = fused + t * L->qkvg.out + v_end;
            for (int64_t e = 0; e < H * vd; e++) g[e] = -x[e];
            NP_NAME(np_exp32_array)(g, H * vd, g);
            for (int64_t e = 0; e < H * vd; e++) {
                float s = g[e] + 1.0f;
                g[e] = 1.0f / s;
            }
        }
        /* per session: its taps, norms, RoPE, A8 and cache stores; the attention rows of every
         * session of at most 64 positions (the decode rows) then in one split between the
         * threads, the longer chunks' rows inside np_v3_attention_part */
        int64_t n_att = 0, att_work = 0;
        att_first[0] = 0;
        for (int64_t p = 0; p < n_parts && status == NP_OK; p++) {
            const np_v3_part *P = &parts[p];
            att_jobs[n_att].m = NULL;
            status = NP_NAME(np_v3_attention_part)(m, L, P, P->caches[l - first], fused,
                                                   L->qkvg.out, gate, &ws, &att_jobs[n_att]);
            if (att_jobs[n_att].m) {
                att_first[n_att + 1] = att_first[n_att] + P->count * H;
                att_work += P->count * H * (P->start + P->count) * (qk + vd);
                n_att++;
            }
        }
        if (status) break;
        np_v3_attend_all all = {att_jobs, att_first, n_att};
        np_v3_parallel(NP_NAME(np_v3_attend_parts), &all, att_first[n_att],
                       att_work >= (1 << 19) ? threads : 1);
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
    np_scratch_done(arena, mem);
    return status;
}

/* logits [count, lm_head.out] of rows `rows` of lanes [R, n, d]: ZC(final_norm) of the lane
 * mean, then the exact LM-head product (batch.chunk_pass). */
static int NP_NAME(np_v3_readout)(const np_v3_model *m, const float *lanes, const int64_t *rows, int64_t count,
                  float *out, np_arena *arena) {
    const int64_t n = m->lanes, d = m->d;
    size_t floats = (size_t)(2 * count * d + d + count);
    char *mem = (char *)np_scratch(arena, NP_SLOT_READOUT,
                                   floats * sizeof(float) +
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
    np_scratch_done(arena, mem);
    return status;
}

/* -- engram sites (engram.EngramChunk) ------------------------------------------------------ */
/* keys / values [sites, R, d]: each site's key and tapped value of every row of `parts`, from
 * the hashed n-grams of the parts' tokens; records the raw value projections in each part's
 * engram ring. */
static int NP_NAME(np_v3_engram)(const np_v3_model *m, const np_v3_part *parts, int64_t n_parts, int64_t R,
                 float *keys, float *values, np_arena *arena) {
    const int64_t d = m->d, tables = m->tables;
    int64_t width = 0, in_pad = 0, groups = 1;
    for (int64_t s = 0; s < m->n_sites; s++) {
        const np_v3_site *S = &m->sites[s];
        width = NP_NAME(np_v3_max)(width, tables * S->cols);
        in_pad = NP_NAME(np_v3_max)(in_pad, S->key_value.in_pad);
        groups = NP_NAME(np_v3_max)(groups, S->groups);
    }
    size_t floats = (size_t)(R * width + R * 2 * d + R + 2 * R * tables * groups * 128);
    char *mem = (char *)np_scratch(arena, NP_SLOT_ENGRAM,
                                   floats * sizeof(float) + (size_t)(R * in_pad) * sizeof(int32_t) +
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
    np_scratch_done(arena, mem);
    return status;
}
