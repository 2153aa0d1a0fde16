/* needlepoint's one native library (docs/numerics.md is the contract; every entry point has a
 * pure-numpy reference that computes the same bits: kernels/exact.py, kernels/pinned.py,
 * models/needle3/block.py + batch.py for the Needle 3 step, kernels/i8.py for the int8
 * kernels).
 *
 * Built by the package's own setup.py as a plain shared library and called through ctypes
 * (ctypes releases the GIL during each call; kernels/native/__init__.py is the one binding
 * module). Compiled with -ffp-contract=off: every float operation below is one IEEE
 * operation, never fused, so numpy can reproduce it exactly. Every kernel is compiled three
 * times (np_variant.h lists the headers, one per kernel family: AVX-512 VNNI, AVX2 + FMA +
 * F16C, and baseline x86-64); the first call picks the variant by CPU features, one pick for
 * all of them (NEEDLEPOINT_NATIVE_VARIANT=0 / 1, the one variable, caps it at the baseline /
 * AVX2 one). Exactness never depends on the
 * variant: the products are exact sums (integer level sums in np_cq_int.h, any order gives
 * the same float64), and the pinned-order kernels use no FMA and no reassociation in any
 * variant.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NP_OK 0
#define NP_NONFINITE 1
#define NP_NOMEM 2
#define NP_BADARG 3

typedef struct {
    const uint8_t *packed;
    int64_t row_bytes;
    const float *norms;
    int64_t rows;
    int64_t out_col;
    /* NULL, or the codes regrouped by 16-row blocks at load (the same bytes): 2-bit codes
     * row-interleaved for the lookup kernel (np_cq_lut.h np_lut_split; kernels/code_layout.py
     * interleave_codes), 4-bit codes in 4-byte columns (np_cq_int4.h; block_codes) */
    const uint8_t *interleaved;
} np_cq_part;

#include "np_pool.h"
#include "np_v3_types.h"
#define I8_TYPES
#include "np_i8.h"
#undef I8_TYPES

#if defined(__GNUC__) && defined(__x86_64__) && !defined(NP_BASELINE_ONLY)
#define NP_HAVE_AVX2 1
#include <immintrin.h>
#define NP_SIMD_AVX2 1
#define NP_NAME(name) name##_avx2
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "np_variant.h"
#pragma GCC pop_options
#undef NP_NAME
/* AVX-512 (F, BW, VL, DQ) with VNNI: the integer CQ products and the int8 block dots use
 * vpdpbusd (np_cq_int.h, np_i8_body.h); every other kernel is the AVX2 one recompiled (same
 * bits: no fused or reassociated float operations). */
#if defined(__clang__) || __GNUC__ >= 8
#define NP_HAVE_AVX512 1
#define NP_SIMD_AVX512 1
#define NP_NAME(name) name##_avx512
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#include "np_variant.h"
#pragma GCC pop_options
#undef NP_NAME
#undef NP_SIMD_AVX512
#endif
#undef NP_SIMD_AVX2
#endif

#define NP_NAME(name) name##_base
#include "np_variant.h"
#undef NP_NAME

static int np_variant = -1; /* 0 baseline, 1 AVX2 + FMA + F16C, 2 AVX-512 VNNI */

