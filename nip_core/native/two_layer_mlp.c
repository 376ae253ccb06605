/* K stacked two-layer MLPs, y = act(x W1 + b1) W2 + b2, forward and backward, on the CPU.
 *
 * Built and loaded by nip_core/native/build.py (docs/performance.md, "The MLP kernel"). The GI
 * bodies' GIN layers and transformer feed-forward blocks are such MLPs on ~11,000 rows of 16
 * numbers with a hidden width of 64: as batched products plus an elementwise activation, the
 * 64-wide hidden tensor is written and read several times forwards and backwards. Here the
 * vector lanes run across LANES rows, and a block of rows goes through both layers (and, in
 * the backward pass, through both layers' gradients) with its hidden values held in a small
 * work buffer. The forward pass can keep the activations in the lane layout (`hidden`,
 * nip_mlp2_hidden_size floats, or NULL): the backward pass then reads them where they lie
 * instead of computing the first layer and the activation again (`hidden` NULL: it recomputes).
 *
 * x, y and their gradients are float32 or bfloat16 (bf16 == 1) in memory, (K, M, d) row-major;
 * weights and their gradients are float32: W1 (K, din, dh), b1 (K, dh), W2 (K, dh, dout),
 * b2 (K, dout), the biases and all gradients contiguous, the weights of any strides (`strides`:
 * W1's three, then W2's; a transposed nn.Linear weight is read where it lies). Arithmetic is
 * float32, each lane in a fixed order. act: 0 relu, 1 sigmoid, 2 tanh (lanes.h's vtanh).
 * Weight gradients are products over the rows: each weight's sum runs over a group of rows in
 * order, and the groups' sums are added in order; bias gradients are summed per lane over the
 * blocks, then over the lanes in order.
 *
 * rows (n_rows ascending row indices, or NULL for all M rows) are the rows computed: the others'
 * outputs are set to 0 and their gradients, taken as zero, are not read; their input gradients
 * are set to 0 (so the caller allocates y and gx without zeroing them). A GI body's GNN has
 * no use for the padding nodes' rows (the next layer's aggregation and the GNN's output mask
 * them), ~18 % of the rows in the paper's workload.
 */
#include "lanes.h"

/* Register blocking (lanes.h's `project`): 8 outputs accumulate in registers over the whole inner
 * dimension, and NB blocks of LANES rows go through the products together. The Python side uses
 * the kernel only where din, dh and dout are multiples of CHUNK. */
#define CHUNK 8

/* For each of NB blocks b: out[b][o] = Σ_i in[b][i] w[i * stride + o] + bias[o] (block b's values
 * start at in + b * n_in and out + b * n_out). */
static inline void dense(const vf *in, int64_t n_in, const float *w, int64_t stride, const float *bias,
                         int64_t n_out, vf *out) {
    project(in, NB, n_in, w, stride, 1, bias, n_out, out);
}

/* For each of NB blocks: out[o] = Σ_i in[i] w[o * stride + i], the product with the transposed
 * weights (blocks laid out as in dense). */
static inline void dense_t(const vf *in, int64_t n_in, const float *w, int64_t stride, int64_t n_out, vf *out) {
    project(in, NB, n_in, w, 1, stride, NULL, n_out, out);
}

static inline void activate(const vf *z, int64_t n, int act, vf *h) {
    if (act == 1)
        for (int64_t c = 0; c < n; c++) h[c] = vsigmoid(z[c]);
    else if (act == 2)
        for (int64_t c = 0; c < n; c++) h[c] = vtanh(z[c]);
    else
        for (int64_t c = 0; c < n; c++) h[c] = lane_select(z[c] > 0.0f, z[c], splat(0.0f));
}

/* Rows of block b of the NB blocks from row r0 that exist (0 for a block past the end). */
static inline int64_t block_lanes(int64_t M, int64_t r0, int64_t b) {
    const int64_t left = M - (r0 + b * LANES);
    return left <= 0 ? 0 : left < LANES ? left : LANES;
}

/* Body k's (n_a, n_b) weights, strides s[0], s[1], s[2]: in place where row-major, else copied into
 * dst. */
