/* What the kernels of nip_core/native share: LANES-wide float vectors (GCC/Clang vector
 * extensions, so the compiler picks the instructions: AVX-512, AVX2 or NEON), a vectorised exp,
 * bfloat16 conversions, the transposes between rows in memory and blocks whose every value is a
 * vector of LANES numbers, one per row, and the register-blocked product on such blocks
 * (`project`, the MLP kernel's layers and the attention kernel's in-projection).
 */
#ifndef NIP_NATIVE_LANES_H
#define NIP_NATIVE_LANES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* One vector is one machine register: 16 floats with AVX-512, 8 with AVX, 4 otherwise (SSE,
 * NEON). Wider generic vectors than the registers are split by the compiler into several
 * registers each, which spills the kernels' register-blocked accumulators to the stack: on an
 * AVX2 CPU 16-wide vectors made every kernel slower than the PyTorch composition it replaces. */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vf __attribute__((vector_size(LANES * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4), aligned(4)));

/* A vector with x in every lane (one broadcast; `{0} + x` cost an extra scalar add, which the
 * compiler may not drop since 0 + -0 is +0). */
static inline vf splat(float x) {
    vf out = {0};
    return out + x;
}

/* The LANES floats at p as one vector, one unaligned load. (A memcpy into a vector was copied by
 * GCC in two half-width moves through the stack where it prefers 256-bit vectors, as it does for
 * Intel CPUs with AVX-512 unless told otherwise: the full-width load after them missed store
 * forwarding, a stall per load, a third of the MLP kernel's backward pass on an Intel Xeon.) */
typedef float vf_unaligned __attribute__((vector_size(LANES * 4), aligned(4), may_alias));
static inline vf load_vf(const float *p) { return *(const vf_unaligned *)p; }

static inline vf lane_select(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

/* dst[i] = the sum of vector acc[i]'s lanes, in lane order (weight gradients summed per lane first). */
static inline void lane_sums(const vf *acc, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++) {
        const float *lanes = (const float *)(acc + i);
        float total = 0.0f;
        for (int64_t v = 0; v < LANES; v++) total += lanes[v];
        dst[i] = total;
    }
}

/* Vectors that share each broadcast weight in `project`: with 32 vector registers (AVX-512) two
 * vectors' 8 accumulators each fit; with 16 (AVX, SSE, NEON) one vector's already fill half of
 * them. Every lane's arithmetic is the same, in the same order, whatever NB is. */
#if LANES == 16
#define NB 2
#else
#define NB 1
#endif

/* A product with weights of any strides, in the lane layout: out[j * n_out + o] =
 * Σ_i in[j * n_in + i] w[i * ws + o * os] (+ bias[o] after the sum, as a product with a bias term
 * adds it) for the vectors j < L and o < n_out (a multiple of 8), the sum over i in order. A
 * vector's 8 outputs accumulate in registers over the whole inner dimension; each weight is
 * broadcast once for NB vectors. Always inlined, so that each caller's constant strides and L fold
 * in (left to itself, GCC moved other helpers out of line in the MLP kernel: ~4 % slower). */
static inline __attribute__((always_inline)) void project(const vf *in, int64_t L, int64_t n_in, const float *w,
                                                          int64_t ws, int64_t os, const float *bias, int64_t n_out,
                                                          vf *out) {
    for (int64_t j0 = 0; j0 < L; j0 += NB) {
        const int64_t nt = L - j0 < NB ? L - j0 : NB;
        for (int64_t o0 = 0; o0 < n_out; o0 += 8) {
            vf acc[NB][8];
            for (int64_t t = 0; t < NB; t++)
                for (int64_t u = 0; u < 8; u++) acc[t][u] = splat(0.0f);
            for (int64_t i = 0; i < n_in; i++) {
                const float *wi = w + i * ws + o0 * os;
                for (int64_t t = 0; t < NB; t++) {
                    const vf a = in[(j0 + (t < nt ? t : 0)) * n_in + i];
                    for (int64_t u = 0; u < 8; u++) acc[t][u] += a * wi[u * os];
                }
            }
            for (int64_t t = 0; t < nt; t++)
                for (int64_t u = 0; u < 8; u++)
                    out[(j0 + t) * n_out + o0 + u] = bias ? acc[t][u] + bias[o0 + u] : acc[t][u];
        }
    }
}

