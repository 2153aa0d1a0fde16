/* The whole Needle 3 deploy forward of a batch of chunks in one call (np_v3_step): the
 * embedding rows, the engram sites, every block and the wanted LM-head rows, with the scratch
 * of every part kept in the caller's arena between calls (np_v3_types.h), so a decode step
 * is one native call that allocates nothing. models/needle3/forward.py `forward` (embed,
 * run_blocks, readout) is the reference: the same operations in the same order, called from
 * here (the bits are those of the three calls it replaces). */

/* codebook[code] * norm of CQ rows `rows` [count] (LSB-first 2- or 4-bit codes, 128-groups)
 * as float32 [count, groups * 128]: kernels/cq.py `rotated_weights` */
static void NP_NAME(np_v3_cq_rows)(const uint8_t *packed, const float *norms,
                                   const float *codebook, int64_t row_bytes, int64_t groups,
                                   int64_t bits, const int64_t *rows, int64_t count,
                                   float *vals) {
    const int64_t span = groups * 128, per = 8 / bits, mask = (1 << bits) - 1;
    for (int64_t t = 0; t < count; t++) {
        const uint8_t *b = packed + rows[t] * row_bytes;
        const float *nr = norms + rows[t] * groups;
        float *dst = vals + t * span;
        for (int64_t c = 0; c < span; c++) {
            int code = (b[c / per] >> (bits * (c % per))) & mask;
            dst[c] = codebook[code] * nr[c / 128];
        }
    }
}

/* Logits [n_out, lm_head.out] of rows out_rows of the chunks `parts` (R rows in all, their
 * tokens [R] stacked in part order) after blocks 0 .. layers-1. x0: the scaled embedding
 * rows [R, d] when the model has no CQ embedding (emb_packed NULL), else NULL (gathered here:
 * forward.embed, E[tok] * sqrt(d)). cells [R, cells_stride, d] (or NULL): x0 at cell row 0,
 * the lane mean after block l at row l + 1. Every part carries its engram history and ring
 * (np_v3_engram). */
static int NP_NAME(np_v3_step)(const np_v3_model *m, np_arena *arena, int64_t layers,
                               const int64_t *tokens, const float *x0_in, int64_t R,
                               const np_v3_part *parts, int64_t n_parts, float *cells,
                               int64_t cells_stride, const int64_t *out_rows, int64_t n_out,
                               float *logits) {
    const int64_t n = m->lanes, d = m->d, groups = m->emb_groups;
    if (R <= 0 || layers <= 0 || (!m->emb_packed && !x0_in)) return NP_BADARG;
    if (m->emb_packed && groups * 128 < d) return NP_BADARG;
    const int64_t span = m->emb_packed ? groups * 128 : 0;
    size_t floats = (size_t)(R * d + 2 * R * span + R * n * d);
    float *x0 = (float *)np_scratch(arena, NP_SLOT_STEP, floats * sizeof(float) + 64);
    float *sites = m->n_sites
        ? (float *)np_scratch(arena, NP_SLOT_SITES, (size_t)(2 * m->n_sites * R * d) * sizeof(float))
        : NULL;
    int status = NP_OK;
    if (!x0 || (m->n_sites && !sites)) status = NP_NOMEM;
    float *vals = x0 ? x0 + R * d : NULL, *deq = vals ? vals + R * span : NULL;
    float *lanes = deq ? deq + R * span : NULL;
    if (status == NP_OK && m->emb_packed) {
        for (int64_t t = 0; t < R; t++) /* a token outside the table is the caller's bug */
            if (tokens[t] < 0) status = NP_BADARG;
        if (status == NP_OK) {
            NP_NAME(np_v3_cq_rows)(m->emb_packed, m->emb_norms, m->emb_codebook, m->emb_row_bytes,
                                   groups, m->emb_storage_bits, tokens, R, vals);
            NP_NAME(np_dequant_rows)(vals, R, groups, m->h, deq);
            const float root = sqrtf((float)d);
            for (int64_t t = 0; t < R; t++)
                for (int64_t e = 0; e < d; e++) x0[t * d + e] = deq[t * span + e] * root;
        }
    } else if (status == NP_OK) {
        memcpy(x0, x0_in, sizeof(float) * (size_t)(R * d));
    }
    if (status == NP_OK) {
        for (int64_t t = 0; t < R; t++)
            for (int64_t i = 0; i < n; i++)
                memcpy(lanes + (t * n + i) * d, x0 + t * d, sizeof(float) * (size_t)d);
        if (cells)
            for (int64_t t = 0; t < R; t++)
                memcpy(cells + t * cells_stride * d, x0 + t * d, sizeof(float) * (size_t)d);
    }
    const float *site_k[64] = {0}, *site_v[64] = {0};
    if (status == NP_OK && m->n_sites) {
        if (m->n_sites > 64) status = NP_BADARG;
        else status = NP_NAME(np_v3_engram)(m, parts, n_parts, R, sites, sites + m->n_sites * R * d,
                                            arena);
        for (int64_t s = 0; s < m->n_sites && status == NP_OK; s++) {
            site_k[s] = sites + s * R * d;
            site_v[s] = sites + (m->n_sites + s) * R * d;
        }
    }
    if (status == NP_OK)
        status = NP_NAME(np_v3_blocks)(m, 0, layers, lanes, R, parts, n_parts, site_k, site_v,
                                       cells, cells_stride, 1, arena);
    if (status == NP_OK && n_out > 0) {
        for (int64_t i = 0; i < n_out; i++)
            if (out_rows[i] < 0 || out_rows[i] >= R) status = NP_BADARG;
        if (status == NP_OK) status = NP_NAME(np_v3_readout)(m, lanes, out_rows, n_out, logits, arena);
    }
    np_scratch_done(arena, x0);
    if (sites) np_scratch_done(arena, sites);
    return status;
}
