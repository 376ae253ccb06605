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

/* The block's masks in the lane layout: the first Lq rows of sequence g0 + v's (L, L) mask, mask
 * (g0 + v) % mask_batch, in lane v (0 past the block's lanes). */
static inline void gather_masks(const float *mask, int64_t mask_batch, int64_t g0, int64_t lanes, int64_t L,
                                int64_t Lq, vf *m) {
    const float *row[LANES];
    for (int64_t v = 0; v < lanes; v++) row[v] = mask + (g0 + v) % mask_batch * L * L;
    gather_rows(row, lanes, Lq * L, (float *)m);
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
        gather_masks(mask, mask_batch, g0, lanes, L, Lq, m);
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

/* ---- The attention with its in-projection (nip_self_attention_projected_*) ----------------------
 *
 * The same attention, from the tokens x (G, L, d_in) instead of their packed projection: per body k,
 * qkv = x W_kᵀ + b_k with W (K, C, d_in) and b (K, C), C = 3 H dh, computed a block of sequences at a
 * time in the lane layout and never written out. Sequence g belongs to body g / B (G = K B) and uses
 * mask g % mask_batch; a block of sequences never straddles two bodies. The backward pass computes
 * the projection again (the same arithmetic), runs the attention's backward, and from the packed
 * gradient gives d x = d qkv W_k and the bodies' d W, d b: sums over the rows of a block per lane, the
 * blocks in order, then over the lanes in order. float32 only; C and d_in multiples of 8. */

/* aw[c * n_in + i] += Σ_j g[j * C + c] in[j * n_in + i] and ab[c] += Σ_j g[j * C + c], per lane, the
 * sums over j in order. */
static void project_grads(const vf *g, const vf *in, int64_t L, int64_t C, int64_t n_in, vf *aw, vf *ab) {
    for (int64_t c = 0; c < C; c++) {
        for (int64_t i0 = 0; i0 < n_in; i0 += 8) {
            vf acc[8];
            for (int64_t u = 0; u < 8; u++) acc[u] = splat(0.0f);
            for (int64_t j = 0; j < L; j++) {
                const vf gj = g[j * C + c];
                for (int64_t u = 0; u < 8; u++) acc[u] += gj * in[j * n_in + i0 + u];
            }
            for (int64_t u = 0; u < 8; u++) aw[c * n_in + i0 + u] += acc[u];
        }
        vf total = splat(0.0f);
        for (int64_t j = 0; j < L; j++) total += g[j * C + c];
        ab[c] += total;
    }
}

static inline int64_t blocks_per_body(int64_t B) { return (B + LANES - 1) / LANES; }

int64_t nip_self_attention_projected_weights_size(int64_t K, int64_t B, int64_t L, int64_t Lq, int64_t H) {
    return K * blocks_per_body(B) * LANES * H * Lq * L;
}

/* Returns 0, or -1 when the work buffers could not be allocated. */
int nip_self_attention_projected_forward(int64_t K, int64_t B, int64_t L, int64_t Lq, int64_t H, int64_t dh,
                                         int64_t d_in, const float *x, const float *w, const float *b,
                                         const float *mask, int64_t mask_batch, float scale, float *out,
                                         float *weights) {
    const int64_t D = H * dh, C = 3 * D;
    vf *xv = malloc((size_t)(L * d_in + L * C + L * L + L * D + L) * sizeof(vf));
    if (!xv) return -1;
    vf *xq = xv + L * d_in, *m = xq + L * C, *o = m + L * L, *s = o + L * D;
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < blocks_per_body(B); n++) {
            const int64_t g0 = k * B + n * LANES, lanes = B - n * LANES < LANES ? B - n * LANES : LANES;
            gather(x, 0, g0, lanes, L * d_in, (float *)xv);
            project(xv, L, d_in, w + k * C * d_in, 1, d_in, b + k * C, C, xq);  /* W_kᵀ: w[c d_in + i] */
            gather_masks(mask, mask_batch, g0, lanes, L, Lq, m);
            vf *w_block = (vf *)weights + (k * blocks_per_body(B) + n) * H * Lq * L;
            if (dh == 4)
                forward_block(L, Lq, H, 4, scale, xq, m, w_block, o, s);
            else
                forward_block(L, Lq, H, dh, scale, xq, m, w_block, o, s);
            scatter((const float *)o, 0, g0, lanes, Lq * D, out);
        }
    free(xv);
    return 0;
}

int nip_self_attention_projected_backward(int64_t K, int64_t B, int64_t L, int64_t Lq, int64_t H, int64_t dh,
                                          int64_t d_in, const float *x, const float *w, const float *b,
                                          const float *weights, float scale, const float *grad_out,
                                          float *grad_x, float *grad_w, float *grad_b) {
    const int64_t D = H * dh, C = 3 * D;
    vf *xv = malloc((size_t)(2 * L * d_in + 2 * L * C + L * D + L + C * d_in + C) * sizeof(vf));
    if (!xv) return -1;
    vf *gxv = xv + L * d_in, *xq = gxv + L * d_in, *gq = xq + L * C, *go = gq + L * C, *dw = go + L * D;
    vf *aw = dw + L, *ab = aw + C * d_in;
    for (int64_t k = 0; k < K; k++) {
        const float *wk = w + k * C * d_in;
        memset(aw, 0, (size_t)(C * d_in + C) * sizeof(vf));
        for (int64_t n = 0; n < blocks_per_body(B); n++) {
            const int64_t g0 = k * B + n * LANES, lanes = B - n * LANES < LANES ? B - n * LANES : LANES;
            gather(x, 0, g0, lanes, L * d_in, (float *)xv);  /* lanes past the end: 0, so no gradient */
            project(xv, L, d_in, wk, 1, d_in, b + k * C, C, xq);  /* as the forward pass */
            gather(grad_out, 0, g0, lanes, Lq * D, (float *)go);
            memset(gq, 0, (size_t)(L * C) * sizeof(vf));
            const vf *w_block = (const vf *)weights + (k * blocks_per_body(B) + n) * H * Lq * L;
            if (dh == 4)
                backward_block(L, Lq, H, 4, scale, xq, go, w_block, gq, dw);
            else
                backward_block(L, Lq, H, dh, scale, xq, go, w_block, gq, dw);
            project(gq, L, C, wk, d_in, 1, NULL, d_in, gxv);  /* d x = d qkv W_k */
            scatter((const float *)gxv, 0, g0, lanes, L * d_in, grad_x);
            project_grads(gq, xv, L, C, d_in, aw, ab);
        }
        lane_sums(aw, C * d_in, grad_w + k * C * d_in);
        lane_sums(ab, C, grad_b + k * C);
    }
    free(xv);
    return 0;
}
