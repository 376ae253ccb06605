/* The GIN layers' aggregation y = (A + I) act(m ⊙ z), graph by graph, forward and backward.
 *
 * Built and loaded by nip_core/native/build.py (docs/performance.md, "The aggregation kernel").
 * A GI body's GNN runs, before each GIN layer's MLP, the activation of the previous layer's
 * masked output and the sum over each node's neighbours and itself. As PyTorch operations that
 * is a broadcast multiply, an activation, and a batched product of thousands of (N × N)·(N × d)
 * matrices with N ≤ 11, which costs far more per matrix than its arithmetic; backwards the same
 * again. Here one pass reads z, writes y, and the backward pass recomputes the activation.
 *
 * Per graph g (G graphs of N nodes, d features each, rows in memory (G, N, d)):
 *     y[g, i] = Σ_j adj[g, i, j] act(m[g, j] z[g, j])
 * with act 1: tanh (as 1 - 2 sigmoid(-2x), lanes.h's vsigmoid), act 0: relu. The backward pass returns
 *     gz[g, j] = m[g, j] act'(m[g, j] z[g, j]) Σ_i adj[g, i, j] gy[g, i]
 * (no gradient for the adjacency or the mask: both are data). The vector lanes run along the
 * feature dimension, LANES features at a time; sums over nodes run over j (or i) in order.
 *
 * The adjacency (data_batch, N, N) and the mask (data_batch, N) are those of graph g % data_batch
 * (the stacked bodies run K agents' copies of the same graphs, g = k * data_batch + b). z, y, gy,
 * gz, the adjacency and the mask are all float32, or all bfloat16 (bf16 == 1), in memory;
 * arithmetic is float32.
 */
#include "lanes.h"

/* n <= LANES values from element `at` of src; lanes past n are 0. */
static inline vf load_values(const void *src, int bf16, int64_t at, int64_t n) {
    if (!bf16 && n == LANES) return *(const vf *)((const float *)src + at);  /* vf is 4-byte aligned */
    vf out = splat(0.0f);
    if (n == LANES) {
        const uint16_t *p = (const uint16_t *)src + at;
        vi bits;
        for (int64_t v = 0; v < LANES; v++) bits[v] = (int32_t)((uint32_t)p[v] << 16);
        out = (vf)bits;
    } else {
        for (int64_t v = 0; v < n; v++)
            out[v] = bf16 ? bf16_to_float(((const uint16_t *)src)[at + v]) : ((const float *)src)[at + v];
    }
    return out;
}

static inline void store_values(vf value, int bf16, int64_t at, int64_t n, void *dst) {
    if (!bf16 && n == LANES) {
        *(vf *)((float *)dst + at) = value;
        return;
    }
    for (int64_t v = 0; v < n; v++) {
        if (bf16)
            ((uint16_t *)dst)[at + v] = float_to_bf16(value[v]);
        else
            ((float *)dst)[at + v] = value[v];
    }
}

static inline float load_scalar(const void *src, int bf16, int64_t at) {
    return bf16 ? bf16_to_float(((const uint16_t *)src)[at]) : ((const float *)src)[at];
}

static inline vf activate(vf x, int act) {
    if (act == 1) return vtanh(x);
    return lane_select(x > 0.0f, x, splat(0.0f));
}

/* The activations t[j * C + c] (C = ceil(d / LANES) chunks per row) of graph g's nodes, under the
 * mask of graph ga, and, when slope is not NULL, m_j act'(m_j z_j) in slope. */
static void activations(int64_t g, int64_t ga, int64_t N, int64_t d, int64_t C, const void *z, const void *m,
                        int bf16, int act, vf *t, vf *slope) {
    for (int64_t j = 0; j < N; j++) {
        const float mj = load_scalar(m, bf16, ga * N + j);
        for (int64_t c = 0; c < C; c++) {
            const int64_t n = d - c * LANES < LANES ? d - c * LANES : LANES;
            const vf x = mj * load_values(z, bf16, (g * N + j) * d + c * LANES, n);
            const vf a = activate(x, act);
            t[j * C + c] = a;
            if (slope) slope[j * C + c] = act == 1 ? mj * (1.0f - a * a) : lane_select(x > 0.0f, splat(mj), splat(0.0f));
        }
    }
}

/* Output rows computed together, each in its own register: ROWS independent chains of additions
 * (one chain per row would wait on each addition's latency). */
#define ROWS 8

/* The weights of node sums over graph g's adjacency: w[r * rs + s * cs] = a[r, s], or a[s, r] when
 * `transpose` is set. The float32 matrix is read in place where it can be; otherwise (bf16, or
 * N < ROWS) it is copied into `copy` as float32, rows past N zeros. */
