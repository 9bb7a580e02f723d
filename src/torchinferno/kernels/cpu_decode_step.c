/* The whole CPU decode step of a pre-norm GQA llama-style decoder in one call: every layer's
 * RMSNorm, QKV GEMV, rotary, KV-cache write, attention over the paged cache, O GEMV, residual,
 * RMSNorm, gate/up GEMV, SiLU-and-mul, down GEMV and residual, then the final norm, for B
 * sequences that each add one token. One OpenMP parallel region for the whole step: GEMVs split
 * their 64-row (bf16) or 16-row (GGUF blocks) output groups over the threads, attention splits
 * (sequence, head) pairs, the row-wise ops run on one thread between barriers. No Python, no
 * allocation per op, weights streamed once per step.
 *
 * Built and loaded by cpu_decode_step.py (the flags of cpu_gemv.c and cpu_qgemv.c together). The
 * GEMV tiles are those two files' own (included below), so a linear computes the same numbers here
 * as through its PackedLinear / QuantLinear call (AMX tiles for bf16 linears where cpu_gemv.c takes them,
 * each thread a contiguous range of 64-row groups with all B rows).
 *
 * Numerics (the module path's roundings, so the step agrees with it to bf16 rounding; not bitwise:
 * rsqrt/exp/the attention's summation order differ from ATen's):
 *   - the residual stream h is bf16; h += sublayer output rounds once (h + x in fp32 -> bf16).
 *   - RMSNorm: rstd = 1 / sqrt(mean(h^2) + eps) in fp32; y = bf16(bf16(h * rstd) * w).
 *   - rotary (neox, full-width tables c, s as the Python step passes them, s carrying the sign of
 *     the rotated half): q'[j] = bf16(bf16(q[j] c[j]) + rot(q)[j] s[j]), rot swaps the halves.
 *   - attention in fp32 over the cache (fp32 or bf16 cache), two-pass softmax, output -> bf16. A bf16 cache's
 *     scores are vdpbf16ps dot products of the bf16 query and key (exact products, fp32 sums), scaled after;
 *     an fp32 cache's are fp32 FMAs of the pre-scaled query.
 *   - SwiGLU: bf16(bf16(silu(g)) * u).
 */
#include "cpu_gemv.c"
enum { BF_TILE_ROWS = MR }; /* rows per bf16 tile: cpu_gemv.c's MR (cpu_qgemv.c redefines MR) */
_Static_assert(MR == 6, "linear_part's switch covers bf16 tiles of 1-6 rows");
#undef MR
#include "cpu_qgemv.c"
#include <math.h>

#define MAX_HD 512
#define MAX_REP 4 /* query heads of one KV head attended together */

enum { LIN_BF16 = 0, LIN_Q4 = 4, LIN_Q8 = 8 };

typedef struct {
    int64_t kind;        /* LIN_BF16: cpu_gemv's packed layout; LIN_Q4 / LIN_Q8: cpu_qgemv's blocks */
    const void *w;       /* packed weight */
    const float *bias;   /* fp32 [N] or NULL */
    int64_t n, k;
} ti_linear;

typedef struct {
    const uint16_t *in_norm, *post_norm; /* bf16 [D] */
    ti_linear qkv, o, gate_up, down;     /* [D -> (H + 2 Hkv) hd], [H hd -> D], [D -> 2 I], [I -> D] */
    void *k_cache, *v_cache;             /* [num_blocks, block_size, Hkv, hd], fp32 or bf16 (kv_fp32) */
} ti_layer;

typedef struct {
    int64_t batch, hidden, heads, kv_heads, head_dim, inter, num_layers;
    int64_t block_size, table_width, kv_fp32, nthreads;
    float eps, scale;
    const ti_layer *layers;
    const int32_t *block_tables; /* [batch, table_width] */
    const int32_t *seq_lens;     /* [batch]: context length including the new token */
    const uint16_t *cos, *sin;   /* bf16 [batch, head_dim] */
    const uint16_t *final_norm;  /* bf16 [D] */
    uint16_t *h;                 /* bf16 [batch, D]: in the embeddings, out the final-normed hidden */
} ti_step;

