/* int8 attention (docs/numerics.md "int8 attention"). Included once per instruction-set
 * variant (np_variant.h); needs np_exp.h. */
/* -- int8 attention -------------------------------------------------------------------- */
/* One query row (a head of one position) against `n` int8 keys/values of its kv head, in
 * position order: score_j = float32(((dot_j * sq) * sk_j) * inv_sqrt_qk) with dot_j the exact
 * int32 product of the codes; m = max_j score_j; e_j = exp32(score_j - m); total = sum_j e_j
 * (float32, j ascending); p_j = e_j / total; out = sum_j p_j * (vcode_j * sv_j) (float32, j
 * ascending, each product and sum rounded). Keys j are the slots listed in `slots`. */
static void NP_NAME(np_attend)(const int8_t *qcode, const float *qscale, int64_t Q, int64_t qk,
               const int8_t *kcode, const float *kscale, const int8_t *vcode,
               const float *vscale, int64_t vd, const int64_t *slots, const int64_t *count,
               int64_t slots_stride, double inv_sqrt_qk, float *out, float *work) {
    for (int64_t i = 0; i < Q; i++) {
        const int8_t *q = qcode + i * qk;
        double sq = (double)qscale[i];
        int64_t n = count[i];
        const int64_t *sl = slots + i * slots_stride;
        float peak = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            const int8_t *k = kcode + sl[j] * qk;
            int32_t dot = 0;
            for (int64_t e = 0; e < qk; e++) dot += (int32_t)q[e] * (int32_t)k[e];
            double t = (double)dot * sq;
            t = t * (double)kscale[sl[j]];
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
        float *o = out + i * vd;
        for (int64_t e = 0; e < vd; e++) o[e] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float p = work[j] / total;
            const int8_t *vv = vcode + sl[j] * vd;
            float sv = vscale[sl[j]];
            for (int64_t e = 0; e < vd; e++) {
                float value = (float)vv[e] * sv;
                float prod = p * value;
                o[e] = o[e] + prod;
            }
        }
    }
}
