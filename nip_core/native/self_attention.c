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
 * stack K agents' sequences as g = k * B + b over one (B, L, L) mask). Only the first Lq tokens
 * (Lq <= L) are queries: out and grad_out are (G, Lq, D), and the other tokens get key and value
 * gradients only (a body whose graph-level tokens alone are wanted asks for Lq = 2). `weights`
 * holds the softmax for the backward pass in the kernel's own blocked layout:
 * nip_self_attention_weights_size(G, L, Lq, H) floats.
 */
#include "lanes.h"

int64_t nip_self_attention_lanes(void) { return LANES; }

int64_t nip_self_attention_weights_size(int64_t G, int64_t L, int64_t Lq, int64_t H) {
    return (G + LANES - 1) / LANES * LANES * H * Lq * L;
}

/* One block's forward pass. Inlined with dh a constant where dh == 4 (the GI bodies' heads), so
 * that the per-dimension accumulators live in registers as independent chains. Sums over j run
 * as two interleaved partial sums (even and odd j), in the same order for every lane. */
static inline __attribute__((always_inline)) void forward_block(int64_t L, int64_t Lq, int64_t H,
                                                                const int64_t dh, float scale, const vf *x, const vf *m,
                                                                vf *w_block, vf *o, vf *s) {
    const int64_t D = H * dh, C = 3 * D;
    vf qs[dh], acc[dh];
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < Lq; i++) {
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
            vf *w = w_block + (h * Lq + i) * L;
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

static inline __attribute__((always_inline)) void backward_block(int64_t L, int64_t Lq, int64_t H,
                                                                 const int64_t dh, float scale, const vf *x,
                                                                 const vf *go, const vf *w_block, vf *gx, vf *dw) {
    const int64_t D = H * dh, C = 3 * D;
    vf qs[dh], acc[dh];
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < Lq; i++) {
            const vf *w = w_block + (h * Lq + i) * L;
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
int nip_self_attention_forward(int64_t G, int64_t L, int64_t Lq, int64_t H, int64_t dh, const void *qkv,
                               int bf16, const float *mask, int64_t mask_batch, float scale, void *out,
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
        for (int64_t e = 0; e < Lq * L; e++) {
            float *mf = (float *)(m + e);
            for (int64_t v = 0; v < LANES; v++) mf[v] = mv[v] ? mv[v][e] : 0.0f;
        }
        vf *w_block = (vf *)weights + g0 / LANES * H * Lq * L;
        if (dh == 4)
            forward_block(L, Lq, H, 4, scale, x, m, w_block, o, s);
        else
            forward_block(L, Lq, H, dh, scale, x, m, w_block, o, s);
        scatter((const float *)o, bf16, g0, lanes, Lq * D, out);
    }
    free(x);
    return 0;
}

int nip_self_attention_backward(int64_t G, int64_t L, int64_t Lq, int64_t H, int64_t dh, const void *qkv,
                                int bf16, const float *weights, float scale, const void *grad_out, void *grad_qkv) {
    const int64_t D = H * dh, C = 3 * D;
    vf *x = malloc((size_t)(2 * L * C + L * D + L) * sizeof(vf));
    if (!x) return -1;
    vf *gx = x + L * C, *go = gx + L * C, *dw = go + L * D;
    for (int64_t g0 = 0; g0 < G; g0 += LANES) {
        const int64_t lanes = G - g0 < LANES ? G - g0 : LANES;
        gather(qkv, bf16, g0, lanes, L * C, (float *)x);
        gather(grad_out, bf16, g0, lanes, Lq * D, (float *)go);
        memset(gx, 0, (size_t)(L * C) * sizeof(vf));
        const vf *w_block = (const vf *)weights + g0 / LANES * H * Lq * L;
        if (dh == 4)
            backward_block(L, Lq, H, 4, scale, x, go, w_block, gx, dw);
        else
            backward_block(L, Lq, H, dh, scale, x, go, w_block, gx, dw);
        scatter((const float *)gx, bf16, g0, lanes, L * C, grad_qkv);
    }
    free(x);
    return 0;
}