/* Cephes' single-precision polynomial for exp(r), |r| <= ln(2) / 2. */
static inline vf exp_poly(vf r) {
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

/* With AVX (and AVX-512), one instruction each for min, max (either returns its second operand
 * where one is NaN, so a NaN input passed second stays NaN), rounding to nearest and conversion. */
#if defined(__AVX__)
#if defined(__AVX512F__) && LANES == 16
#define LANES_MIN(a, b) (vf)_mm512_min_ps((__m512)(a), (__m512)(b))
#define LANES_MAX(a, b) (vf)_mm512_max_ps((__m512)(a), (__m512)(b))
#define LANES_ROUND(a) (vf)_mm512_roundscale_ps((__m512)(a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define LANES_TO_INT(a) (vi)_mm512_cvtps_epi32((__m512)(a))
#define LANES_FMA(a, b, c) (vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c))
#else
#define LANES_MIN(a, b) (vf)_mm256_min_ps((__m256)(a), (__m256)(b))
#define LANES_MAX(a, b) (vf)_mm256_max_ps((__m256)(a), (__m256)(b))
#define LANES_ROUND(a) (vf)_mm256_round_ps((__m256)(a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define LANES_TO_INT(a) (vi)_mm256_cvtps_epi32((__m256)(a))
#if defined(__FMA__)
#define LANES_FMA(a, b, c) (vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c))
#endif
#endif
#endif

/* exp(x) lane by lane, to about 2 ulp: n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts),
 * exp_poly(r) times 2^n. Below the smallest normal result it returns 0, so exp(-inf) = 0; NaN stays
 * NaN. With AVX-512 the scaling is one vscalefps (inf above the range); otherwise the exponent is
 * built by hand from the input clamped to the range (the largest float above it). */
#if defined(__AVX512F__) && LANES == 16
static inline vf vexp(vf x) {
    const vf xc = (vf)_mm512_min_ps(_mm512_set1_ps(89.0f), (__m512)x);  /* NaN stays NaN; exp(89) is inf */
    const __m512 n = _mm512_roundscale_ps((__m512)(xc * 1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf r = (xc - (vf)n * 0.693359375f) + (vf)n * 2.12194440e-4f;
    return lane_select(x < -87.33654f, splat(0.0f), (vf)_mm512_scalef_ps((__m512)exp_poly(r), n));
}
#else
static inline vf vexp(vf x) {
    const float hi = 88.37626f, lo = -87.33654f;
#if defined(__AVX__)
    const vf xc = LANES_MIN(splat(hi), LANES_MAX(splat(lo), x));
    const vf n = LANES_ROUND(xc * 1.44269504088896341f);
    const vi e = (LANES_TO_INT(n) + 127) << 23;
#else
    vf xc = lane_select(x > hi, splat(hi), x);
    xc = lane_select(xc < lo, splat(lo), xc);
    /* n = round(x / ln 2) by adding and subtracting 1.5 * 2^23 */
    const vf shifter = splat(12582912.0f);
    const vf n = (xc * 1.44269504088896341f + shifter) - shifter;
    const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
#endif
    const vf r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    return lane_select(x < lo, splat(0.0f), exp_poly(r) * (vf)e);
}
#endif

/* The logistic sigmoid 1 / (1 + e^-z) lane by lane. With FMA in about two thirds of the
 * instructions of 1 / (1 + vexp(-z)), whose exp cost the MLP kernel a third of its forward pass
 * on an AVX2 CPU: e^-z = 2^x, x = -z log2(e) with z clamped to +-86.643 (beyond, the sigmoid is 1
 * or 2.35e-38), 2^x = 2^n 2^f with n = round(x) and 2^f a degree-6 polynomial on [-1/2, 1/2]
 * (fitted for relative error: 1e-7), 2^n added to its exponent bits. f also gets what rounding
 * took from z log2(e) (exactly, by an FMA, and log2(e)'s own remainder), so the result is within
 * 1.6e-7 (relative) of the sigmoid for every z, measured against double precision on [-100, 100].
 * A NaN stays NaN. Without FMA: through vexp, as accurate. */
#if defined(LANES_FMA)
static inline vf vsigmoid(vf z) {
    const vf zc = LANES_MIN(splat(86.643f), LANES_MAX(splat(-86.643f), z)), x = zc * -1.44269502163f;
    const vf n = LANES_ROUND(x);
    const vf f = (x - n) + LANES_FMA(zc, splat(-1.92596299e-8f), LANES_FMA(zc, splat(-1.44269502163f), -x));
    vf p = splat(1.5345810971e-4f);
    p = p * f + 1.3399930904e-3f;
    p = p * f + 9.6184890717e-3f;
    p = p * f + 5.5503286421e-2f;
    p = p * f + 2.4022646248e-1f;
    p = p * f + 6.9314718246e-1f;
    p = p * f + 1.0f;
    const vf e = (vf)((vi)p + (LANES_TO_INT(n) << 23));
    return 1.0f / (1.0f + e);
}
#else
static inline vf vsigmoid(vf z) { return 1.0f / (1.0f + vexp(-z)); }
#endif

/* tanh(x) = 1 - 2 sigmoid(-2x), through vsigmoid (a NaN stays NaN). */
static inline vf vtanh(vf x) { return 1.0f - 2.0f * vsigmoid(-2.0f * x); }

static inline float bf16_to_float(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t float_to_bf16(float f) {
    /* round to nearest even, as torch converts; NaN stays NaN. Without a branch, so that the
     * loops over rows below vectorise. */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16, nan = (bits >> 16) | 0x40u;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* n values converted either way, whole rows at a time. */
static inline void bf16_to_float_n(const uint16_t *src, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
}

static inline void float_to_bf16_n(const float *src, int64_t n, uint16_t *dst) {
    for (int64_t i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
}

/* Elements per row that a full bf16 block converts at once, in a float buffer on the stack. */
#define CONVERT_CHUNK 64

#if defined(__AVX512F__) && LANES == 16
#define LANES_TRANSPOSE 1
/* out[i] lane v = in[v] lane i: a 16 x 16 transpose in registers (64 shuffles instead of 256
 * scalar loads and stores). Rows 4g .. 4g + 3 are interleaved within each 128-bit lane (32-bit,
 * then 64-bit unpacks), which leaves column 4 L + c of those rows in lane L of vector 4 g + c;
 * then the 4 x 4 lanes of vectors c, 4 + c, 8 + c, 12 + c are transposed (two rounds of
 * shuf_f32x4). Its own inverse. */
static inline __attribute__((always_inline)) void transpose16(const __m512 *in, __m512 *out) {
    __m512 u[16];
    for (int g = 0; g < 4; g++) {
        const __m512 t0 = _mm512_unpacklo_ps(in[4 * g], in[4 * g + 1]);
        const __m512 t1 = _mm512_unpackhi_ps(in[4 * g], in[4 * g + 1]);
        const __m512 t2 = _mm512_unpacklo_ps(in[4 * g + 2], in[4 * g + 3]);
        const __m512 t3 = _mm512_unpackhi_ps(in[4 * g + 2], in[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
    }
    for (int c = 0; c < 4; c++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        out[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        out[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        out[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        out[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* what gather_tile and scatter_tile (below) use with AVX-512 */
typedef __m512 tile_vec;
#define TILE_LOAD _mm512_loadu_ps
#define TILE_STORE _mm512_storeu_ps
#define TILE_TRANSPOSE transpose16
#elif defined(__AVX__) && LANES == 8
#define LANES_TRANSPOSE 1
/* out[i] lane v = in[v] lane i: an 8 x 8 transpose in registers (24 shuffles instead of 64
 * scalar loads and stores, which were a sixth of the MLP kernel's forward pass on an AVX2 CPU).
 * Rows 2g, 2g + 1 are interleaved within each 128-bit lane (unpacks), then pairs of those
 * (shufps), which leaves columns c and 4 + c of rows 4h .. 4h + 3 in the two halves of vector
 * 4h + c; permute2f128 joins the halves. Its own inverse. */
static inline __attribute__((always_inline)) void transpose8(const __m256 *in, __m256 *out) {
    __m256 t[8], u[8];
    for (int g = 0; g < 4; g++) {
        t[2 * g] = _mm256_unpacklo_ps(in[2 * g], in[2 * g + 1]);
        t[2 * g + 1] = _mm256_unpackhi_ps(in[2 * g], in[2 * g + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        out[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        out[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* what gather_tile and scatter_tile (below) use with AVX */
typedef __m256 tile_vec;
#define TILE_LOAD _mm256_loadu_ps
#define TILE_STORE _mm256_storeu_ps
#define TILE_TRANSPOSE transpose8
#endif

#if defined(LANES_TRANSPOSE)
/* dst[e][v] = row[v][e] for e < LANES (each row LANES floats where it lies): one tile through the
 * register transpose of this instruction set. */
static inline __attribute__((always_inline)) void gather_tile(const float *const *row, float *dst) {
    tile_vec in[LANES], out[LANES];
    for (int v = 0; v < LANES; v++) in[v] = TILE_LOAD(row[v]);
    TILE_TRANSPOSE(in, out);
    for (int e = 0; e < LANES; e++) TILE_STORE(dst + e * LANES, out[e]);
}

/* row[v][e] = src[e][v] for e < LANES: the inverse of gather_tile. */
static inline __attribute__((always_inline)) void scatter_tile(const float *src, float *const *row) {
    tile_vec in[LANES], out[LANES];
    for (int e = 0; e < LANES; e++) in[e] = TILE_LOAD(src + e * LANES);
    TILE_TRANSPOSE(in, out);
    for (int v = 0; v < LANES; v++) TILE_STORE(row[v], out[v]);
}
#endif

/* dst[e][v] = row[v][e] for e < n and v < lanes, the float32 rows anywhere in memory (row[v] for
 * v >= lanes is not read); lanes past `lanes` are 0. Whole tiles go through the register transpose
 * when every lane has a row. This and the tile functions above are always inlined: left to GCC,
 * each change to the kernels around them moved them in or out of line, and the MLP kernel's
 * timing with them. */
static inline __attribute__((always_inline)) void gather_rows(const float *const *row, int64_t lanes, int64_t n,
                                                              float *dst) {
    int64_t e = 0;
#if defined(LANES_TRANSPOSE)
    if (lanes == LANES)
        for (; e + LANES <= n; e += LANES) {
            const float *tile[LANES];
            for (int64_t v = 0; v < LANES; v++) tile[v] = row[v] + e;
            gather_tile(tile, dst + e * LANES);
        }
#endif
    for (; e < n; e++)
        for (int64_t v = 0; v < LANES; v++) dst[e * LANES + v] = v < lanes ? row[v][e] : 0.0f;
}

/* dst[e][v] = row (g0 + v) of src, element e (rows of n values); lanes past the end are 0.
 * Element by element across the rows, so that every store fills a whole vector; bf16 rows are
 * converted a chunk of each row at a time first. */
static inline void gather(const void *src, int bf16, int64_t g0, int64_t lanes, int64_t n, float *dst) {
    if (lanes == LANES && !bf16) {
        const float *row[LANES];
        for (int64_t v = 0; v < LANES; v++) row[v] = (const float *)src + (g0 + v) * n;
        gather_rows(row, LANES, n, dst);
    } else if (lanes == LANES) {
        const uint16_t *rows = (const uint16_t *)src + g0 * n;
        float chunk[LANES * CONVERT_CHUNK];
        for (int64_t e0 = 0; e0 < n; e0 += CONVERT_CHUNK) {
            const int64_t m = n - e0 < CONVERT_CHUNK ? n - e0 : CONVERT_CHUNK;
            for (int64_t v = 0; v < LANES; v++) bf16_to_float_n(rows + v * n + e0, m, chunk + v * CONVERT_CHUNK);
            int64_t e = 0;
#if defined(LANES_TRANSPOSE)
            for (; e + LANES <= m; e += LANES) {
                const float *row[LANES];
                for (int64_t v = 0; v < LANES; v++) row[v] = chunk + v * CONVERT_CHUNK + e;
                gather_tile(row, dst + (e0 + e) * LANES);
            }
#endif
            for (; e < m; e++)
                for (int64_t v = 0; v < LANES; v++) dst[(e0 + e) * LANES + v] = chunk[v * CONVERT_CHUNK + e];
        }
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
static inline void scatter(const float *src, int bf16, int64_t g0, int64_t lanes, int64_t n, void *dst) {
    if (lanes == LANES && !bf16) {
        float *rows = (float *)dst + g0 * n;
        int64_t e = 0;
#if defined(LANES_TRANSPOSE)
        for (; e + LANES <= n; e += LANES) {
            float *row[LANES];
            for (int64_t v = 0; v < LANES; v++) row[v] = rows + v * n + e;
            scatter_tile(src + e * LANES, row);
        }
#endif
        for (; e < n; e++)
            for (int64_t v = 0; v < LANES; v++) rows[v * n + e] = src[e * LANES + v];
    } else if (lanes == LANES) {
        uint16_t *rows = (uint16_t *)dst + g0 * n;
        float chunk[LANES * CONVERT_CHUNK];
        for (int64_t e0 = 0; e0 < n; e0 += CONVERT_CHUNK) {
            const int64_t m = n - e0 < CONVERT_CHUNK ? n - e0 : CONVERT_CHUNK;
            int64_t e = 0;
#if defined(LANES_TRANSPOSE)
            for (; e + LANES <= m; e += LANES) {
                float *row[LANES];
                for (int64_t v = 0; v < LANES; v++) row[v] = chunk + v * CONVERT_CHUNK + e;
                scatter_tile(src + (e0 + e) * LANES, row);
            }
#endif
            for (; e < m; e++)
                for (int64_t v = 0; v < LANES; v++) chunk[v * CONVERT_CHUNK + e] = src[(e0 + e) * LANES + v];
            for (int64_t v = 0; v < LANES; v++) float_to_bf16_n(chunk + v * CONVERT_CHUNK, m, rows + v * n + e0);
        }
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

#endif