static inline const float *weights_of(const float *w, int64_t k, int64_t n_a, int64_t n_b, const int64_t *s,
                                      float *dst) {
    const float *wk = w + k * s[0];
    if (s[1] == n_b && s[2] == 1) return wk;
    for (int64_t a = 0; a < n_a; a++)
        for (int64_t b = 0; b < n_b; b++) dst[a * n_b + b] = wk[a * s[1] + b * s[2]];
    return dst;
}

/* Row position p of the computed rows: rows[p], or p itself when every row is computed. */
static inline int64_t row_index(const int64_t *rows, int64_t p) { return rows ? rows[p] : p; }

/* gather (lanes.h) of the block of `lanes` computed rows from position p of an (M, n) tensor; with
 * a row list, float32 rows are read in place, bfloat16 ones first copied together into tmp (LANES
 * rows of n values). */
static inline __attribute__((always_inline)) void gather_block(const void *src, int bf16, const int64_t *rows,
                                                               int64_t p, int64_t lanes, int64_t n, void *tmp,
                                                               float *dst) {
    if (!rows) {
        gather(src, bf16, p, lanes, n, dst);
    } else if (!bf16) {
        const float *row[LANES];
        for (int64_t v = 0; v < lanes; v++) row[v] = (const float *)src + rows[p + v] * n;
        gather_rows(row, lanes, n, dst);
    } else {
        for (int64_t v = 0; v < lanes; v++)
            memcpy((uint16_t *)tmp + v * n, (const uint16_t *)src + rows[p + v] * n, (size_t)n * 2);
        gather(tmp, bf16, 0, lanes, n, dst);
    }
}

/* scatter (lanes.h) of a block to the computed rows from position p (bfloat16 ones through tmp). */
static inline __attribute__((always_inline)) void scatter_block(const float *src, int bf16, const int64_t *rows,
                                                                int64_t p, int64_t lanes, int64_t n, void *tmp,
                                                                void *dst) {
    if (!rows) {
        scatter(src, bf16, p, lanes, n, dst);
    } else if (!bf16) {
        int64_t e0 = 0;
#if defined(LANES_TRANSPOSE)
        if (lanes == LANES)
            for (; e0 + LANES <= n; e0 += LANES) {  /* whole tiles of LANES elements */
                float *tile[LANES];
                for (int64_t v = 0; v < LANES; v++) tile[v] = (float *)dst + rows[p + v] * n + e0;
                scatter_tile(src + e0 * LANES, tile);
            }
#endif
        for (int64_t v = 0; v < lanes; v++) {
            float *row = (float *)dst + rows[p + v] * n;
            for (int64_t e = e0; e < n; e++) row[e] = src[e * LANES + v];
        }
    } else {
        scatter(src, bf16, 0, lanes, n, tmp);
        for (int64_t v = 0; v < lanes; v++)
            memcpy((uint16_t *)dst + rows[p + v] * n, (const uint16_t *)tmp + v * n, (size_t)n * 2);
    }
}

/* Blocks of LANES rows per body in the kept activations: the computed rows rounded up to NB blocks. */
static inline int64_t hidden_blocks(int64_t P) { return (P + NB * LANES - 1) / (NB * LANES) * NB; }

/* Floats of the kept activations of K bodies of P computed rows and dh hidden units: body k's
 * block s holds its dh activations as vectors at (k * hidden_blocks(P) + s) * dh * LANES. */
int64_t nip_mlp2_hidden_size(int64_t K, int64_t P, int64_t dh) { return K * hidden_blocks(P) * dh * LANES; }

/* Rows of an (M, n) tensor that are not in the ascending list rows set to 0 (elem bytes a value). */
static void zero_other_rows(char *dst, size_t elem, const int64_t *rows, int64_t n_rows, int64_t M, int64_t n) {
    int64_t next = 0;  /* the first row not yet passed */
    for (int64_t p = 0; p <= n_rows; p++) {
        const int64_t until = p < n_rows ? rows[p] : M;
        if (until > next) memset(dst + (size_t)(next * n) * elem, 0, (size_t)((until - next) * n) * elem);
        next = until + 1;
    }
}

