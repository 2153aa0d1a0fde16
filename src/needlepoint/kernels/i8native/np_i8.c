/* needlepoint's block-scaled int8 kernels (kernels/i8.py is the contract and the numpy
 * reference of every function here; both compute the same bits).
 *
 * Built by setup.py as its own optional extension and called through ctypes (kernels/
 * i8_native.py; ctypes releases the GIL during each call). Compiled with -ffp-contract=off:
 * every float operation is one IEEE operation. Each kernel is compiled three times from
 * np_i8_body.h (AVX-512 VNNI, AVX2, and baseline x86-64 / any other CPU); the first call picks
 * the variant by CPU features (NEEDLEPOINT_I8_VARIANT=0 / 1 caps it at the baseline / AVX2).
 * The variants differ only in how the exact integer dots are formed, so they give the same
 * bits.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define I8_OK 0
#define I8_NONFINITE 1
#define I8_NOMEM 2
#define I8_BADARG 3
#define I8_MAX_THREADS 16
/* GELU-tanh's -2 sqrt(2/pi) as models/transformer/int8.py rounds it: the float64 constant
 * rounded to float32, times -2 (exact) */
#define I8_GELU_C ((float)0.044715)
#define I8_GELU_K ((float)0.7978845608028654 * -2.0f)

/* A packed weight (kernels/i8.py I8Weight) and a product of one input into several of them,
 * outputs side by side (models/transformer/linear.py Int8Linear). */