static inline float bf2f(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2bf(float f) { /* round to nearest even (NaN stays NaN) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __m512 bf16x16(const uint16_t *p) { /* 16 bf16 -> fp32, exactly */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __m512 bf16x16_mask(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
static inline __m512 round_bf16(__m512 v) { /* fp32 -> nearest-even bf16 -> fp32 */
    const __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}
static inline void store_bf16(uint16_t *p, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}
static inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u); }

/* exp(x) in fp32 (range reduction to r in [-ln2/2, ln2/2], degree-7 Taylor, scale by 2^n): ~2 ulp. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-103.972076416f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* y[m] = bf16(bf16(x[m] * rstd) * w) for each of M rows of D. */
static void rms_norm_rows(const uint16_t *x, const uint16_t *w, uint16_t *y, int64_t M, int64_t D, float eps) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *xr = x + m * D;
        __m512 ss = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 16) {
            const __m512 v = bf16x16_mask(xr + i, tail_mask(D - i));
            ss = _mm512_fmadd_ps(v, v, ss);
        }
        const __m512 rstd = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(ss) / (float)D + eps));
        for (int64_t i = 0; i < D; i += 16) {
            const __mmask16 k = tail_mask(D - i);
            const __m512 v = round_bf16(_mm512_mul_ps(bf16x16_mask(xr + i, k), rstd));
            store_bf16(y + m * D + i, _mm512_mul_ps(v, bf16x16_mask(w + i, k)), k);
        }
    }
}

/* h[i] = bf16(h[i] + x[i]) for i < n */
static void add_rows(uint16_t *h, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i);
        store_bf16(h + i, _mm512_add_ps(bf16x16_mask(h + i, k), bf16x16_mask(x + i, k)), k);
    }
}

/* act[b, j] = bf16(bf16(silu(g)) * u), g = gu[b, j], u = gu[b, I + j], for j in [j0, j1) (multiples of 16 but the end) */
static void silu_mul_row(const uint16_t *gu, uint16_t *act, int64_t I, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; j += 16) {
        const __mmask16 k = tail_mask(j1 - j);
        const __m512 g = bf16x16_mask(gu + j, k), u = bf16x16_mask(gu + I + j, k);
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        store_bf16(act + j, _mm512_mul_ps(round_bf16(s), u), k);
    }
}

/* One linear's share for thread t of nt: y[M, n] = x[M, k] @ W^T (bf16 out). For block formats the
 * activation was quantized into (qx, dx, sx) before the barrier that precedes this call. */
static void linear_part(const ti_linear *L, const uint16_t *x, const int8_t *qx, const float *dx, const float *sx,
                        uint16_t *y, int64_t M, int t, int nt) {
    if (L->kind == LIN_BF16 && amx_for(L->k)) { /* AMX: every row of a group in one pass, units = groups */
        const int64_t NG = (L->n + NBLK * 16 - 1) / (NBLK * 16);
        amx_groups(x, L->k, (const uint16_t *)L->w, L->bias, y, L->n, M, L->n, L->k, 0, NG * t / nt, NG * (t + 1) / nt);
    } else if (L->kind == LIN_BF16) { /* units = (group, tile of rows): balanced when groups are few and M > 4 */
        const int64_t NG = (L->n + NBLK * 16 - 1) / (NBLK * 16), tiles = (M + BF_TILE_ROWS - 1) / BF_TILE_ROWS;
        const int64_t U = NG * tiles, u0 = U * t / nt, u1 = U * (t + 1) / nt;
        const uint16_t *w = (const uint16_t *)L->w;
        for (int64_t u = u0; u < u1; u++) {
            const int64_t g = u / tiles, m0 = (u % tiles) * BF_TILE_ROWS, mr = M - m0;
            switch (mr >= BF_TILE_ROWS ? BF_TILE_ROWS : mr) {
            case 6: tile(6, x, L->k, w, L->bias, y, L->n, m0, g, L->n, L->k, 0); break;
            case 5: tile(5, x, L->k, w, L->bias, y, L->n, m0, g, L->n, L->k, 0); break;
            case 4: tile(4, x, L->k, w, L->bias, y, L->n, m0, g, L->n, L->k, 0); break;
            case 3: tile(3, x, L->k, w, L->bias, y, L->n, m0, g, L->n, L->k, 0); break;
            case 2: tile(2, x, L->k, w, L->bias, y, L->n, m0, g, L->n, L->k, 0); break;
            case 1: tile(1, x, L->k, w, L->bias, y, L->n, m0, g, L->n, L->k, 0); break;
            default: break;
            }
        }
    } else {
        const int64_t NG = (L->n + 15) / 16, glo = NG * t / nt, ghi = NG * (t + 1) / nt;
        if (L->kind == LIN_Q4)
            run_groups_4((const uint8_t *)L->w, qx, dx, sx, L->bias, y, L->n, M, L->n, L->k, 0, glo, ghi);
        else
            run_groups_8((const uint8_t *)L->w, qx, dx, sx, L->bias, y, L->n, M, L->n, L->k, 0, glo, ghi);
    }
}

