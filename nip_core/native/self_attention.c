/* Multi-head self-attention over short sequences, forward and backward, on the CPU.
 *
 * Built and loaded by nip_core/native/build.py (docs/performance.md, "The attention kernel").
 * The graph-isomorphism bodies attend over 2 + 2N tokens (24 for 11-node graphs) with heads
 * of size 4. As batched matrix products that is thousands of tiny matrices, each costing far
 * more in call overhead than in arithmetic, and every row reduction (the softmax's max and
 * sum, the dot products of size 4) is too short for vector instructions.
 *
 * So the vector lanes run across sequences instead: LANES sequences are transposed into a
 * block whose every value is a vector of LANES numbers, one per sequence, and each
 * (head, query) row of scores, the masked softmax, the weighted sum and, backwards, all three
 * gradients are then plain elementwise vector arithmetic, with every reduction running over
 * the loop, never inside a vector. Each lane's arithmetic is the scalar computation in a
 * fixed order (no reassociation, no fast-math), so results do not depend on how sequences
 * fall into blocks. q, k and v are read from the packed projection (G, L, 3, H, dh) and its
 * gradient is written in the same layout: no transposes or copies around the kernel.
 *
 * Values are float32 or bfloat16 (bf16 == 1) in memory; all arithmetic is float32. The mask
 * is additive, float32, (mask_batch, L, L); sequence g uses mask g % mask_batch (the bodies
 * stack K agents' sequences as g = k * B + b over one (B, L, L) mask). `weights` holds the
 * softmax for the backward pass in the kernel's own blocked layout:
 * nip_self_attention_weights_size(G, L, H) floats.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
typedef float vf __attribute__((vector_size(LANES * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4), aligned(4)));

static inline vf splat(float x) {
    vf out = {0};
    return out + x;
}

static inline vf lane_select(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

/* exp(x) lane by lane, to about 2 ulp (Cephes' single-precision polynomial after reduction by
 * ln 2). Below the smallest normal result it returns 0, so exp(-inf) = 0; NaN stays NaN. */
static inline vf vexp(vf x) {
    const float hi = 88.37626f, lo = -87.33654f;
    vf xc = lane_select(x > hi, splat(hi), x);
    xc = lane_select(xc < lo, splat(lo), xc);
    /* n = round(x / ln 2) by adding and subtracting 1.5 * 2^23 */
    const vf shifter = splat(12582912.0f);
    vf n = (xc * 1.44269504088896341f + shifter) - shifter;
    vf r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return lane_select(x < lo, splat(0.0f), p * (vf)e);
}

