/* Types of the Needle 3 deploy forward of a batch of chunks in one call (fixture README "Forward pass"
 * step 5, docs/numerics.md): a range of blocks for the rows of several sessions' chunks, and
 * the read-out (final norm + LM-head rows). models/needle3/block.py `run_block` and
 * batch.py `chunk_pass` are the numpy reference: every operation below is the same IEEE
 * operation in the same order (compiled once, with -ffp-contract=off; the products, the
 * attention row, Sinkhorn and the Hadamard MLP go through the dispatched kernels above).
 *
 * A session's state is numpy memory the call reads and writes in place: per layer the int8
 * K/V codes and scales ([KV, capacity, dim], position p in slot p % capacity on bounded
 * layers), the ring of raw q|k|v rows (the conv taps' tail) and [position, filled]. */

typedef struct {
    int64_t storage_bits;
    const float *codebook;
    int64_t codebook_len;
    const np_cq_part *parts;
    int64_t n_parts;
} np_v3_mat;

typedef struct { /* one fused exact product: A8(x) @ W^T, matrices side by side */
    const np_v3_mat *mats;
    int64_t n_mats;
    int64_t in_pad;
    int64_t out;
} np_v3_product;

typedef struct {
    np_v3_product phi, qkvg, out_proj;
    const float *b_pre, *b_post, *pre_offset, *post_offset, *b_res;
    const float *norm_in, *qk_scale, *taps, *post_norm, *pre_hada;
    const float *const *mlp_vec; /* d1, d2, b2, d3, d4 */
    const float *const *mlp_mats; /* w1a, w1b, w2a, w2b, w3a, w3b */
    const float *cond_v, *cond_u;
    int64_t n_taps; /* rows of taps (0: no conv) */
    int64_t engram_site; /* -1: none */
    float a_pre, a_post, a_res, attn_gate;
} np_v3_layer;

typedef struct { /* one engram site (models/needle3/engram.py): its CQ tables, projection, taps */
    const uint8_t *packed; /* [tables * slots, row_bytes], LSB-first 2- or 4-bit codes */
    const float *norms; /* [tables * slots, groups] */
    const float *codebook;
    int64_t row_bytes, groups, storage_bits, cols;
    np_v3_product key_value; /* [tables * cols] -> key | value [2d] */
    const float *taps; /* [n_taps, d] */
    int64_t n_taps, dilation;
} np_v3_site;

typedef struct {
    int64_t d, lanes, heads, kv_heads, qk, vd, hada_n, ba, max_seq, threads;
    const np_v3_layer *layers;
    const int64_t *p1, *p2;
    const float *rope_cos, *rope_sin; /* [max_seq, qk]: cos | cos, -sin | sin */
    const float *final_norm;
    np_v3_product lm_head;
    const np_v3_site *sites;
    int64_t n_sites, tables, slots;
    const int64_t *table_order, *table_seed; /* per table: n-gram order, hash seed */
    float h; /* f32(1 / sqrt(128)): the dequantisation's Hadamard entry */
    /* the embedding as CQ rows of 128-groups for np_v3_step's gather (packed NULL: the caller
     * passes the scaled embedding rows) */
    const uint8_t *emb_packed;
    const float *emb_norms, *emb_codebook;
    int64_t emb_row_bytes, emb_groups, emb_storage_bits;
} np_v3_model;

typedef struct { /* one layer's cache of one session (models/needle3/exact_attention.py) */
    int8_t *kcode;
    float *kscale;
    int8_t *vcode;
    float *vscale;
    float *raw; /* [raw_rows, v_end]: raw q|k|v of position p in row p % raw_rows */
    int64_t *meta; /* position, filled */
    int64_t capacity, window, raw_rows;
    /* the keys again sixteen slots to a vector (np_att_rows): [KV][capacity16 / 16][qk / 4][16][4]
     * codes, four per 32-bit lane, and each slot's code sum [KV][capacity16] (capacity16: the
     * capacity rounded up to 16); NULL: not kept */
    int8_t *ktile;
    int32_t *ksum;
} np_v3_cache;

