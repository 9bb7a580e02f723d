/* Block-quantized GEMV/skinny GEMM for CPU decode: y[M, N] = x[M, K] @ W^T (+ b), W in GGUF-style
 * blocks of 32 (Q8_0, Q4_0, Q4_1), never dequantized. AVX512-VNNI (vpdpbusd), llama.cpp's scheme:
 * the activation is quantized to int8 per block of 32 (Q8_0/Q8_1 style), each block's dot product
 * is exact in int32, then scaled in fp32.
 *
 * Built and loaded by cpu_qgemv.py (gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -fopenmp).
 *
 * Every format is stored as w[n, k] = d[n, b] * u[n, k] + c[n, b] for k in block b = k / 32, with
 * u unsigned (4 bits: 0..15, 8 bits: 0..255), d and c fp16. This is GGUF's own numbers, repacked
 * losslessly: Q4_1 (u = q, c = m), Q4_0 (u = q, c = -8 d), Q8_0 (u = q + 128, c = -128 d).
 *
 * Tiles: up to 8 x rows share each unpacked block (MR); tiles of 2+ rows software-prefetch the weight
 * stream PF_DIST blocks ahead (measured: a 32 MB Q8_0 head at 4 rows went from 3.7 to 0.95 ms, 1 thread;
 * 1-row tiles are faster without).
 *
 * Packed weight layout (made once by cpu_qgemv.pack_blocks):
 *   wp[NG][KB][WB + 64] bytes, NG = ceil(N / 16) (zero padded rows: d = c = 0), KB = K / 32.
 *   A group is 16 output rows (one zmm lane per row); a block holds WB weight bytes then d[16] and
 *   c[16] as fp16. The 32 values of a row's block are 8 chunks of 4 (chunk j = k 4j .. 4j+3);
 *   8 bits (WB = 512): 64-byte vector j holds chunk j, lane r = 4 bytes of row r.
 *   4 bits (WB = 256): 64-byte vector j holds chunk 2j in its low nibbles and chunk 2j+1 in its
 *   high nibbles (lane r, byte t: row r's k = 8j + t low, 8j + 4 + t high).
 *   A group is one contiguous stream and a thread's groups are adjacent (one sequential read).
 *
 * Activation quantization (per row m, block b): a = max |x|, dx = a / 127, q = round-to-nearest-even
 * (x * (127 / a)) (0 when a == 0), sx = dx * sum(q). Then y[m, n] = sum_b (d dx S(u, q) + c sx),
 * S the exact int32 dot product, summed over b in order in one fp32 lane (fma), bias added once,
 * stored as fp32 or rounded to bf16 (RNE). Results do not depend on M, on the tiling, on the thread
 * count or on other rows.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define MR 8 /* x rows per tile: a block's weights are unpacked once for up to 8 rows */
#ifndef PF_DIST
#define PF_DIST 4
#endif
#ifndef PF_MIN_ROWS
#define PF_MIN_ROWS 2
#endif

static inline __m512 load16(const void *x, int x_fp32) {
    if (x_fp32) return _mm512_loadu_ps((const float *)x);
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)); /* bf16 -> fp32 exactly */
}

/* x [M, K] (row stride ldx elements, bf16 or fp32) -> qx [M, K] int8, dx / sx [M, KB]. */
static void quantize_rows(const void *x, int64_t ldx, int x_fp32, int64_t M, int64_t K, int8_t *qx, float *dx,
                          float *sx) {
    const int64_t KB = K / QK, es = x_fp32 ? 4 : 2;
    for (int64_t m = 0; m < M; m++) {
        const char *row = (const char *)x + m * ldx * es;
        for (int64_t b = 0; b < KB; b++) {
            const __m512 a0 = load16(row + (b * QK) * es, x_fp32), a1 = load16(row + (b * QK + 16) * es, x_fp32);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
            const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, vid)); /* MXCSR default: nearest even */
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, vid));
            int8_t *dst = qx + m * K + b * QK;
            _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(dst + 16), _mm512_cvtepi32_epi8(q1));
            dx[m * KB + b] = d;
            sx[m * KB + b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
    }
}

/* One tile: group g (16 output rows), mr rows of quantized x from m0. bits and mr are compile-time
 * constants at each call site (always_inline). */