static inline float bf16_to_float(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t float_to_bf16(float f) {
    /* round to nearest even, as torch converts; NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* dst[e][v] = row (g0 + v) of src, element e (rows of n values); lanes past the end are 0.
 * Element by element across the rows, so that every store fills a whole vector. */
static void gather(const void *src, int bf16, int64_t g0, int64_t lanes, int64_t n, float *dst) {
    if (lanes == LANES && !bf16) {
        const float *rows = (const float *)src + g0 * n;
        for (int64_t e = 0; e < n; e++)
            for (int64_t v = 0; v < LANES; v++) dst[e * LANES + v] = rows[v * n + e];
    } else if (lanes == LANES) {
        const uint16_t *rows = (const uint16_t *)src + g0 * n;
        for (int64_t e = 0; e < n; e++)
            for (int64_t v = 0; v < LANES; v++) dst[e * LANES + v] = bf16_to_float(rows[v * n + e]);
    } else {
        memset(dst, 0, (size_t)(n * LANES) * sizeof(float));
        for (int64_t v = 0; v < lanes; v++)
            for (int64_t e = 0; e < n; e++) {
                int64_t at = (g0 + v) * n + e;
                dst[e * LANES + v] = bf16 ? bf16_to_float(((const uint16_t *)src)[at]) : ((const float *)src)[at];
            }
    }
}

/* Row (g0 + v) of dst, element e, = src[e][v], for the block's real lanes. */
static void scatter(const float *src, int bf16, int64_t g0, int64_t lanes, int64_t n, void *dst) {
    if (lanes == LANES && !bf16) {
        float *rows = (float *)dst + g0 * n;
        for (int64_t e = 0; e < n; e++)
            for (int64_t v = 0; v < LANES; v++) rows[v * n + e] = src[e * LANES + v];
    } else if (lanes == LANES) {
        uint16_t *rows = (uint16_t *)dst + g0 * n;
        for (int64_t e = 0; e < n; e++)
            for (int64_t v = 0; v < LANES; v++) rows[v * n + e] = float_to_bf16(src[e * LANES + v]);
    } else {
        for (int64_t v = 0; v < lanes; v++)
            for (int64_t e = 0; e < n; e++) {
                int64_t at = (g0 + v) * n + e;
                if (bf16)
                    ((uint16_t *)dst)[at] = float_to_bf16(src[e * LANES + v]);
                else
                    ((float *)dst)[at] = src[e * LANES + v];
            }
    }
}

int64_t nip_self_attention_lanes(void) { return LANES; }

int64_t nip_self_attention_weights_size(int64_t G, int64_t L, int64_t H) {
    return (G + LANES - 1) / LANES * LANES * H * L * L;
}

/* One block's forward pass. Inlined with dh a constant where dh == 4 (the GI bodies' heads), so
 * that the per-dimension accumulators live in registers as independent chains. Sums over j run
 * as two interleaved partial sums (even and odd j), in the same order for every lane. */
static inline __attribute__((always_inline)) void forward_block(int64_t L, int64_t H, const int64_t dh,
                                                                float scale, const vf *x, const vf *m,
                                                                vf *w_block, vf *o, vf *s) {
    const int64_t D = H * dh, C = 3 * D;
    vf qs[dh], acc[dh];
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < L; i++) {
            const vf *q = x + i * C + h * dh;
            for (int64_t d = 0; d < dh; d++) qs[d] = q[d] * scale;
            vf top = splat(-INFINITY);
            for (int64_t j = 0; j < L; j++) {
                const vf *k = x + j * C + D + h * dh;
                vf score = qs[0] * k[0];
                for (int64_t d = 1; d < dh; d++) score += qs[d] * k[d];
                score += m[i * L + j];
                s[j] = score;
                top = lane_select(score > top, score, top);
            }
            vf total[2] = {splat(0.0f), splat(0.0f)};
            for (int64_t j = 0; j < L; j++) {
                s[j] = vexp(s[j] - top);
                total[j & 1] += s[j];
            }
            const vf inv = 1.0f / (total[0] + total[1]);
            vf *w = w_block + (h * L + i) * L;
            for (int64_t d = 0; d < dh; d++) acc[d] = splat(0.0f);
            for (int64_t j = 0; j < L; j++) {
                const vf *vj = x + j * C + 2 * D + h * dh;
                const vf wj = s[j] * inv;
                w[j] = wj;
                for (int64_t d = 0; d < dh; d++) acc[d] += wj * vj[d];
            }
            for (int64_t d = 0; d < dh; d++) o[i * D + h * dh + d] = acc[d];
        }
    }
}