typedef struct { /* the rows row0 .. row0+count-1 are positions start .. of one session */
    int64_t row0, count, start;
    const np_v3_cache *const *caches; /* one per block of the call's range */
    const int64_t *tokens; /* engram: `known` tokens before the chunk, then its `count` */
    int64_t known;
    float *engram; /* [sites, engram_rows, d]: raw value projection of position p in row
                      p % engram_rows (engram_history.py) */
    int64_t engram_rows;
} np_v3_part;

/* the dispatched entry points the per-variant bodies call (needlepoint_native.c) */
int np_cq_matmul_threads(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                         int storage_bits, const float *codebook, int64_t codebook_len,
                         const np_cq_part *parts, int64_t n_parts, float *out,
                         int64_t out_stride, int64_t r_first, int64_t r_last, int threads);

typedef struct { /* scratch of one part's attention */
    float *conv, *sq;
    int8_t *qcode, *kcode, *vcode;
    float *qscale, *kscale, *vscale, *heads_rows, *work; /* work: one row per thread */
    int64_t work_stride;
} np_v3_attn_ws;

/* Scratch kept between calls (np_v3_step): one buffer per slot, grown when a call needs more
 * and reused by the next, so a decode step allocates nothing (a fresh malloc of a large buffer
 * is a fresh mapping whose pages the kernel clears at every step). Owned by one thread at a
 * time (models/needle3/native_block.py keeps one per thread); NULL: each call allocates and
 * frees its own. */
#define NP_ARENA_SLOTS 6
typedef struct {
    void *buf[NP_ARENA_SLOTS];
    size_t cap[NP_ARENA_SLOTS];
} np_arena;

static void *np_scratch(np_arena *a, int slot, size_t bytes) {
    if (!a) return malloc(bytes);
    if (a->cap[slot] < bytes) {
        free(a->buf[slot]);
        a->buf[slot] = malloc(bytes);
        a->cap[slot] = a->buf[slot] ? bytes : 0;
    }
    return a->buf[slot];
}

static void np_scratch_done(np_arena *a, void *mem) {
    if (!a) free(mem);
}

/* arena slots of the step's parts */
enum { NP_SLOT_ENGRAM, NP_SLOT_BLOCKS, NP_SLOT_READOUT, NP_SLOT_STEP, NP_SLOT_SITES };

static int np_v3_max_threads(int threads) { return threads < 1 ? 1 : threads > 16 ? 16 : threads; }

/* Threads inside one call: `fn(ctx, lo, hi, share)` over [0, n) split into `threads`
 * contiguous ranges on the library's worker pool (np_pool.h: parked workers, nothing created
 * per call, nothing spinning); range 0 runs on the calling thread. Every item is computed
 * whole by one thread, so the bits do not depend on the count. */
typedef np_pool_fn np_v3_fn;

static void np_v3_parallel(np_v3_fn fn, void *ctx, int64_t n, int threads) {
    np_pool_run(fn, ctx, n, threads);
}

/* one block's attention rows / one layer's MLP rows, for np_v3_parallel */
typedef struct {
    const np_v3_model *m;
    const np_v3_cache *c;
    const np_v3_attn_ws *ws;
    float *gate; /* the part's first row */
    int64_t start, first;
    double inv_sqrt_qk;
    int64_t qrow0; /* the part's first row in ws->qcode / ws->qscale (its row0) */
} np_v3_attend_job;

/* the attention rows of several parts (sessions) in one split: part i's rows are the items
 * first_item[i] .. first_item[i + 1] - 1, each (position, head) of jobs[i] */
typedef struct {
    const np_v3_attend_job *jobs;
    const int64_t *first_item;
    int64_t n;
} np_v3_attend_all;

typedef struct {
    const np_v3_model *m;
    const np_v3_layer *L;
    const float *x;
    float *out;
    int status[16];
} np_v3_mlp_job;