/* The best variant this CPU runs. */
static int np_best(void) {
    int v = 0;
#ifdef NP_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        v = 1;
#endif
#ifdef NP_HAVE_AVX512
    if (v == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        v = 2;
#endif
    return v;
}

/* The one CPU-feature pick of every kernel: the best variant the CPU runs, capped by
 * NEEDLEPOINT_NATIVE_VARIANT = 0 / 1. */
static int np_pick(void) {
    if (np_variant < 0) {
        int v = np_best();
        const char *force = getenv("NEEDLEPOINT_NATIVE_VARIANT");
        if (force && force[0] >= '0' && force[0] < '0' + v) v = force[0] - '0';
        np_variant = v;
    }
    return np_variant;
}

/* Run the baseline (0), the AVX2 (1) or the AVX-512 VNNI (2) variant from now on (tests), or
 * the best one below it that this CPU has; returns the variant that runs. */
int np_force_variant(int v) {
    np_pick();
    int best = np_best();
    np_variant = v < 0 ? 0 : v > best ? best : v;
    return np_variant;
}

#if defined(NP_HAVE_AVX512)
#define NP_DISPATCH(name, ...)                                                                 \
    (np_pick() == 2   ? name##_avx512(__VA_ARGS__)                                            \
     : np_pick() == 1 ? name##_avx2(__VA_ARGS__)                                              \
                      : name##_base(__VA_ARGS__))
#elif defined(NP_HAVE_AVX2)
#define NP_DISPATCH(name, ...) (np_pick() ? name##_avx2(__VA_ARGS__) : name##_base(__VA_ARGS__))
#else
#define NP_DISPATCH(name, ...) name##_base(__VA_ARGS__)
#endif

int np_abi_version(void) { return 17; }

/* 2 when the AVX-512 VNNI variant runs, 1 for AVX2 + FMA, 0 for the baseline one. */
int np_simd_variant(void) { return np_pick(); }

int np_a8_rotate(const float *x, int64_t T, int64_t cols, int64_t x_stride, int64_t in_pad,
                 int32_t *v, float *scale) {
    return NP_DISPATCH(np_a8_rotate, x, T, cols, x_stride, in_pad, v, scale);
}

int np_cq_matmul(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                 int storage_bits, const float *codebook, int64_t codebook_len,
                 const np_cq_part *parts, int64_t n_parts, float *out, int64_t out_stride,
                 int64_t r_first, int64_t r_last) {
    return NP_DISPATCH(np_cq_matmul, v, scale, T, in_pad, storage_bits, codebook, codebook_len,
                       parts, n_parts, out, out_stride, r_first, r_last);
}

/* Which kernel the 2- and 4-bit products run from now on (k >= 0; benchmarks and tests
 * comparing them in one process): 0 the default pick by variant, row count and layout copy
 * (np_cq_int), 1 the level-sum / digit kernels (np_cq_int.h, np_cq_int16.h; for 4-bit storage
 * the digit kernel), 2 the table-lookup kernel (np_cq_lut.h) at every row count for 2-bit
 * storage (4-bit: as 0), 3 the transform on the weights (np_cq_had.h on AVX-512 VNNI,
 * np_cq_had2.h on AVX2; on the baseline, or when v is not an A8 rotation, the default pick) at every row count for 2-bit storage, 5
 * the table-lookup kernel at every row count one 16-row block at a time (the AVX2 form; with
 * the interleaved copy the AVX-512 variant otherwise takes two full blocks per zmm register).
 * Same bits in every case. Returns the previous pick. */
int np_cq_kernel(int k) {
    int old = np_cq_kernel_pick;
    if (k >= 0) np_cq_kernel_pick = k;
    return old;
}

/* kernels/code_layout.py interleave_codes_reference, byte for byte: the lookup kernel's copy
 * of 2-bit codes [rows, row_bytes] (row stride `stride`) into out [ceil(rows / 16),
 * 16 * row_bytes]. Plain C in every variant: it moves bytes once per load. */
void np_cq_interleave(const uint8_t *packed, int64_t rows, int64_t row_bytes, int64_t stride,
                      uint8_t *out) {
    static const uint8_t rev4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    uint8_t nib[256];
    for (int b = 0; b < 256; b++) {
        int n = 0;
        for (int s = 0; s < 4; s++) n |= ((b >> (2 * s)) & 1) << s | ((b >> (2 * s + 1)) & 1) << (s + 4);
        nib[b] = (uint8_t)n;
    }
    int64_t groups = row_bytes / 32;
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        uint8_t *block = out + r0 * row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            uint8_t *dst = block + g * 512;
            for (int i = 0; i < 16; i++) {
                const uint8_t *src = r0 + i < rows ? packed + (r0 + i) * stride + g * 32 : NULL;
                for (int o = 0; o < 16; o++) {
                    dst[o * 32 + i] = src ? nib[src[rev4[o]]] : 0;
                    dst[o * 32 + 16 + i] = src ? nib[src[16 + rev4[o]]] : 0;
                }
            }
        }
    }
}

