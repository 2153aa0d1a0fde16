/* The block-scaled int8 kernels of the transformer models' int8 numerics (kernels/i8.py is
 * the contract and the numpy reference of every function here; both compute the same bits),
 * part of the one native library (needlepoint_native.c): I8_TYPES gives the types, I8_API
 * the entry points. The kernel bodies (np_i8_body.h, np_i8_rows.h) are compiled once per
 * variant with the library's other kernels and dispatched by its one CPU-feature pick; the
 * variants differ only in how the exact integer dots are formed, so they give the same bits.
 */
#ifdef I8_TYPES

#define I8_OK 0
#define I8_NONFINITE 1
#define I8_NOMEM 2
#define I8_BADARG 3
/* GELU-tanh's -2 sqrt(2/pi) as models/transformer/int8.py rounds it: the float64 constant
 * rounded to float32, times -2 (exact) */
#define I8_GELU_C ((float)0.044715)
#define I8_GELU_K ((float)0.7978845608028654 * -2.0f)

/* A packed weight (kernels/i8.py I8Weight) and a product of one input into several of them,
 * outputs side by side (models/transformer/linear.py Int8Linear). */
typedef struct {
    int64_t n_out, groups, nb;
    int32_t bits, threads, half;
    int32_t wtype;              /* 0: the packed I8Weight; else a GGUF block type (np_wt.h) */
    const uint8_t *data;        /* wtype: the weight's rows as stored, row_bytes apart */
    const void *scale, *offset; /* float32, or float16 when half */
    int64_t row_bytes;
} i8_part;

/* float16 bits -> float32, exactly (normal, subnormal, zero, inf, NaN). */
static inline float i8_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t bits;
    float out;
    if (exp == 0) {
        out = (float)man * 5.9604644775390625e-08f; /* man * 2^-24, exact */
        memcpy(&bits, &out, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&out, &bits, 4);
    return out;
}

#include "np_wt_types.h"

typedef struct {
    const i8_part *parts;
    int64_t n_parts, k_in, k_pad, n_total;
    const float *bias;
} i8_lin;

/* One block's geometry and weights (np_i8_block.h). `up` is gate | up when gated. */
typedef struct {
    int64_t d, heads, kv_heads, head_dim, d_ff;
    int32_t gated, gelu, center, rope;
    double eps;
    float factor;
    int32_t unused;
    const float *n1w, *n1b, *n2w, *n2b;
    i8_lin qkv, o, up, down;
} i8_layer;

#endif /* I8_TYPES */

#ifdef I8_API
int i8_quantize(const float *x, int64_t T, int64_t K, int64_t k_pad, int8_t *codes,
                float *scale, int32_t *sums) {
    if (k_pad % 32 || K > k_pad) return I8_BADARG;
    return NP_DISPATCH(i8_quantize, x, T, K, k_pad, codes, scale, sums);
}

int i8_norm(const float *x, int64_t T, int64_t d, const float *w, const float *bias,
            double eps, int center, float *out) {
    return NP_DISPATCH(i8_norm, x, T, d, w, bias, eps, center, out);
}

/* What every pooled product job shares: T quantised rows of nb blocks in, n_out outputs
 * (+ bias) written to rows out_stride floats apart. */
typedef struct {
    const int8_t *codes;
    int64_t T, nb, n_out;
    const float *bias;
    float *out;
    int64_t out_stride;
} i8_io;

typedef struct {
    i8_io io;
    const float *xscale;
    const int32_t *xsums;
    int bits;
    const uint8_t *wdata;
    const void *wscale, *woffset;
    int half;
} i8_job;

static void i8_groups(void *arg, int64_t lo, int64_t hi, int64_t share) {
    const i8_job *j = (const i8_job *)arg;
    const i8_io *io = &j->io;
    (void)share;
    NP_DISPATCH(i8_matmul_groups, io->codes, j->xscale, j->xsums, io->T, io->nb, j->bits,
                j->wdata, j->wscale, j->woffset, j->half, lo, hi, io->n_out, io->bias, io->out,
                io->out_stride);
}

/* y [T, n_out] (row stride out_stride) of quantised rows times a packed weight of `groups`
 * groups of 8 outputs. The groups are split into `threads` ranges on the library's worker
 * pool (np_pool.h); each output is computed whole by one thread, so the bits do not depend
 * on the thread count. Products under about a million multiply-adds stay on the calling
 * thread. */
