/* What the kernels of nip_core/native share: LANES-wide float vectors (GCC/Clang vector
 * extensions, so the compiler picks the instructions: AVX-512, AVX2 or NEON), a vectorised exp,
 * bfloat16 conversions, and the transposes between rows in memory and blocks whose every value
 * is a vector of LANES numbers, one per row.
 */
#ifndef NIP_NATIVE_LANES_H
#define NIP_NATIVE_LANES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static inline vf splat(float x) {
    vf out = {0};
    return out + x;
}

static inline vf lane_select(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

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

/* exp(x) lane by lane, to about 2 ulp: n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts),
 * exp_poly(r) times 2^n. Below the smallest normal result it returns 0, so exp(-inf) = 0; NaN stays
 * NaN. With AVX-512 the scaling is one vscalefps (inf above the range); otherwise the exponent is
 * built by hand from the input clamped to the range (the largest float above it). */
#if defined(__AVX512F__) && LANES == 16
#include <immintrin.h>
static inline vf vexp(vf x) {
    const vf xc = (vf)_mm512_min_ps(_mm512_set1_ps(89.0f), (__m512)x);  /* NaN stays NaN; exp(89) is inf */
    const __m512 n = _mm512_roundscale_ps((__m512)(xc * 1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf r = (xc - (vf)n * 0.693359375f) + (vf)n * 2.12194440e-4f;
    return lane_select(x < -87.33654f, splat(0.0f), (vf)_mm512_scalef_ps((__m512)exp_poly(r), n));
}
#else
static inline vf vexp(vf x) {
    const float hi = 88.37626f, lo = -87.33654f;
    vf xc = lane_select(x > hi, splat(hi), x);
    xc = lane_select(xc < lo, splat(lo), xc);
    /* n = round(x / ln 2) by adding and subtracting 1.5 * 2^23 */
    const vf shifter = splat(12582912.0f);
    const vf n = (xc * 1.44269504088896341f + shifter) - shifter;
    const vf r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return lane_select(x < lo, splat(0.0f), exp_poly(r) * (vf)e);
}
#endif

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
static inline void gather(const void *src, int bf16, int64_t g0, int64_t lanes, int64_t n, float *dst) {
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
static inline void scatter(const float *src, int bf16, int64_t g0, int64_t lanes, int64_t n, void *dst) {
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

#endif