int nip_mlp2_forward(int64_t K, int64_t M, int64_t din, int64_t dh, int64_t dout, const void *x, int bf16,
                     const float *w1, const float *b1, int act, const float *w2, const float *b2, void *y,
                     const int64_t *rows, int64_t n_rows, const int64_t *strides, float *hidden) {
    const int64_t wide = din > dout ? din : dout;
    vf *buf = malloc((size_t)(NB * (din + 2 * dh + dout) + wide) * sizeof(vf) +
                     (size_t)(din * dh + dh * dout) * sizeof(float));
    if (!buf) return -1;
    vf *xv = buf, *z = xv + NB * din, *h = z + NB * dh, *out = h + NB * dh, *tmp = out + NB * dout;
    float *w1_copy = (float *)(tmp + wide), *w2_copy = w1_copy + din * dh;
    const size_t elem = bf16 ? 2 : 4;
    const int64_t P = rows ? n_rows : M;  /* rows computed */
    for (int64_t k = 0; k < K; k++) {
        const char *xk = (const char *)x + (size_t)(k * M * din) * elem;
        char *yk = (char *)y + (size_t)(k * M * dout) * elem;
        if (rows) zero_other_rows(yk, elem, rows, n_rows, M, dout);
        const float *w1k = weights_of(w1, k, din, dh, strides, w1_copy), *b1k = b1 + k * dh;
        const float *w2k = weights_of(w2, k, dh, dout, strides + 3, w2_copy), *b2k = b2 + k * dout;
        for (int64_t r0 = 0; r0 < P; r0 += NB * LANES) {
            for (int64_t b = 0; b < NB; b++)  /* a block past the end is zeros, computed and dropped */
                gather_block(xk, bf16, rows, r0 + b * LANES, block_lanes(P, r0, b), din, tmp, (float *)(xv + b * din));
            vf *hk = hidden ? (vf *)hidden + (k * hidden_blocks(P) + r0 / LANES) * dh : h;  /* kept there */
            dense(xv, din, w1k, dh, b1k, dh, z);
            activate(z, NB * dh, act, hk);
            dense(hk, dh, w2k, dout, b2k, dout, out);
            for (int64_t b = 0; b < NB; b++)
                scatter_block((const float *)(out + b * dout), bf16, rows, r0 + b * LANES, block_lanes(P, r0, b), dout,
                              tmp, yk);
        }
    }
    free(buf);
    return 0;
}

/* Blocks whose inputs and gradients are kept for one round of weight-gradient accumulation. */
#define GROUP 8
#if GROUP % NB
#error "GROUP must be a multiple of NB"
#endif

/* Accumulators of row_outer that stay in registers: ROW_BLOCK rows of the result, one vector each
 * (with 16 vector registers, 8 of them and the two operands). */
#if LANES == 16
#define ROW_BLOCK 16
#else
#define ROW_BLOCK CHUNK
#endif

/* row_outer for the result rows c0 .. c0 + width and vector v (width a constant where inlined). */
static inline void row_outer_part(const float *t, int64_t n_c, const float *const *rows, int64_t n, int64_t c0,
                                  int64_t v, int64_t width, vf *acc, int64_t n_v) {
    vf sum[ROW_BLOCK];
    for (int64_t j = 0; j < width; j++) sum[j] = splat(0.0f);
    for (int64_t r = 0; r < n; r++) {
        const vf row = load_vf(rows[r] + v * LANES);
        const float *tr = t + ((r / LANES) * n_c + c0) * LANES + r % LANES;
        for (int64_t j = 0; j < width; j++) sum[j] += tr[j * LANES] * row;  /* a broadcast operand */
    }
    for (int64_t j = 0; j < width; j++) acc[(c0 + j) * n_v + v] += sum[j];
}

/* acc[c][v] += Σ_r lane_t[c][r] rows[r][v] over the group's n rows r, for c < n_c (a multiple of
 * CHUNK) and v < n_v vectors: the weight-gradient sums as a product over rows. The lane-layout
 * operand (lane_t: the group's blocks of n_c vectors, lane l of block s being row s LANES + l) is
 * broadcast a value at a time, the row-major one (row r of n_v vectors at rows[r]) loaded a vector
 * at a time. Each (c, v) sums the group's rows in order in a register and then adds that to acc,
 * so the accumulators stay in registers over a group and acc (n_c n_v vectors) in the first-level
 * cache. */