static inline void quantize_for(const ti_linear *L, const uint16_t *x, int64_t M, int8_t *qx, float *dx, float *sx) {
    if (L->kind != LIN_BF16) quantize_rows(x, L->k, 0, M, L->k, qx, dx, sx);
}

/* Rotary of one head vector v[hd] (bf16, in place) with tables c, s [hd]. */
static void rope_head(uint16_t *v, const uint16_t *c, const uint16_t *s, int64_t hd) {
    float tmp[MAX_HD];
    const int64_t half = hd / 2;
    for (int64_t j = 0; j < hd; j++) tmp[j] = bf2f(v[j]);
    for (int64_t j = 0; j < hd; j++) {
        const float rot = tmp[j < half ? j + half : j - half];
        const float a = bf2f(f2bf(tmp[j] * bf2f(c[j])));
        v[j] = f2bf(a + rot * bf2f(s[j]));
    }
}

/* Where position p of sequence b lives in a [num_blocks, block_size, Hkv, hd] cache (element offset of head 0). */
static inline int64_t slot_offset(const ti_step *S, int64_t b, int64_t p) {
    const int64_t blk = S->block_tables[b * S->table_width + p / S->block_size];
    return (blk * S->block_size + p % S->block_size) * S->kv_heads * S->head_dim;
}

/* The 16 horizontal sums of d[0..15] as one vector (lane r = sum of d[r]'s lanes): a transpose-add tree. */
static inline __m512 hsum16(const __m512 *d) {
    __m512 t[8], u[4], v[2];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_ps(d[2 * i], d[2 * i + 1]));
    for (int j = 0; j < 4; j++)
        u[j] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * j], t[2 * j + 1], 0x44), _mm512_shuffle_ps(t[2 * j], t[2 * j + 1], 0xEE));
    for (int m = 0; m < 2; m++)
        v[m] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

/* Attention of the query heads of KV head g of sequence b (the `rep` = H / Hkv heads g*rep .. g*rep+rep-1, whose
 * rows are consecutive in q and out) over its seq_lens[b] cached positions -> out[rep, hd] (bf16). Walks the
 * sequence's blocks (a block's rows are consecutive: stride Hkv * hd) and reads each K and V row once for all
 * `rep` heads. NV = hd / 16 vectors, a compile-time constant at the specialized call sites. scores: scratch of
 * rep * seq_lens[b] floats. Two passes: scores and their max, then exp, sum and the weighted sum of V. */