static inline __attribute__((always_inline)) void qtile(
    const int bits, const int mr, const uint8_t *wp, const int8_t *qx, const float *dx, const float *sx,
    const float *bias, void *y, int64_t ldy, int64_t m0, int64_t g, int64_t N, int64_t K, int out_fp32) {
    const int64_t KB = K / QK, WB = bits == 4 ? 256 : 512, BS = WB + 64;
    const uint8_t *w = wp + g * KB * BS;
    const __m512i lo = _mm512_set1_epi8(0x0F);
    __m512 acc[MR];
    for (int r = 0; r < mr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < KB; b++, w += BS) {
        __m512i wv[8];
        if (mr >= PF_MIN_ROWS) /* compute-heavier tiles: keep the stream PF_DIST blocks ahead (see header) */
            for (int64_t off = 0; off < BS; off += 64) _mm_prefetch((const char *)(w + PF_DIST * BS + off), _MM_HINT_T0);
        if (bits == 4) {
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512((const void *)(w + 64 * j));
                wv[2 * j] = _mm512_and_si512(v, lo);
                wv[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
            }
        } else {
            for (int j = 0; j < 8; j++) wv[j] = _mm512_loadu_si512((const void *)(w + 64 * j));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + WB)));
        const __m512 cw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + WB + 32)));
        for (int r = 0; r < mr; r++) {
            const int8_t *xq = qx + (m0 + r) * K + b * QK;
            __m512i s = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) {
                int32_t xv;
                memcpy(&xv, xq + 4 * j, 4);
                s = _mm512_dpbusd_epi32(s, wv[j], _mm512_set1_epi32(xv));
            }
            const int64_t i = (m0 + r) * KB + b;
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx[i])), acc[r]);
            acc[r] = _mm512_fmadd_ps(cw, _mm512_set1_ps(sx[i]), acc[r]);
        }
    }
    const int64_t n0 = g * 16, left = N - n0;
    const __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < mr; r++) {
        const __m512 v = bias ? _mm512_add_ps(acc[r], bv) : acc[r];
        if (out_fp32)
            _mm512_mask_storeu_ps((float *)y + (m0 + r) * ldy + n0, mask, v);
        else
            _mm256_mask_storeu_epi16((uint16_t *)y + (m0 + r) * ldy + n0, mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
}

#define TILES(BITS)                                                                                              \
    static void run_groups_##BITS(const uint8_t *wp, const int8_t *qx, const float *dx, const float *sx,        \
                                  const float *bias, void *y, int64_t ldy, int64_t M, int64_t N, int64_t K,      \
                                  int out_fp32, int64_t glo, int64_t ghi) {                                      \
        for (int64_t g = glo; g < ghi; g++) {                                                                    \
            int64_t m0 = 0;                                                                                      \
            for (; m0 + MR <= M; m0 += MR) qtile(BITS, MR, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); \
            switch (M - m0) {                                                                                    \
            case 1: qtile(BITS, 1, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); break;                  \
            case 2: qtile(BITS, 2, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); break;                  \
            case 3: qtile(BITS, 3, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); break;                  \
            case 4: qtile(BITS, 4, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); break;                  \
            case 5: qtile(BITS, 5, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); break;                  \
            case 6: qtile(BITS, 6, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); break;                  \
            case 7: qtile(BITS, 7, wp, qx, dx, sx, bias, y, ldy, m0, g, N, K, out_fp32); break;                  \
            default: break;                                                                                      \
            }                                                                                                    \
        }                                                                                                        \
    }
TILES(4)
TILES(8)

/* y[M, N] (bf16, or fp32 if out_fp32) = x[M, K] (bf16, or fp32 if x_fp32) @ W^T + bias (fp32 [N] or NULL).
 * K % 32 == 0; bits 4 or 8; wp packed as above. Returns 0, or -1 when the scratch cannot be allocated. */
int ti_qgemv(const void *x, int64_t ldx, int x_fp32, const uint8_t *wp, int bits, const float *bias, void *y,
             int64_t ldy, int64_t M, int64_t N, int64_t K, int out_fp32, int nthreads) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    const int64_t KB = K / QK, NG = (N + 15) / 16;
    char stack[16384];
    const size_t need = (size_t)(M * K) + 2 * sizeof(float) * (size_t)(M * KB) + 64;
    char *scratch = need <= sizeof(stack) ? stack : (char *)malloc(need);
    if (!scratch) return -1;
    float *dx = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63), *sx = dx + M * KB;
    int8_t *qx = (int8_t *)(sx + M * KB);
    quantize_rows(x, ldx, x_fp32, M, K, qx, dx, sx);
    const int nt = nthreads < NG ? nthreads : (int)NG;
    if (nt <= 1) {
        if (bits == 4) run_groups_4(wp, qx, dx, sx, bias, y, ldy, M, N, K, out_fp32, 0, NG);
        else run_groups_8(wp, qx, dx, sx, bias, y, ldy, M, N, K, out_fp32, 0, NG);
    } else {
#pragma omp parallel num_threads(nt)
        {
            const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
            const int64_t glo = NG * t / n, ghi = NG * (t + 1) / n;
            if (bits == 4) run_groups_4(wp, qx, dx, sx, bias, y, ldy, M, N, K, out_fp32, glo, ghi);
            else run_groups_8(wp, qx, dx, sx, bias, y, ldy, M, N, K, out_fp32, glo, ghi);
        }
    }
    if (scratch != stack) free(scratch);
    return 0;
}

/* Lets the loader check it got this ABI (bump with any change of signature or packed layout). */
int ti_qgemv_abi_version(void) { return 1; }
