/* bf16 GEMV/skinny GEMM for CPU decode: y[M, N] = x[M, K] @ W^T (+ b), AVX512-BF16 (vdpbf16ps).
 *
 * Built and loaded by cpu_gemv.py (gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -fopenmp).
 *
 * Packed weight layout (made once by cpu_gemv.pack_weight):
 *   wp[NG][K2][NBLK * 16][2] bf16, NG = ceil(N / 64), K2 = ceil(K / 2), zero padded.
 *   A group is 64 output rows = NBLK (4) blocks of 16. For group g and k-pair kp, block i's 16 rows
 *   x 2 bf16 are one 64-byte zmm: lane j holds (W[64 g + 16 i + j, 2 kp], W[.., 2 kp + 1]), the
 *   operand vdpbf16ps pairs with a broadcast 32-bit (x[m, 2 kp], x[m, 2 kp + 1]). A group is one
 *   contiguous K2 * 256-byte stream and a thread's groups are adjacent, so each thread reads one
 *   sequential region per call: measured ~25 GB/s per thread vs ~17 GB/s for a block-major layout
 *   (four interleaved 16-row streams) and vs software prefetching (any distance was slower).
 *
 * AMX (Intel Sapphire Rapids and later: amx_tile + amx_bf16, and the kernel's permission, asked once per
 * process with arch_prctl): when K is a multiple of 32 the same packed layout is read as AMX B tiles (a
 * group's 16-row block over 16 k-pairs is 16 rows of 64 bytes at a 256-byte stride) and every x row of a
 * call (up to 16 per tile) is multiplied by one TDPBF16PS per block and 32-wide k chunk. vdpbf16ps does
 * 32 multiply-adds per instruction, so a batch of 8 rows was compute-bound at ~22 GMAC/s a core (2.1 GHz
 * Xeon); TDPBF16PS does 16 x 16 x 32, so 8 rows take 1.9-3.8x one row instead of 3.5-7.2x (measured, 2
 * threads: 49152 x 576 head 2.15 vs 4.08 ms at 8 rows, 1.16 ms either way at 1; 3072 x 576 110 vs 217 us). Opt-in: ti_gemv_amx(1) allows it, (0) forbids it
 * (the default: in the whole SmolLM2 decode step batch 1 ran 33-42 tok/s with AMX vs 62-74 without on that
 * Xeon, batch 8 252-369 vs 260-304). The cause is the host, not tile configure/release: on that 2-vCPU KVM guest
 * the same L1-resident AMX step takes 24-303 ns from one 0.2 s sample to the next while AVX512 stays at 52-58
 * (benchmarks/probe_amx_stability.c), and a variant configuring once per thread without release was as bimodal.
 * The same decision holds for every M, so the invariants below hold on either path.
 *
 * Invariants:
 *   - An output y[m, n] is accumulated in fp32 over k in order (one lane per k-pair with vdpbf16ps;
 *     per 32-wide k chunk, chunks in order, with AMX, whose sum inside a chunk rounds differently),
 *     then the bias (fp32) is added once, then it is rounded to bf16 (RNE) or stored as fp32. The
 *     path depends only on the CPU, the AMX mode and K, never on M, on the tiling, on the thread
 *     count or on the other rows' values: results are bitwise independent of all of them.
 *   - Threads split the groups into contiguous static ranges.
 *   - x rows are read with stride ldx (elements), y rows written with stride ldy, only n < N is
 *     stored; the odd K tail reads only x[m, K-1] (never past a row).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#ifdef __AMX_BF16__
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define NBLK 4 /* 16-row blocks per group (= per tile): NBLK * MR fp32 accumulators */
#define MR 6   /* x rows per tile: 24 accumulators + 4 weight vectors + 1 broadcast of the 32 zmm */
#ifndef PF_DIST
#define PF_DIST 0 /* k-pairs ahead that tiles of 2+ rows prefetch (0: none) */
#endif

static inline __m512bh bcast_pair(const uint16_t *xrow, int64_t kp) {
    uint32_t v;
    memcpy(&v, xrow + 2 * kp, 4); /* (x[2 kp], x[2 kp + 1]) as one 32-bit lane */
    return (__m512bh)_mm512_set1_epi32((int)v);
}

/* One output vector: v (fp32, bias added) into y[m, n0 .. n0 + 15] under mask, as fp32 or rounded to bf16 (RNE). */
static inline void store_out(void *y, int64_t ldy, int64_t m, int64_t n0, __mmask16 mask, __m512 v, int out_fp32) {
    if (out_fp32)
        _mm512_mask_storeu_ps((float *)y + m * ldy + n0, mask, v);
    else
        _mm256_mask_storeu_epi16((uint16_t *)y + m * ldy + n0, mask, (__m256i)_mm512_cvtneps_pbh(v));
}