static inline __attribute__((always_inline)) void attend_nv(const int NV, const ti_step *S, const ti_layer *Ly,
                                                            int64_t b, int64_t g, const uint16_t *q, uint16_t *out,
                                                            float *scores) {
    const int64_t hd = S->head_dim, len = S->seq_lens[b], bs = S->block_size, rep = S->heads / S->kv_heads;
    const int64_t row = S->kv_heads * hd, es = S->kv_fp32 ? 4 : 2;
    const int fp32 = (int)S->kv_fp32;
    const int32_t *bt = S->block_tables + b * S->table_width;
    for (int64_t r0 = 0; r0 < rep; r0 += MAX_REP) { /* heads in chunks of MAX_REP */
        const int64_t nr = rep - r0 < MAX_REP ? rep - r0 : MAX_REP;
        __m512 qv[MAX_REP][MAX_HD / 16], acc[MAX_REP][MAX_HD / 16], vmx[MAX_REP];
        __m512bh qb[MAX_REP][MAX_HD / 32]; /* bf16 cache: the query's raw bf16, 32 values a vector */
        const int NB = (NV + 1) / 2;
        const __mmask32 mlast = NV % 2 ? 0xFFFFu : ~0u;
        const __m512 scale = _mm512_set1_ps(S->scale);
        for (int64_t i = 0; i < nr; i++) {
            vmx[i] = _mm512_set1_ps(-INFINITY);
            for (int v = 0; v < NV; v++) {
                if (fp32) qv[i][v] = _mm512_mul_ps(bf16x16(q + (r0 + i) * hd + 16 * v), scale);
                acc[i][v] = _mm512_setzero_ps();
            }
            for (int v = 0; v < NB; v++)
                qb[i][v] = (__m512bh)_mm512_maskz_loadu_epi16(v == NB - 1 ? mlast : ~0u, q + (r0 + i) * hd + 32 * v);
        }
        for (int64_t p0 = 0, j = 0; p0 < len; p0 += bs, j++) {
            const char *base = (const char *)Ly->k_cache + ((int64_t)bt[j] * bs * row + g * hd) * es;
            const int64_t n = len - p0 < bs ? len - p0 : bs;
            for (int64_t c0 = 0; c0 < n; c0 += 16) { /* 16 rows at a time: 16 partial-sum vectors, one transpose-add */
                const int64_t nc = n - c0 < 16 ? n - c0 : 16;
                const __mmask16 k = tail_mask(nc);
                for (int64_t i = 0; i < nr; i++) {
                    __m512 d[16];
                    for (int64_t r = 0; r < 16; r++) {
                        const char *kr = base + (c0 + (r < nc ? r : 0)) * row * es; /* rows past nc: masked below */
                        if (fp32) {
                            d[r] = _mm512_mul_ps(qv[i][0], _mm512_loadu_ps((const float *)kr));
                            for (int v = 1; v < NV; v++)
                                d[r] = _mm512_fmadd_ps(qv[i][v], _mm512_loadu_ps((const float *)kr + 16 * v), d[r]);
                        } else { /* bf16 pairs straight from the cache: exact products, fp32 sums */
                            d[r] = _mm512_setzero_ps();
                            for (int v = 0; v < NB; v++) /* the last 32 values masked to 16 when hd % 32 == 16 */
                                d[r] = _mm512_dpbf16_ps(d[r], qb[i][v],
                                                        (__m512bh)_mm512_maskz_loadu_epi16(v == NB - 1 ? mlast : ~0u,
                                                                                           kr + 64 * v));
                        }
                    }
                    const __m512 sc = fp32 ? hsum16(d) : _mm512_mul_ps(hsum16(d), scale);
                    _mm512_mask_storeu_ps(scores + i * len + p0 + c0, k, sc);
                    vmx[i] = _mm512_mask_max_ps(vmx[i], k, vmx[i], sc);
                }
            }
        }
        float inv[MAX_REP];
        for (int64_t i = 0; i < nr; i++) {
            vmx[i] = _mm512_set1_ps(_mm512_reduce_max_ps(vmx[i]));
            __m512 vsum = _mm512_setzero_ps();
            float *si = scores + i * len;
            for (int64_t p = 0; p < len; p += 16) {
                const __mmask16 k = tail_mask(len - p);
                const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, si + p), vmx[i]));
                _mm512_mask_storeu_ps(si + p, k, e);
                vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(k, e));
            }
            inv[i] = 1.0f / _mm512_reduce_add_ps(vsum);
        }
        for (int64_t p0 = 0, j = 0; p0 < len; p0 += bs, j++) {
            const char *base = (const char *)Ly->v_cache + ((int64_t)bt[j] * bs * row + g * hd) * es;
            const int64_t n = len - p0 < bs ? len - p0 : bs;
            for (int64_t r = 0; r < n; r++) {
                const char *vr = base + r * row * es;
                __m512 vv[MAX_HD / 16];
                for (int v = 0; v < NV; v++)
                    vv[v] = fp32 ? _mm512_loadu_ps((const float *)vr + 16 * v) : bf16x16((const uint16_t *)vr + 16 * v);
                for (int64_t i = 0; i < nr; i++) {
                    const __m512 w = _mm512_set1_ps(scores[i * len + p0 + r]);
                    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(w, vv[v], acc[i][v]);
                }
            }
        }
        for (int64_t i = 0; i < nr; i++)
            for (int v = 0; v < NV; v++)
                store_bf16(out + (r0 + i) * hd + 16 * v, _mm512_mul_ps(acc[i][v], _mm512_set1_ps(inv[i])), 0xFFFF);
    }
}