int i8_matmul(const int8_t *codes, const float *xscale, const int32_t *xsums, int64_t T,
              int64_t nb, int bits, const uint8_t *wdata, const void *wscale,
              const void *woffset, int half, int64_t groups, int64_t n_out, const float *bias,
              float *out, int64_t out_stride, int threads) {
    if ((bits != 8 && bits != 4) || n_out > groups * 8) return I8_BADARG;
    if (T * groups * 8 * nb * 32 < NP_POOL_MIN_WORK) threads = 1;
    i8_job job = {{codes, T, nb, n_out, bias, out, out_stride}, xscale, xsums, bits, wdata,
                  wscale, woffset, half};
    np_pool_run(i8_groups, &job, groups, threads);
    return I8_OK;
}

void i8_attend_causal(const int16_t *qcode, const float *qscale, int64_t T, int64_t start,
                      int64_t heads, int64_t kv_heads, int64_t hd, const int16_t *kcode,
                      const float *kscale, const int8_t *vcode, const float *vscale,
                      float *out, float *work) {
    NP_DISPATCH(i8_attend_causal, qcode, qscale, T, start, heads, kv_heads, hd, kcode, kscale,
                vcode, vscale, out, work);
}

/* -- products over GGUF blocks as stored (np_wt.h) ---------------------------------------- */
typedef struct {
    i8_io io;
    const double *xs;
    const int32_t *xh;
    int wtype;
    const uint8_t *data;
    int64_t row_bytes;
    int status[NP_POOL_MAX];
} wt_job;

static void wt_tiles(void *arg, int64_t lo, int64_t hi, int64_t share) {
    wt_job *j = (wt_job *)arg;
    const i8_io *io = &j->io;
    j->status[share] = NP_DISPATCH(wt_matmul_tiles, io->codes, j->xs, j->xh, io->T, io->nb,
                                   j->wtype, j->data, j->row_bytes, io->n_out, io->bias,
                                   io->out, io->out_stride, lo, hi);
}

/* y [T, n_out] (row stride out_stride) of quantised rows times a weight of GGUF type `wtype`
 * (np_wt.h) whose row n starts at data + n * row_bytes (kernels/blockweight.py). Tiles of 4
 * outputs are split into `threads` ranges on the worker pool; every output is computed whole
 * by one thread, so the bits do not depend on the thread count. `xsums` is unused: the
 * half-block sums are taken from the codes. */
int wt_matmul(const int8_t *codes, const float *xscale, const int32_t *xsums, int64_t T,
              int64_t nb, int wtype, const uint8_t *data, int64_t row_bytes, int64_t n_out,
              const float *bias, float *out, int64_t out_stride, int threads) {
    (void)xsums;
    if (wtype < 1 || wtype > WT_LAST || T < 0 || n_out < 0 || nb < 0) return I8_BADARG;
    if (wtype >= WT_Q2_K && nb % 8) return I8_BADARG;
    size_t n = (size_t)(T * nb);
    double *xs = (double *)malloc(sizeof(double) * (n ? n : 1));
    int32_t *xh = (int32_t *)malloc(sizeof(int32_t) * 2 * (n ? n : 1));
    int st = I8_NOMEM;
    if (xs && xh) {
        for (size_t i = 0; i < n; i++) {
            const int8_t *x = codes + i * 32;
            int32_t h0 = 0, h1 = 0;
            for (int k = 0; k < 16; k++) h0 += x[k];
            for (int k = 16; k < 32; k++) h1 += x[k];
            xs[i] = (double)xscale[i];
            xh[2 * i] = h0;
            xh[2 * i + 1] = h1;
        }
        if (T * n_out * nb * 32 < NP_POOL_MIN_WORK) threads = 1;
        wt_job job = {{codes, T, nb, n_out, bias, out, out_stride}, xs, xh, wtype, data,
                      row_bytes, {0}};
        np_pool_run(wt_tiles, &job, (n_out + WT_R - 1) / WT_R, threads);
        st = I8_OK;
        for (int i = 0; i < NP_POOL_MAX; i++)
            if (job.status[i]) st = job.status[i];
    }
    free(xs);
    free(xh);
    return st;
}

#include "np_i8_block.h"

#endif /* I8_API */