/* One tile: group g (64 output rows), mr rows of x starting at m0. mr is a compile-time constant
 * at every call site (always_inline), so the accumulators stay in registers (24 + 4 + 1 zmm). */
static inline __attribute__((always_inline)) void tile(
    const int mr, const uint16_t *x, int64_t ldx, const uint16_t *wp, const float *bias,
    void *y, int64_t ldy, int64_t m0, int64_t g, int64_t N, int64_t K, int out_fp32) {
    const int64_t K2 = (K + 1) / 2, kfull = K / 2; /* kfull: pairs with both halves inside a row */
    const uint16_t *w = wp + g * K2 * (NBLK * 32);
    const uint16_t *xr[MR];
    __m512 acc[NBLK][MR];
    for (int r = 0; r < mr; r++) {
        xr[r] = x + (m0 + r) * ldx;
        for (int i = 0; i < NBLK; i++) acc[i][r] = _mm512_setzero_ps();
    }
    for (int64_t kp = 0; kp < kfull; kp++, w += NBLK * 32) {
        __m512bh wv[NBLK];
        if (PF_DIST > 0 && mr >= 2)
            for (int i = 0; i < NBLK * 64; i += 64) _mm_prefetch((const char *)(w + PF_DIST * NBLK * 32) + i, _MM_HINT_T0);
        for (int i = 0; i < NBLK; i++) wv[i] = (__m512bh)_mm512_loadu_si512((const void *)(w + 32 * i));
        for (int r = 0; r < mr; r++) {
            const __m512bh xv = bcast_pair(xr[r], kp);
            for (int i = 0; i < NBLK; i++) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], wv[i], xv);
        }
    }
    if (kfull < K2) { /* odd K: the last pair's high half is the zero padding, read only x[K-1] */
        for (int r = 0; r < mr; r++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xr[r][K - 1]);
            for (int i = 0; i < NBLK; i++)
                acc[i][r] = _mm512_dpbf16_ps(acc[i][r], (__m512bh)_mm512_loadu_si512((const void *)(w + 32 * i)), xv);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NBLK; i++) { /* no early exit: keeps the loop unrolled and acc in registers */
        const int64_t n0 = g * (NBLK * 16) + i * 16, left = N - n0;
        const __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            store_out(y, ldy, m0 + r, n0, mask, bias ? _mm512_add_ps(acc[i][r], bv) : acc[i][r], out_fp32);
        }
    }
}

#ifdef __AMX_BF16__
static int amx_mode = 0;   /* 1: use AMX where available, 0: never (the default; ti_gemv_amx) */
static int amx_state = -1; /* -1: not probed yet, 0: unavailable, 1: the CPU has it and the kernel granted it */

/* Whether this process may run AMX bf16 tiles: CPUID leaf 7 (EDX bit 22 amx_bf16, bit 24 amx_tile) and
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), which is process-wide. Probed once; call it from the
 * calling thread before a parallel region (the permission then covers the team). */
static int amx_ready(void) {
    if (amx_state < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        int ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (d & (1u << 24));
        amx_state = ok && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    }
    return amx_mode && amx_state;
}

/* The AMX path applies to this linear (the same answer for every M: see the header). */
static inline int amx_for(int64_t K) { return K % 32 == 0 && amx_ready(); }

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) amx_cfg;

/* This thread's tile shapes for mr x rows: tmm0-3 the C blocks (mr x 16 fp32), tmm4 x (mr x 32 bf16),
 * tmm5-7 weight blocks (16 k-pairs x 16 columns). */
static void amx_config(int mr) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 5; i++) { c.rows[i] = (uint8_t)mr; c.colsb[i] = 64; }
    for (int i = 5; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
    _tile_loadconfig(&c);
}

/* Group g (64 outputs) for rows m0 .. m0 + mr - 1 (mr <= 16, the configured tile rows); K % 32 == 0. */
static void amx_tile(const uint16_t *x, int64_t ldx, const uint16_t *wp, const float *bias, void *y, int64_t ldy,
                     int64_t m0, int mr, int64_t g, int64_t N, int64_t K, int out_fp32) {
    const uint16_t *w = wp + g * (K / 2) * (NBLK * 32), *xr = x + m0 * ldx;
    float c[16 * NBLK * 16] __attribute__((aligned(64))); /* [mr][64] */
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t kc = 0; kc < K / 32; kc++, w += 16 * NBLK * 32) { /* 16 k-pairs of every block */
        _tile_loadd(4, xr + kc * 32, ldx * 2);
        _tile_loadd(5, w, 256);      _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, w + 32, 256); _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, w + 64, 256); _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, w + 96, 256); _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, c, 256); _tile_stored(1, c + 16, 256); _tile_stored(2, c + 32, 256); _tile_stored(3, c + 48, 256);
    for (int i = 0; i < NBLK; i++) {
        const int64_t n0 = g * (NBLK * 16) + i * 16, left = N - n0;
        if (left <= 0) break;
        const __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
        for (int r = 0; r < mr; r++) {
            const __m512 v = _mm512_load_ps(c + r * 64 + i * 16);
            store_out(y, ldy, m0 + r, n0, mask, bias ? _mm512_add_ps(v, bv) : v, out_fp32); /* as tile(): -0 stays */
        }
    }
}

