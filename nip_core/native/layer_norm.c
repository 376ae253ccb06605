/* K stacked layer norms over the last dimension, y = (x - mean) / sqrt(var + eps) w + b, forward
 * and backward, on the CPU.
 *
 * Built and loaded by nip_core/native/build.py (docs/performance.md, "The layer-norm kernel").
 * The GI bodies' transformer normalises ~12,000 rows of 16 numbers per layer norm; ATen's kernel
 * reduces each short row inside a vector and costs about twenty times the memory traffic, and
 * the stacked bodies' per-body affine is another pass each way. Here the vector lanes run across
 * LANES rows (as in the other kernels of this directory), so the mean, the variance and the
 * backward pass's two row sums are plain vector arithmetic over the d elements.
 *
 * x and gx are float32 or bfloat16 (x_bf16), y and gy float32 or bfloat16 (y_bf16), (K, M, d)
 * row-major; w, b (K, d) and their gradients are float32, or w == NULL for no affine. mean and
 * rstd (K * M floats) are written by the forward pass for the backward pass. Arithmetic is
 * float32; the variance is the mean of squared deviations from the mean (two passes); weight
 * gradients are summed per lane over the blocks, then over the lanes in order.
 */
#include "lanes.h"

static inline vf row_stats(const vf *x, int64_t d, float eps, vf *rstd) {
    vf sum = splat(0.0f);
    for (int64_t e = 0; e < d; e++) sum += x[e];
    const vf mean = sum / (float)d;
    vf sq = splat(0.0f);
    for (int64_t e = 0; e < d; e++) {
        const vf dev = x[e] - mean;
        sq += dev * dev;
    }
    const vf var = sq / (float)d + eps;
    for (int64_t v = 0; v < LANES; v++) (*rstd)[v] = 1.0f / sqrtf(var[v]);
    return mean;
}

static void store_stats(vf value, int64_t at, int64_t lanes, float *dst) {
    for (int64_t v = 0; v < lanes; v++) dst[at + v] = value[v];
}

static vf load_stats(const float *src, int64_t at, int64_t lanes) {
    vf out = splat(0.0f);
    for (int64_t v = 0; v < lanes; v++) out[v] = src[at + v];
    return out;
}

/* Returns 0, or -1 when the work buffer could not be allocated. */
int nip_layer_norm_forward(int64_t K, int64_t M, int64_t d, const void *x, int x_bf16, const float *w,
                           const float *b, float eps, void *y, int y_bf16, float *mean_out, float *rstd_out) {
    vf *xv = malloc((size_t)(2 * d) * sizeof(vf));
    if (!xv) return -1;
    vf *yv = xv + d;
    const size_t x_elem = x_bf16 ? 2 : 4, y_elem = y_bf16 ? 2 : 4;
    for (int64_t k = 0; k < K; k++) {
        const char *xk = (const char *)x + (size_t)(k * M * d) * x_elem;
        char *yk = (char *)y + (size_t)(k * M * d) * y_elem;
        for (int64_t r0 = 0; r0 < M; r0 += LANES) {
            const int64_t lanes = M - r0 < LANES ? M - r0 : LANES;
            gather(xk, x_bf16, r0, lanes, d, (float *)xv);
            vf rstd;
            const vf mean = row_stats(xv, d, eps, &rstd);
            for (int64_t e = 0; e < d; e++) {
                const vf xhat = (xv[e] - mean) * rstd;
                yv[e] = w ? xhat * w[k * d + e] + b[k * d + e] : xhat;
            }
            scatter((const float *)yv, y_bf16, r0, lanes, d, yk);
            store_stats(mean, k * M + r0, lanes, mean_out);
            store_stats(rstd, k * M + r0, lanes, rstd_out);
        }
    }
    free(xv);
    return 0;
}

int nip_layer_norm_backward(int64_t K, int64_t M, int64_t d, const void *x, int x_bf16, const float *w,
                            const float *mean_in, const float *rstd_in, const void *gy, int y_bf16, void *gx,
                            float *gw, float *gb) {
    vf *xv = malloc((size_t)(5 * d) * sizeof(vf));
    if (!xv) return -1;
    vf *gv = xv + d, *gxv = gv + d, *aw = gxv + d, *ab = aw + d;
    const size_t x_elem = x_bf16 ? 2 : 4, y_elem = y_bf16 ? 2 : 4;
    for (int64_t k = 0; k < K; k++) {
        const char *xk = (const char *)x + (size_t)(k * M * d) * x_elem;
        const char *gyk = (const char *)gy + (size_t)(k * M * d) * y_elem;
        char *gxk = (char *)gx + (size_t)(k * M * d) * x_elem;
        for (int64_t e = 0; e < 2 * d; e++) aw[e] = splat(0.0f);
        for (int64_t r0 = 0; r0 < M; r0 += LANES) {
            const int64_t lanes = M - r0 < LANES ? M - r0 : LANES;
            gather(xk, x_bf16, r0, lanes, d, (float *)xv);
            gather(gyk, y_bf16, r0, lanes, d, (float *)gv);  /* lanes past the end have gradient 0 */
            const vf mean = load_stats(mean_in, k * M + r0, lanes), rstd = load_stats(rstd_in, k * M + r0, lanes);
            /* g = gy w; gx = rstd (g - mean(g) - xhat mean(g xhat)) */
            vf sum_g = splat(0.0f), sum_gx = splat(0.0f);
            for (int64_t e = 0; e < d; e++) {
                const vf xhat = (xv[e] - mean) * rstd;
                xv[e] = xhat;
                if (w) {
                    aw[e] += gv[e] * xhat;
                    ab[e] += gv[e];
                    gv[e] = gv[e] * w[k * d + e];
                }
                sum_g += gv[e];
                sum_gx += gv[e] * xhat;
            }
            const vf mean_g = sum_g / (float)d, mean_gx = sum_gx / (float)d;
            for (int64_t e = 0; e < d; e++) gxv[e] = rstd * (gv[e] - mean_g - xv[e] * mean_gx);
            scatter((const float *)gxv, x_bf16, r0, lanes, d, gxk);
        }
        if (w)
            for (int64_t e = 0; e < d; e++) {
                float tw = 0.0f, tb = 0.0f;
                for (int64_t v = 0; v < LANES; v++) {
                    tw += aw[e][v];
                    tb += ab[e][v];
                }
                gw[k * d + e] = tw;
                gb[k * d + e] = tb;
            }
    }
    free(xv);
    return 0;
}