/* kernels/code_layout.py block_codes_reference, byte for byte: 4-bit codes [rows, row_bytes] (row
 * stride `stride`) into out [ceil(rows / 16), 16 * row_bytes], per 16-row block and 64-byte
 * group 16 registers of 64 bytes, register k holding bytes 4k .. 4k + 3 of rows 0..15 in turn
 * (np_cq_int4.h np_b4_group; rows past `rows` zero). Plain C in every variant. */
void np_cq_block4(const uint8_t *packed, int64_t rows, int64_t row_bytes, int64_t stride,
                  uint8_t *out) {
    int64_t groups = row_bytes / 64;
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t g = 0; g < groups; g++) {
            uint8_t *dst = out + r0 * row_bytes + g * 1024;
            for (int i = 0; i < 16; i++) {
                const uint8_t *src = packed + (r0 + i) * stride + g * 64;
                for (int k = 0; k < 16; k++) {
                    if (r0 + i < rows)
                        memcpy(dst + k * 64 + i * 4, src + k * 4, 4);
                    else
                        memset(dst + k * 64 + i * 4, 0, 4);
                }
            }
        }
}

/* np_cq_matmul with the output rows split into `threads` ranges on the worker pool
 * (np_pool.h). Each range is whole outputs, so the bits do not depend on the thread count.
 * Small products (under about a million multiply-adds) stay on the calling thread. */
typedef struct {
    const int32_t *v;
    const float *scale;
    int64_t T, in_pad;
    int storage_bits;
    const float *codebook;
    int64_t codebook_len;
    const np_cq_part *parts;
    int64_t n_parts;
    float *out;
    int64_t out_stride, r_first;
    int status[NP_POOL_MAX];
} np_cq_job;

static void np_cq_rows(void *arg, int64_t lo, int64_t hi, int64_t share) {
    np_cq_job *job = (np_cq_job *)arg;
    job->status[share] = np_cq_matmul(job->v, job->scale, job->T, job->in_pad, job->storage_bits,
                                      job->codebook, job->codebook_len, job->parts, job->n_parts,
                                      job->out, job->out_stride, job->r_first + lo,
                                      job->r_first + hi);
}

int np_cq_matmul_threads(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                         int storage_bits, const float *codebook, int64_t codebook_len,
                         const np_cq_part *parts, int64_t n_parts, float *out,
                         int64_t out_stride, int64_t r_first, int64_t r_last, int threads) {
    int64_t total = 0;
    for (int64_t p = 0; p < n_parts; p++) total += parts[p].rows;
    if (r_last > total) r_last = total;
    int64_t rows = r_last - r_first;
    if (threads <= 1 || rows < 2 * threads || T * rows * in_pad < NP_POOL_MIN_WORK)
        return np_cq_matmul(v, scale, T, in_pad, storage_bits, codebook, codebook_len, parts,
                            n_parts, out, out_stride, r_first, r_last);
    np_cq_job job = {v, scale, T, in_pad, storage_bits, codebook, codebook_len, parts, n_parts,
                     out, out_stride, r_first, {0}};
    np_pool_run(np_cq_rows, &job, rows, threads);
    for (int i = 0; i < NP_POOL_MAX; i++)
        if (job.status[i]) return job.status[i];
    return NP_OK;
}

void np_matmul_seq(const float *x, int64_t T, int64_t K, int64_t x_stride, const float *w,
                   int64_t N, float *out) {
    NP_DISPATCH(np_matmul_seq, x, T, K, x_stride, w, N, out);
}

float np_exp32(float x) { return NP_DISPATCH(np_exp32, x); }

void np_attend(const void *qcode, const float *qscale, int64_t Q, int64_t qk,
               const void *kcode, int key16, const float *kscale, const int8_t *vcode,
               const float *vscale, int64_t vd, const int64_t *slots, const int64_t *count,
               int64_t slots_stride, double inv_sqrt_qk, float *out, float *work) {
    NP_DISPATCH(np_attend, qcode, qscale, Q, qk, kcode, key16, kscale, vcode, vscale, vd, slots,
                count, slots_stride, inv_sqrt_qk, out, work);
}