static inline void row_outer(const vf *lane_t, int64_t n_c, const float *const *rows, int64_t n_v, int64_t n,
                             vf *acc) {
    for (int64_t v = 0; v < n_v; v++) {
        int64_t c0 = 0;
        for (; c0 + ROW_BLOCK <= n_c; c0 += ROW_BLOCK)
            row_outer_part((const float *)lane_t, n_c, rows, n, c0, v, ROW_BLOCK, acc, n_v);
        for (; c0 < n_c; c0 += CHUNK) row_outer_part((const float *)lane_t, n_c, rows, n, c0, v, CHUNK, acc, n_v);
    }
}

/* row_outer's rows: the computed rows at positions g0 .. g0 + n of a (M, d) float32 or bfloat16
 * tensor as float32 rows of n_v vectors (the padding zero), in place where they are float32 and d
 * is n_v vectors, else copied (converted) into buf; their addresses in ptr. */
static inline const float *const *group_rows(const void *src, int bf16, const int64_t *rows, int64_t g0, int64_t n,
                                             int64_t d, int64_t n_v, float *buf, const float **ptr) {
    for (int64_t r = 0; r < n; r++) {
        const int64_t at = row_index(rows, g0 + r) * d;
        if (!bf16 && d == n_v * LANES) {
            ptr[r] = (const float *)src + at;
            continue;
        }
        float *dst = buf + r * n_v * LANES;
        if (bf16) bf16_to_float_n((const uint16_t *)src + at, d, dst);
        else memcpy(dst, (const float *)src + at, (size_t)d * sizeof(float));
        memset(dst + d, 0, (size_t)(n_v * LANES - d) * sizeof(float));
        ptr[r] = dst;
    }
    return ptr;
}