typedef struct {
    int64_t n_out, groups, nb;
    int32_t bits, threads, half, unused;
    const uint8_t *data;
    const void *scale, *offset; /* float32, or float16 when half */
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

#if defined(__GNUC__) && defined(__x86_64__) && !defined(I8_BASELINE_ONLY)
#define I8_HAVE_AVX2 1
#define I8_NAME(name) name##_avx2
#define I8_SIMD_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#include <immintrin.h>
#include "np_i8_body.h"
#include "np_i8_rows.h"
#pragma GCC pop_options
#undef I8_NAME
/* AVX-512 VNNI (on 256-bit vectors, AVX512VL): the block dots with vpdpbusd, everything else
 * the AVX2 code recompiled; the same exact integers, so the same bits. */
#if defined(__clang__) || __GNUC__ >= 8
#define I8_HAVE_VNNI 1
#define I8_NAME(name) name##_vnni
#define I8_SIMD_VNNI 1
#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#include "np_i8_body.h"
#include "np_i8_rows.h"
#pragma GCC pop_options
#undef I8_SIMD_VNNI
#undef I8_NAME
#endif
#undef I8_SIMD_AVX2
#endif

#define I8_NAME(name) name##_base
#include "np_i8_body.h"
#include "np_i8_rows.h"
#undef I8_NAME

static int i8_variant = -1; /* 0 baseline, 1 AVX2, 2 AVX-512 VNNI */

/* The best variant this CPU runs. */
static int i8_best(void) {
    int v = 0;
#ifdef I8_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) v = 1;
#endif
#ifdef I8_HAVE_VNNI
    if (v == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        v = 2;
#endif
    return v;
}

static int i8_pick(void) {
    if (i8_variant < 0) {
        int v = i8_best();
        /* NEEDLEPOINT_I8_VARIANT=0 / 1 caps the choice at the baseline / AVX2 variant */
        const char *force = getenv("NEEDLEPOINT_I8_VARIANT");
        if (force && force[0] >= '0' && force[0] < '0' + v) v = force[0] - '0';
        i8_variant = v;
    }
    return i8_variant;
}

#if defined(I8_HAVE_VNNI)
#define I8_DISPATCH(name, ...)                                                                 \
    (i8_pick() == 2   ? name##_vnni(__VA_ARGS__)                                              \
     : i8_pick() == 1 ? name##_avx2(__VA_ARGS__)                                              \
                      : name##_base(__VA_ARGS__))
#elif defined(I8_HAVE_AVX2)
#define I8_DISPATCH(name, ...) (i8_pick() ? name##_avx2(__VA_ARGS__) : name##_base(__VA_ARGS__))
#else
#define I8_DISPATCH(name, ...) name##_base(__VA_ARGS__)
#endif

int i8_abi_version(void) { return 3; }

/* 2 when the AVX-512 VNNI variant runs, 1 for AVX2, 0 for the baseline one. */
int i8_simd_variant(void) { return i8_pick(); }

/* Run the baseline (0), the AVX2 (1) or the AVX-512 VNNI (2) variant from now on (tests),
 * or the best one below it that this CPU has; returns the variant that runs. */
int i8_force_variant(int v) {
    i8_pick();
    int best = i8_best();
    i8_variant = v < 0 ? 0 : v > best ? best : v;
    return i8_variant;
}

int i8_quantize(const float *x, int64_t T, int64_t K, int64_t k_pad, int8_t *codes,
                float *scale, int32_t *sums) {
    if (k_pad % 32 || K > k_pad) return I8_BADARG;
    return I8_DISPATCH(i8_quantize, x, T, K, k_pad, codes, scale, sums);
}

int i8_norm(const float *x, int64_t T, int64_t d, const float *w, const float *bias,
            double eps, int center, float *out) {
    return I8_DISPATCH(i8_norm, x, T, d, w, bias, eps, center, out);
}

typedef struct {
    const int8_t *codes;
    const float *xscale;
    const int32_t *xsums;
    int64_t T, nb;
    int bits;
    const uint8_t *wdata;
    const void *wscale, *woffset;
    int half;
    int64_t g_first, g_last, n_out;
    const float *bias;
    float *out;
    int64_t out_stride;
} i8_job;

static void i8_run(const i8_job *j) {
    I8_DISPATCH(i8_matmul_groups, j->codes, j->xscale, j->xsums, j->T, j->nb, j->bits, j->wdata,
                j->wscale, j->woffset, j->half, j->g_first, j->g_last, j->n_out, j->bias,
                j->out, j->out_stride);
}

static void *i8_worker(void *arg) {
    i8_run((const i8_job *)arg);
    return NULL;
}

/* y [T, n_out] (row stride out_stride) of quantised rows times a packed weight of `groups`
 * groups of 8 outputs. The groups are split between `threads` POSIX threads started for
 * this call and joined before it returns (no pool); each output is computed whole by one
 * thread, so the bits do not depend on the thread count. Products under about a million
 * multiply-adds stay on the calling thread. */
int i8_matmul(const int8_t *codes, const float *xscale, const int32_t *xsums, int64_t T,
              int64_t nb, int bits, const uint8_t *wdata, const void *wscale,
              const void *woffset, int half, int64_t groups, int64_t n_out, const float *bias,
              float *out, int64_t out_stride, int threads) {
    if ((bits != 8 && bits != 4) || n_out > groups * 8) return I8_BADARG;
    if (threads > I8_MAX_THREADS) threads = I8_MAX_THREADS;
    if (threads > groups) threads = (int)groups;
    if (T * groups * 8 * nb * 32 < (1 << 20)) threads = 1;
    i8_job jobs[I8_MAX_THREADS];
    pthread_t ids[I8_MAX_THREADS];
    int started[I8_MAX_THREADS] = {0};
    if (threads < 1) threads = 1;
    for (int i = 0; i < threads; i++) {
        i8_job job = {codes, xscale, xsums, T, nb, bits, wdata, wscale, woffset, half,
                      groups * i / threads, groups * (i + 1) / threads, n_out, bias, out,
                      out_stride};
        jobs[i] = job;
    }
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&ids[i], NULL, i8_worker, &jobs[i]) == 0;
    i8_run(&jobs[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(ids[i], NULL);
        else
            i8_run(&jobs[i]); /* could not start a thread: do its share here */
    }
    return I8_OK;
}

void i8_exp32_array(const float *x, int64_t n, float *out) {
    I8_DISPATCH(i8_exp32_array, x, n, out);
}

int i8_a8_rows(const float *x, int64_t T, int64_t cols, int8_t *codes, float *scale) {
    return I8_DISPATCH(i8_a8_rows, x, T, cols, codes, scale);
}

void i8_attend_causal(const int8_t *qcode, const float *qscale, int64_t T, int64_t start,
                      int64_t heads, int64_t kv_heads, int64_t hd, const int8_t *kcode,
                      const float *kscale, const int8_t *vcode, const float *vscale,
                      float *out, float *work) {
    I8_DISPATCH(i8_attend_causal, qcode, qscale, T, start, heads, kv_heads, hd, kcode, kscale,
                vcode, vscale, out, work);
}

#include "np_i8_block.h"

/* A module entry point so setup.py can build the file as an extension module;
 * kernels/i8_native.py loads the same file with ctypes. */
#ifdef I8_PYTHON_MODULE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef i8_module = {PyModuleDef_HEAD_INIT, "_np_i8",
                                       "needlepoint's int8 kernels (used through ctypes)", -1,
                                       NULL, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__np_i8(void) { return PyModule_Create(&i8_module); }
#endif