void np_exp32_array(const float *x, int64_t n, float *out) {
    NP_DISPATCH(np_exp32_array, x, n, out);
}

void np_exp64_array(const double *x, int64_t n, double *out) {
    NP_DISPATCH(np_exp64_array, x, n, out);
}

int np_a8_codes(const float *x, int64_t T, int64_t cols, int8_t *codes, float *scale) {
    return NP_DISPATCH(np_a8_codes, x, T, cols, codes, scale);
}

int np_a16_codes(const float *x, int64_t T, int64_t cols, int16_t *codes, float *scale) {
    return NP_DISPATCH(np_a16_codes, x, T, cols, codes, scale);
}

int np_hadamard_mlp(const float *x, int64_t T, int64_t d, int64_t n, int64_t ba, int64_t bb,
                    const float *const *vec, const float *const *mats, const float *cond_v,
                    const float *cond_u, int64_t rank, const int64_t *p1, const int64_t *p2,
                    float *out) {
    return NP_DISPATCH(np_hadamard_mlp, x, T, d, n, ba, bb, vec, mats, cond_v, cond_u, rank, p1,
                       p2, out);
}

int np_sinkhorn(const float *logits, int64_t T, int64_t n, int rounds, float *out) {
    return NP_DISPATCH(np_sinkhorn, logits, T, n, rounds, out);
}

void np_dequant_rows(const float *rotated, int64_t rows, int64_t groups, float h, float *out) {
    NP_DISPATCH(np_dequant_rows, rotated, rows, groups, h, out);
}

/* The Needle 3 deploy forward: engram sites, a block range, the read-out (np_v3_types.h). */
int np_v3_blocks(const np_v3_model *m, int64_t first, int64_t last, float *lanes, int64_t R,
                 const np_v3_part *parts, int64_t n_parts, const float *const *site_k,
                 const float *const *site_v, float *cells, int64_t cells_stride,
                 int64_t cells_offset) {
    return NP_DISPATCH(np_v3_blocks, m, first, last, lanes, R, parts, n_parts, site_k, site_v,
                       cells, cells_stride, cells_offset, NULL);
}

int np_v3_readout(const np_v3_model *m, const float *lanes, const int64_t *rows, int64_t count,
                  float *out) {
    return NP_DISPATCH(np_v3_readout, m, lanes, rows, count, out, NULL);
}

int np_v3_engram(const np_v3_model *m, const np_v3_part *parts, int64_t n_parts, int64_t R,
                 float *keys, float *values) {
    return NP_DISPATCH(np_v3_engram, m, parts, n_parts, R, keys, values, NULL);
}

int np_v3_step(const np_v3_model *m, np_arena *arena, int64_t layers, const int64_t *tokens,
               const float *x0, int64_t R, const np_v3_part *parts, int64_t n_parts,
               float *cells, int64_t cells_stride, const int64_t *out_rows, int64_t n_out,
               float *logits) {
    return NP_DISPATCH(np_v3_step, m, arena, layers, tokens, x0, R, parts, n_parts, cells,
                       cells_stride, out_rows, n_out, logits);
}

/* Frees an arena's buffers (its owner is gone); the arena itself is the caller's memory. */
void np_arena_free(np_arena *arena) {
    for (int i = 0; i < NP_ARENA_SLOTS; i++) {
        free(arena->buf[i]);
        arena->buf[i] = NULL;
        arena->cap[i] = 0;
    }
}

/* The int8 kernels' entry points (np_i8.h, np_i8_block.h). */
#define I8_API
#include "np_i8.h"
#undef I8_API

/* A module entry point so the build (a setuptools Extension) can name it like any other
 * extension module; kernels/native/__init__.py loads the same file with ctypes. */
#ifdef NP_PYTHON_MODULE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef np_module = {PyModuleDef_HEAD_INIT, "_needlepoint_native",
                                       "needlepoint's native kernels (used through ctypes)",
                                       -1, NULL, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__needlepoint_native(void) { return PyModule_Create(&np_module); }
#endif