int nip_mlp2_backward(int64_t K, int64_t M, int64_t din, int64_t dh, int64_t dout, const void *x, int bf16,
                      const float *w1, const float *b1, int act, const float *w2, const void *gy, void *gx,
                      float *gw1, float *gb1, float *gw2, float *gb2, const int64_t *rows, int64_t n_rows,
                      const int64_t *strides, const float *hidden) {
    const int64_t P = rows ? n_rows : M;  /* rows computed */
    const int64_t wide = din > dout ? din : dout;
    const int64_t vin = (din + LANES - 1) / LANES, vout = (dout + LANES - 1) / LANES;
    /* weight-gradient sums: d W1 transposed (dh, din) and d W2 (dh, dout) in vectors along din and
     * dout (padded to whole vectors); the bias gradients per lane */
    const int64_t n_acc = dh * vin + dh * vout + dh + dout;
    const int64_t per_block = din + 2 * dh + dout;  /* x, h, d z, gy of one block, kept for the group */
    const int64_t row_buffers = GROUP * (vin + vout) * LANES;  /* the group's x and gy rows, where converted */
    vf *buf = malloc((size_t)(GROUP * per_block + NB * (dh + din) + n_acc + row_buffers + wide) * sizeof(vf) +
                     (size_t)(din * dh + dh * dout) * sizeof(float));
    if (!buf) return -1;
    vf *xs = buf, *hs = xs + GROUP * din, *dzs = hs + GROUP * dh, *gys = dzs + GROUP * dh;
    vf *z = gys + GROUP * dout, *gxv = z + NB * dh;
    vf *aw1 = gxv + NB * din, *aw2 = aw1 + dh * vin, *ab1 = aw2 + dh * vout, *ab2 = ab1 + dh;
    float *x_rows = (float *)(ab2 + dout), *gy_rows = x_rows + GROUP * LANES * vin * LANES;
    vf *tmp = (vf *)(gy_rows + GROUP * LANES * vout * LANES);
    float *w1_copy = (float *)(tmp + wide), *w2_copy = w1_copy + din * dh;
    const float *row_ptr[GROUP * LANES];
    const size_t elem = bf16 ? 2 : 4;
    for (int64_t k = 0; k < K; k++) {
        const char *xk = (const char *)x + (size_t)(k * M * din) * elem;
        const char *gyk = (const char *)gy + (size_t)(k * M * dout) * elem;
        char *gxk = (char *)gx + (size_t)(k * M * din) * elem;
        if (rows) zero_other_rows(gxk, elem, rows, n_rows, M, din);
        const float *w1k = weights_of(w1, k, din, dh, strides, w1_copy), *b1k = b1 + k * dh;
        const float *w2k = weights_of(w2, k, dh, dout, strides + 3, w2_copy);
        memset(aw1, 0, (size_t)n_acc * sizeof(vf));
        for (int64_t g0 = 0; g0 < P; g0 += GROUP * LANES) {
            const int64_t n = P - g0 < GROUP * LANES ? P - g0 : GROUP * LANES;  /* rows of the group */
            /* the group's activations: kept by the forward pass, or computed again into hs */
            vf *hg = hidden ? (vf *)hidden + (k * hidden_blocks(P) + g0 / LANES) * dh : hs;
            for (int64_t r0 = g0; r0 < g0 + n; r0 += NB * LANES) {
                const int64_t slot = (r0 - g0) / LANES;  /* NB slots from here (GROUP is a multiple of NB) */
                vf *xv = xs + slot * din, *h = hg + slot * dh, *dz = dzs + slot * dh, *gyv = gys + slot * dout;
                for (int64_t b = 0; b < NB; b++) {  /* lanes past the end: x and gradient 0 */
                    const int64_t lanes = block_lanes(P, r0, b);
                    gather_block(xk, bf16, rows, r0 + b * LANES, lanes, din, tmp, (float *)(xv + b * din));
                    gather_block(gyk, bf16, rows, r0 + b * LANES, lanes, dout, tmp, (float *)(gyv + b * dout));
                }
                if (!hidden) {  /* the hidden layer again */
                    dense(xv, din, w1k, dh, b1k, dh, z);
                    activate(z, NB * dh, act, h);
                }
                dense_t(gyv, dout, w2k, dout, dh, dz);  /* d h = gy W2ᵀ */
                if (act == 1)
                    for (int64_t c = 0; c < NB * dh; c++) dz[c] = dz[c] * h[c] * (1.0f - h[c]);
                else if (act == 2)
                    for (int64_t c = 0; c < NB * dh; c++) dz[c] = dz[c] * (1.0f - h[c] * h[c]);
                else
                    for (int64_t c = 0; c < NB * dh; c++) dz[c] = lane_select(h[c] > 0.0f, dz[c], splat(0.0f));
                for (int64_t b = 0; b < NB && block_lanes(P, r0, b) > 0; b++) {
                    for (int64_t c = 0; c < dh; c++) ab1[c] += dz[b * dh + c];
                    for (int64_t e = 0; e < dout; e++) ab2[e] += gyv[b * dout + e];
                }
                dense_t(dz, dh, w1k, dh, din, gxv);  /* d x = d z W1ᵀ */
                for (int64_t b = 0; b < NB; b++)
                    scatter_block((const float *)(gxv + b * din), bf16, rows, r0 + b * LANES, block_lanes(P, r0, b),
                                  din, tmp, gxk);
            }
            row_outer(dzs, dh, group_rows(xk, bf16, rows, g0, n, din, vin, x_rows, row_ptr), vin, n,
                      aw1);  /* d W1ᵀ += d zᵀ x */
            row_outer(hg, dh, group_rows(gyk, bf16, rows, g0, n, dout, vout, gy_rows, row_ptr), vout, n,
                      aw2);  /* d W2 += hᵀ gy */
        }
        float *gw1k = gw1 + k * din * dh;
        for (int64_t c = 0; c < dh; c++)
            for (int64_t i = 0; i < din; i++) gw1k[i * dh + c] = ((const float *)(aw1 + c * vin))[i];
        for (int64_t c = 0; c < dh; c++)
            memcpy(gw2 + (k * dh + c) * dout, aw2 + c * vout, (size_t)dout * sizeof(float));
        lane_sums(ab1, dh, gb1 + k * dh);
        lane_sums(ab2, dout, gb2 + k * dout);
    }
    free(buf);
    return 0;
}