static inline __attribute__((always_inline)) void backward_block(int64_t L, int64_t H, const int64_t dh,
                                                                 float scale, const vf *x, const vf *go,
                                                                 const vf *w_block, vf *gx, vf *dw) {
    const int64_t D = H * dh, C = 3 * D;
    vf qs[dh], acc[dh];
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < L; i++) {
            const vf *w = w_block + (h * L + i) * L;
            const vf *gi = go + i * D + h * dh;
            const vf *q = x + i * C + h * dh;
            /* d weights = g vᵀ; d v += wᵀ g; dot = Σ_j w d weights (the softmax's backward) */
            vf dot[2] = {splat(0.0f), splat(0.0f)};
            for (int64_t j = 0; j < L; j++) {
                const vf *vj = x + j * C + 2 * D + h * dh;
                vf *gvj = gx + j * C + 2 * D + h * dh;
                vf dwj = gi[0] * vj[0];
                for (int64_t d = 1; d < dh; d++) dwj += gi[d] * vj[d];
                dw[j] = dwj;
                dot[j & 1] += w[j] * dwj;
                for (int64_t d = 0; d < dh; d++) gvj[d] += w[j] * gi[d];
            }
            const vf total = dot[0] + dot[1];
            /* d scores = w (d weights - dot); d q = scale d scores k; d k += scale d scoresᵀ q */
            for (int64_t d = 0; d < dh; d++) {
                qs[d] = q[d] * scale;
                acc[d] = splat(0.0f);
            }
            for (int64_t j = 0; j < L; j++) {
                const vf ds = w[j] * (dw[j] - total);
                const vf *kj = x + j * C + D + h * dh;
                vf *gkj = gx + j * C + D + h * dh;
                for (int64_t d = 0; d < dh; d++) {
                    acc[d] += ds * kj[d];
                    gkj[d] += qs[d] * ds;
                }
            }
            for (int64_t d = 0; d < dh; d++) gx[i * C + h * dh + d] = acc[d] * scale;
        }
    }
}

/* Returns 0, or -1 when the work buffers could not be allocated. */
int nip_self_attention_forward(int64_t G, int64_t L, int64_t H, int64_t dh, const void *qkv, int bf16,
                               const float *mask, int64_t mask_batch, float scale, void *out,
                               float *weights) {
    const int64_t D = H * dh, C = 3 * D;
    vf *x = malloc((size_t)(L * C + L * L + L * D + L) * sizeof(vf));
    if (!x) return -1;
    vf *m = x + L * C, *o = m + L * L, *s = o + L * D;
    for (int64_t g0 = 0; g0 < G; g0 += LANES) {
        const int64_t lanes = G - g0 < LANES ? G - g0 : LANES;
        gather(qkv, bf16, g0, lanes, L * C, (float *)x);
        const float *mv[LANES];
        for (int64_t v = 0; v < LANES; v++) mv[v] = v < lanes ? mask + (g0 + v) % mask_batch * L * L : NULL;
        for (int64_t e = 0; e < L * L; e++) {
            float *mf = (float *)(m + e);
            for (int64_t v = 0; v < LANES; v++) mf[v] = mv[v] ? mv[v][e] : 0.0f;
        }
        vf *w_block = (vf *)weights + g0 / LANES * H * L * L;
        if (dh == 4)
            forward_block(L, H, 4, scale, x, m, w_block, o, s);
        else
            forward_block(L, H, dh, scale, x, m, w_block, o, s);
        scatter((const float *)o, bf16, g0, lanes, L * D, out);
    }
    free(x);
    return 0;
}

int nip_self_attention_backward(int64_t G, int64_t L, int64_t H, int64_t dh, const void *qkv, int bf16,
                                const float *weights, float scale, const void *grad_out, void *grad_qkv) {
    const int64_t D = H * dh, C = 3 * D;
    vf *x = malloc((size_t)(2 * L * C + L * D + L) * sizeof(vf));
    if (!x) return -1;
    vf *gx = x + L * C, *go = gx + L * C, *dw = go + L * D;
    for (int64_t g0 = 0; g0 < G; g0 += LANES) {
        const int64_t lanes = G - g0 < LANES ? G - g0 : LANES;
        gather(qkv, bf16, g0, lanes, L * C, (float *)x);
        gather(grad_out, bf16, g0, lanes, L * D, (float *)go);
        memset(gx, 0, (size_t)(L * C) * sizeof(vf));
        const vf *w_block = (const vf *)weights + g0 / LANES * H * L * L;
        if (dh == 4)
            backward_block(L, H, 4, scale, x, go, w_block, gx, dw);
        else
            backward_block(L, H, dh, scale, x, go, w_block, gx, dw);
        scatter((const float *)gx, bf16, g0, lanes, L * C, grad_qkv);
    }
    free(x);
    return 0;
}