typedef struct {
    const float *w;
    int64_t rs, cs;
} weights;

static inline weights adjacency(const void *adj, int bf16, int64_t g, int64_t N, int transpose, float *copy) {
    const int64_t at = g * N * N;
    if (!bf16 && N >= ROWS)
        return (weights){(const float *)adj + at, transpose ? 1 : N, transpose ? N : 1};
    for (int64_t r = 0; r < N; r++)
        for (int64_t s = 0; s < N; s++)
            copy[r * N + s] = load_scalar(adj, bf16, at + (transpose ? s * N + r : r * N + s));
    for (int64_t e = N * N; e < ROWS * N; e++) copy[e] = 0.0f;
    return (weights){copy, N, 1};
}

/* out[r * C + c] = Σ_s w(r, s) in[s * C + c] for r, s < N, c < C (the sum over s in order). Rows
 * go ROWS at a time; the last block, when N >= ROWS, is the last ROWS rows (overlapping the block
 * before: those rows are computed again, the same way). */
static inline void node_sums(weights a, const vf *in, int64_t N, int64_t C, vf *out) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t b = 0; b < N; b += ROWS) {
            const int64_t r0 = N >= ROWS && b + ROWS > N ? N - ROWS : b;
            vf acc[ROWS];
            for (int64_t k = 0; k < ROWS; k++) acc[k] = splat(0.0f);
            for (int64_t s = 0; s < N; s++) {
                const vf v = in[s * C + c];
                const float *ws = a.w + r0 * a.rs + s * a.cs;
                for (int64_t k = 0; k < ROWS; k++) acc[k] += ws[k * a.rs] * v;
            }
            for (int64_t k = 0; k < ROWS && r0 + k < N; k++) out[(r0 + k) * C + c] = acc[k];
        }
}

static inline void store_rows(const vf *rows, int bf16, int64_t g, int64_t N, int64_t d, int64_t C, void *dst) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < C; c++) {
            const int64_t n = d - c * LANES < LANES ? d - c * LANES : LANES;
            store_values(rows[i * C + c], bf16, (g * N + i) * d + c * LANES, n, dst);
        }
}

static inline int64_t weights_size(int64_t N) { return (N > ROWS ? N : ROWS) * N; }

/* Returns 0, or -1 when the work buffer could not be allocated. */
int nip_gin_aggregate_forward(int64_t G, int64_t N, int64_t d, const void *z, const void *adj, const void *m,
                              int64_t data_batch, int bf16, int act, void *y) {
    const int64_t C = (d + LANES - 1) / LANES;
    vf *t = malloc((size_t)(2 * N * C) * sizeof(vf) + (size_t)weights_size(N) * sizeof(float));
    if (!t) return -1;
    vf *sums = t + N * C;
    float *w = (float *)(sums + N * C);
    for (int64_t g = 0; g < G; g++) {
        activations(g, g % data_batch, N, d, C, z, m, bf16, act, t, NULL);
        node_sums(adjacency(adj, bf16, g % data_batch, N, 0, w), t, N, C, sums);  /* y_i = Σ_j a_ij t_j */
        store_rows(sums, bf16, g, N, d, C, y);
    }
    free(t);
    return 0;
}

int nip_gin_aggregate_backward(int64_t G, int64_t N, int64_t d, const void *z, const void *adj, const void *m,
                               int64_t data_batch, int bf16, int act, const void *gy, void *gz) {
    const int64_t C = (d + LANES - 1) / LANES;
    vf *t = malloc((size_t)(4 * N * C) * sizeof(vf) + (size_t)weights_size(N) * sizeof(float));
    if (!t) return -1;
    vf *slope = t + N * C, *g_rows = slope + N * C, *sums = g_rows + N * C;
    float *w = (float *)(sums + N * C);
    for (int64_t g = 0; g < G; g++) {
        activations(g, g % data_batch, N, d, C, z, m, bf16, act, t, slope);
        for (int64_t i = 0; i < N; i++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t n = d - c * LANES < LANES ? d - c * LANES : LANES;
                g_rows[i * C + c] = load_values(gy, bf16, (g * N + i) * d + c * LANES, n);
            }
        node_sums(adjacency(adj, bf16, g % data_batch, N, 1, w), g_rows, N, C, sums);  /* u_j = Σ_i a_ij gy_i */
        for (int64_t e = 0; e < N * C; e++) sums[e] *= slope[e];
        store_rows(sums, bf16, g, N, d, C, gz);
    }
    free(t);
    return 0;
}