static void attend(const ti_step *S, const ti_layer *Ly, int64_t b, int64_t g, const uint16_t *q, uint16_t *out,
                   float *scores) {
    switch (S->head_dim) { /* the common head sizes get their specializations */
    case 64: attend_nv(4, S, Ly, b, g, q, out, scores); break;
    case 128: attend_nv(8, S, Ly, b, g, q, out, scores); break;
    default: attend_nv((int)(S->head_dim / 16), S, Ly, b, g, q, out, scores); break;
    }
}

/* Runs the step (see the header). Returns 0, -1 when scratch cannot be allocated, -2 for a head_dim over 512 or not a multiple of 16. */
int ti_decode_step(const ti_step *S) {
    const int64_t B = S->batch, D = S->hidden, H = S->heads, Hkv = S->kv_heads, hd = S->head_dim, I = S->inter;
    const int64_t nqkv = (H + 2 * Hkv) * hd;
    if (hd > MAX_HD || hd % 16) return -2;
    int64_t maxlen = 1;
    for (int64_t b = 0; b < B; b++) maxlen = S->seq_lens[b] > maxlen ? S->seq_lens[b] : maxlen;
    const int64_t kmax = (D > H * hd ? D : H * hd) > I ? (D > H * hd ? D : H * hd) : I;
    const int nt = S->nthreads > 0 ? (int)S->nthreads : 1;
    /* scratch: xn [B, D], qkv [B, nqkv], att [B, H hd], tmp [B, D], gu [B, 2 I], act [B, I] (bf16); quantized
     * activation qx [B, kmax] int8 + dx, sx [B, kmax / 32] fp32; per-thread scores [nt, MAX_REP * maxlen] fp32 */
    const size_t n16 = (size_t)(B * (D + nqkv + H * hd + D + 2 * I + I));
    const size_t bytes = n16 * 2 + (size_t)(B * kmax) + 2 * sizeof(float) * (size_t)(B * (kmax / 32 + 1)) +
                         sizeof(float) * (size_t)(nt * MAX_REP * maxlen) + 256;
    char *mem = (char *)malloc(bytes);
    if (!mem) return -1;
    uint16_t *xn = (uint16_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    uint16_t *qkv = xn + B * D, *att = qkv + B * nqkv, *tmp = att + B * H * hd, *gu = tmp + B * D, *act = gu + B * 2 * I;
    float *dx = (float *)(((uintptr_t)(act + B * I) + 63) & ~(uintptr_t)63), *sx = dx + B * (kmax / 32 + 1);
    float *scores = sx + B * (kmax / 32 + 1);
    int8_t *qx = (int8_t *)(scores + nt * MAX_REP * maxlen);
    uint16_t *h = S->h;
    (void)amx_for(32); /* probe (and ask the kernel for) AMX here, on the calling thread, before the team starts */

#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        float *my_scores = scores + (int64_t)t * MAX_REP * maxlen;
        for (int64_t l = 0; l < S->num_layers; l++) {
            const ti_layer *Ly = S->layers + l;
#pragma omp single
            {
                if (l > 0) add_rows(h, tmp, B * D); /* residual += previous MLP output */
                rms_norm_rows(h, Ly->in_norm, xn, B, D, S->eps);
                quantize_for(&Ly->qkv, xn, B, qx, dx, sx);
            }
            linear_part(&Ly->qkv, xn, qx, dx, sx, qkv, B, t, n);
#pragma omp barrier
            /* rotary of every q and k head, then the new K/V rows into the cache */
#pragma omp for schedule(static)
            for (int64_t i = 0; i < B * (H + Hkv); i++) {
                const int64_t b = i / (H + Hkv), j = i % (H + Hkv);
                rope_head(qkv + b * nqkv + j * hd, S->cos + b * hd, S->sin + b * hd, hd);
                if (j >= H) {
                    const int64_t g = j - H, off = slot_offset(S, b, S->seq_lens[b] - 1) + g * hd;
                    const uint16_t *kr = qkv + b * nqkv + j * hd, *vr = qkv + b * nqkv + (H + Hkv + g) * hd;
                    for (int64_t e = 0; e < hd; e++) {
                        if (S->kv_fp32) {
                            ((float *)Ly->k_cache)[off + e] = bf2f(kr[e]);
                            ((float *)Ly->v_cache)[off + e] = bf2f(vr[e]);
                        } else {
                            ((uint16_t *)Ly->k_cache)[off + e] = kr[e];
                            ((uint16_t *)Ly->v_cache)[off + e] = vr[e];
                        }
                    }
                }
            } /* implicit barrier */
#pragma omp for schedule(static)
            for (int64_t i = 0; i < B * Hkv; i++) { /* (sequence, KV head): its H / Hkv query heads together */
                const int64_t b = i / Hkv, g = i % Hkv, q0 = g * (H / Hkv);
                attend(S, Ly, b, g, qkv + b * nqkv + q0 * hd, att + b * H * hd + q0 * hd, my_scores);
            } /* implicit barrier */
#pragma omp single
            quantize_for(&Ly->o, att, B, qx, dx, sx);
            linear_part(&Ly->o, att, qx, dx, sx, tmp, B, t, n);
#pragma omp barrier
#pragma omp single
            {
                add_rows(h, tmp, B * D); /* residual += attention output */
                rms_norm_rows(h, Ly->post_norm, xn, B, D, S->eps);
                quantize_for(&Ly->gate_up, xn, B, qx, dx, sx);
            }
            linear_part(&Ly->gate_up, xn, qx, dx, sx, gu, B, t, n);
#pragma omp barrier
            { /* SwiGLU: each thread a contiguous share of every row, in 16-wide chunks */
                const int64_t chunks = (I + 15) / 16, c0 = chunks * t / n, c1 = chunks * (t + 1) / n;
                const int64_t j0 = c0 * 16, j1 = c1 * 16 < I ? c1 * 16 : I;
                for (int64_t b = 0; b < B && j0 < j1; b++) silu_mul_row(gu + b * 2 * I, act + b * I, I, j0, j1);
            }
#pragma omp barrier
#pragma omp single
            quantize_for(&Ly->down, act, B, qx, dx, sx);
            linear_part(&Ly->down, act, qx, dx, sx, tmp, B, t, n);
#pragma omp barrier
        }
#pragma omp single
        {
            add_rows(h, tmp, B * D);
            rms_norm_rows(h, S->final_norm, xn, B, D, S->eps);
            memcpy(h, xn, (size_t)(B * D) * 2);
        }
    }
    free(mem);
    return 0;
}

/* Lets the loader check it got this ABI (bump with any change of the structs or the signature). */
int ti_decode_step_abi_version(void) { return 1; }
