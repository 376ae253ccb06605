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

/* dst[e][v] = row (g0 + v) of src, element e (rows of n values); lanes past the end are 0. */
static void gather(const void *src, int bf16, int64_t g0, int64_t lanes, int64_t n, float *dst) {
    memset(dst, 0, (size_t)(n * LANES) * sizeof(float));
    for (int64_t v = 0; v < lanes; v++) {
        if (bf16) {
            const uint16_t *row = (const uint16_t *)src + (g0 + v) * n;
            for (int64_t e = 0; e < n; e++) dst[e * LANES + v] = bf16_to_float(row[e]);
        } else {
            const float *row = (const float *)src + (g0 + v) * n;
            for (int64_t e = 0; e < n; e++) dst[e * LANES + v] = row[e];
        }
    }
}

/* Row (g0 + v) of dst, element e, = src[e][v], for the block's real lanes. */
static void scatter(const float *src, int bf16, int64_t g0, int64_t lanes, int64_t n, void *dst) {
    for (int64_t v = 0; v < lanes; v++) {
        if (bf16) {
            uint16_t *row = (uint16_t *)dst + (g0 + v) * n;
            for (int64_t e = 0; e < n; e++) row[e] = float_to_bf16(src[e * LANES + v]);
        } else {
            float *row = (float *)dst + (g0 + v) * n;
            for (int64_t e = 0; e < n; e++) row[e] = src[e * LANES + v];
        }
    }
}

int64_t nip_self_attention_lanes(void) { return LANES; }

int64_t nip_self_attention_weights_size(int64_t G, int64_t L, int64_t H) {
    return (G + LANES - 1) / LANES * LANES * H * L * L;
}

/* Returns 0, or -1 when the work buffers could not be allocated. */
int nip_self_attention_forward(int64_t G, int64_t L, int64_t H, int64_t dh, const void *qkv, int bf16,
                               const float *mask, int64_t mask_batch, float scale, void *out,
                               float *weights) {
    const int64_t D = H * dh, C = 3 * D;
    vf *x = malloc((size_t)(L * C + L * L + L * D + L + dh) * sizeof(vf));
    if (!x) return -1;
    vf *m = x + L * C, *o = m + L * L, *s = o + L * D, *qs = s + L;
    for (int64_t g0 = 0; g0 < G; g0 += LANES) {
        const int64_t lanes = G - g0 < LANES ? G - g0 : LANES;
        gather(qkv, bf16, g0, lanes, L * C, (float *)x);
        memset(m, 0, (size_t)(L * L) * sizeof(vf));
        for (int64_t v = 0; v < lanes; v++) {
            const float *mv = mask + (g0 + v) % mask_batch * L * L;
            float *mf = (float *)m;
            for (int64_t e = 0; e < L * L; e++) mf[e * LANES + v] = mv[e];
        }
        vf *w_block = (vf *)weights + g0 / LANES * H * L * L;
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < L; i++) {
                const vf *q = x + i * C + h * dh;
                for (int64_t d = 0; d < dh; d++) qs[d] = q[d] * scale;
                vf top = splat(-INFINITY);
                for (int64_t j = 0; j < L; j++) {
                    const vf *k = x + j * C + D + h * dh;
                    vf acc = qs[0] * k[0];
                    for (int64_t d = 1; d < dh; d++) acc += qs[d] * k[d];
                    acc += m[i * L + j];
                    s[j] = acc;
                    top = lane_select(acc > top, acc, top);
                }
                vf total = splat(0.0f);
                for (int64_t j = 0; j < L; j++) {
                    s[j] = vexp(s[j] - top);
                    total += s[j];
                }
                const vf inv = 1.0f / total;
                vf *w = w_block + (h * L + i) * L;
                for (int64_t j = 0; j < L; j++) w[j] = s[j] * inv;
                vf *oi = o + i * D + h * dh;
                for (int64_t d = 0; d < dh; d++) {  /* accumulate in a register, not through memory */
                    const vf *vd = x + 2 * D + h * dh + d;
                    vf acc = splat(0.0f);
                    for (int64_t j = 0; j < L; j++) acc += w[j] * vd[j * C];
                    oi[d] = acc;
                }
            }
        }
        scatter((const float *)o, bf16, g0, lanes, L * D, out);
    }
    free(x);
    return 0;
}

int nip_self_attention_backward(int64_t G, int64_t L, int64_t H, int64_t dh, const void *qkv, int bf16,
                                const float *weights, float scale, const void *grad_out, void *grad_qkv) {
    const int64_t D = H * dh, C = 3 * D;
    vf *x = malloc((size_t)(2 * L * C + L * D + L + dh) * sizeof(vf));
    if (!x) return -1;
    vf *gx = x + L * C, *go = gx + L * C, *dw = go + L * D, *qs = dw + L;
    for (int64_t g0 = 0; g0 < G; g0 += LANES) {
        const int64_t lanes = G - g0 < LANES ? G - g0 : LANES;
        gather(qkv, bf16, g0, lanes, L * C, (float *)x);
        gather(grad_out, bf16, g0, lanes, L * D, (float *)go);
        memset(gx, 0, (size_t)(L * C) * sizeof(vf));
        const vf *w_block = (const vf *)weights + g0 / LANES * H * L * L;
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < L; i++) {
                const vf *w = w_block + (h * L + i) * L;
                const vf *gi = go + i * D + h * dh;
                const vf *q = x + i * C + h * dh;
                /* d weights = g vᵀ; d v += wᵀ g; dot = Σ_j w d weights (the softmax's backward) */
                vf dot = splat(0.0f);
                for (int64_t j = 0; j < L; j++) {
                    const vf *vj = x + j * C + 2 * D + h * dh;
                    vf *gvj = gx + j * C + 2 * D + h * dh;
                    vf acc = gi[0] * vj[0];
                    for (int64_t d = 1; d < dh; d++) acc += gi[d] * vj[d];
                    dw[j] = acc;
                    dot += w[j] * acc;
                    for (int64_t d = 0; d < dh; d++) gvj[d] += w[j] * gi[d];
                }
                /* d scores = w (d weights - dot); d q = scale d scores k; d k += scale d scoresᵀ q */
                for (int64_t d = 0; d < dh; d++) qs[d] = q[d] * scale;
                for (int64_t j = 0; j < L; j++) {
                    const vf ds = w[j] * (dw[j] - dot);
                    dw[j] = ds;
                    vf *gkj = gx + j * C + D + h * dh;
                    for (int64_t d = 0; d < dh; d++) gkj[d] += qs[d] * ds;
                }
                vf *gqi = gx + i * C + h * dh;
                for (int64_t d = 0; d < dh; d++) {
                    const vf *kd = x + D + h * dh + d;
                    vf acc = splat(0.0f);
                    for (int64_t j = 0; j < L; j++) acc += dw[j] * kd[j * C];
                    gqi[d] = acc * scale;
                }
            }
        }
        scatter((const float *)gx, bf16, g0, lanes, L * C, grad_qkv);
    }
    free(x);
    return 0;
}