/* Groups [glo, ghi) for all M rows through AMX (amx_for(K) holds): rows in chunks of 16 inside a group, so
 * the group's weights come from memory once. Configures this thread's tiles and releases them after. */
static void amx_groups(const uint16_t *x, int64_t ldx, const uint16_t *wp, const float *bias, void *y, int64_t ldy,
                       int64_t M, int64_t N, int64_t K, int out_fp32, int64_t glo, int64_t ghi) {
    if (glo >= ghi) return;
    int cur = 0;
    for (int64_t g = glo; g < ghi; g++)
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
            const int mr = M - m0 < 16 ? (int)(M - m0) : 16;
            if (mr != cur) { amx_config(mr); cur = mr; }
            amx_tile(x, ldx, wp, bias, y, ldy, m0, mr, g, N, K, out_fp32);
        }
    _tile_release();
}
#else
static inline int amx_for(int64_t K) { (void)K; return 0; }
static void amx_groups(const uint16_t *x, int64_t ldx, const uint16_t *wp, const float *bias, void *y, int64_t ldy,
                       int64_t M, int64_t N, int64_t K, int out_fp32, int64_t glo, int64_t ghi) {
    (void)x; (void)ldx; (void)wp; (void)bias; (void)y; (void)ldy; (void)M; (void)N; (void)K; (void)out_fp32;
    (void)glo; (void)ghi;
}
#endif

/* 1 to allow AMX where the CPU has it, 0 to never use it (the default); returns whether it is now in use. */
int ti_gemv_amx(int mode) {
#ifdef __AMX_BF16__
    amx_mode = mode != 0;
    return amx_ready();
#else
    (void)mode;
    return 0;
#endif
}

/* Groups [glo, ghi) for all M rows. Rows go in the inner loop: a group's weights (K2 * 256 bytes)
 * come from memory once and are re-read from cache for each further tile of MR rows. */
static void run_groups(const uint16_t *x, int64_t ldx, const uint16_t *wp, const float *bias, void *y, int64_t ldy,
                       int64_t M, int64_t N, int64_t K, int out_fp32, int64_t glo, int64_t ghi) {
    for (int64_t g = glo; g < ghi; g++) {
        int64_t m0 = 0;
        for (; m0 + MR <= M; m0 += MR) tile(MR, x, ldx, wp, bias, y, ldy, m0, g, N, K, out_fp32);
        switch (M - m0) {
        case 5: tile(5, x, ldx, wp, bias, y, ldy, m0, g, N, K, out_fp32); break;
        case 4: tile(4, x, ldx, wp, bias, y, ldy, m0, g, N, K, out_fp32); break;
        case 1: tile(1, x, ldx, wp, bias, y, ldy, m0, g, N, K, out_fp32); break;
        case 2: tile(2, x, ldx, wp, bias, y, ldy, m0, g, N, K, out_fp32); break;
        case 3: tile(3, x, ldx, wp, bias, y, ldy, m0, g, N, K, out_fp32); break;
        default: break;
        }
    }
}

/* y[M, N] (bf16, or fp32 if out_fp32) = x[M, K] (bf16) @ W^T + bias (fp32 [N] or NULL); wp packed as above. */
void ti_gemv_bf16(const uint16_t *x, int64_t ldx, const uint16_t *wp, const float *bias, void *y, int64_t ldy,
                  int64_t M, int64_t N, int64_t K, int out_fp32, int nthreads) {
    const int64_t NG = (N + NBLK * 16 - 1) / (NBLK * 16);
    if (M <= 0 || N <= 0 || K <= 0) return;
    const int nt = nthreads < NG ? nthreads : (int)NG, amx = amx_for(K);
    if (nt <= 1) {
        (amx ? amx_groups : run_groups)(x, ldx, wp, bias, y, ldy, M, N, K, out_fp32, 0, NG);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        (amx ? amx_groups : run_groups)(x, ldx, wp, bias, y, ldy, M, N, K, out_fp32, NG * t / n, NG * (t + 1) / n);
    }
}

/* Lets the loader check it got this ABI (bump with any change of signature or packed layout). */
int ti_gemv_abi_version(void) { return 2; }
