/* The int8 cache's many-row attention steps on AMX tiles (prefill chunks; decode tokens sharing
 * a prefix): prefill_attention.c's score / softmax / value steps with the two products moved
 * from vector FMAs onto the tiles. Where the CPU has AMX-INT8 and AMX-BF16 (Sapphire Rapids and
 * later) a work item's 16 x group query rows are 1-3 tiles of 16:
 *  - scores: one `tdpbsud` multiplies 16 rows' int8 codes (kv_int8.h's quantize_query) by 16
 *    keys' uint8 codes over 64 dimensions; the codes are load_codes' panel, already the B tile's
 *    layout (4-byte groups, one key per lane). The int32 sums take the VNNI path's float work in
 *    its order, so the scores equal the AVX512-VNNI kernel's bit for bit;
 *  - values: out = sum_t p_t (u_t s_t + b_t) = sum_t (p_t s_t) (u_t - 128) + sum_t p_t
 *    (b_t + 128 s_t), so the tiles multiply the probabilities times each value's scale by the
 *    centred value codes, exact in bfloat16, with float32 sums (`tdpbf16ps`); the bias term
 *    stays float32. p_t s_t is split into two bfloat16s, x = hi + lo (16 bits of mantissa, relative
 *    error below 2^-16; one bfloat16 alone, 2^-8, added a third to the int8 cache's own error
 *    on random data), each multiplied by the same code tile.
 * The softmax between them is the vector kernel's (softmax_step). Items of fewer than 16 rows
 * (a shared-prefix sequence's own tail) take the vector kernel. Included by prefill_attention.c
 * after its steps and ATTEND_KEYS functions. */
#ifndef KVCLI_PREFILL_AMX_H
#define KVCLI_PREFILL_AMX_H

#if defined(KV_VNNI) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__linux__)
#include "amx_tiles.h"

#define AR 16 /* rows of a tile */

typedef struct { /* one thread's tile buffers (amx_start) */
    uint16_t *p;    /* [2][rows][SP] bfloat16: the step's p_t * s_t as hi, then lo */
    uint16_t *vp;   /* [D / 16][SP / 2][32] bfloat16: value codes, key pairs interleaved */
    float *vs, *vb; /* [SP]: the step's values' scales and biases */
    float *corr;    /* [rows]: the bias term, sum_t p_t (b_t + 128 s_t) over the step */
    float *c;       /* [AR][D]: a row tile's product */
    int32_t *ci;    /* [AR][16]: a score tile */
    int64_t rows;   /* the thread's rows: qt x group */
} amx_t;

/* -1: not yet asked; 0: off (not granted, or kvcli_attention_amx(0)); 1: on. */
static int amx_state = -1;

/* qint.c's request for the tiles' state (Linux hands it out only on request), the one place. */
int64_t kvcli_qint_amx_ready(void);

/* want 1: on where the kernel may use tiles; 0: off (the vector kernel); -1: ask. Returns
 * whether the int8 cache's many-row kernel runs on AMX tiles now. */
int64_t KV_NAME(kvcli_attention_amx)(int64_t want) {
    if (want >= 0 || amx_state < 0) amx_state = want != 0 && kvcli_qint_amx_ready();
    return amx_state;
}

static void amx_free(amx_t *a) {
    free(a->p), free(a->vp), free(a->vs), free(a->vb), free(a->corr), free(a->c), free(a->ci);
    free(a);
}

static void amx_end(void *buf) {
    if (!buf) return;
    _tile_release();
    amx_free(buf);
}

/* Query positions per prefill item: twice the vector kernels' where the tiles run the item.
 * Each item converts its context's key and value panels once for all its rows, so 96 rows
 * (SmolLM2's group of 3) halve that work against 48; one layer's int8 prefill (prompts of 440,
 * 440 and 144 tokens, Xeon with AMX) 2.69 -> 2.48-2.54 ms on one thread, 1.46 -> 1.36-1.42 on
 * two. Shared-prefix decode items keep QT tokens: fewer items would leave a core idle. */
static int64_t prefill_positions(int64_t D) {
    return KV_NAME(kvcli_attention_amx)(-1) == 1 && kv8_int_scores(D) ? QT_AMX : QT;
}

/* The thread's buffers with its tiles configured (16 rows x 64 bytes each), or NULL: the vector
 * kernels (AMX off, a head size without integer scores, no memory). */
static void *amx_start(int64_t D, int64_t rows) {
    if (KV_NAME(kvcli_attention_amx)(-1) != 1 || !kv8_int_scores(D)) return NULL;
    amx_t *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->p = aligned_alloc(64, sizeof(uint16_t) * 2 * rows * SP);
    a->rows = rows;
    a->vp = aligned_alloc(64, sizeof(uint16_t) * SP * D);
    a->vs = aligned_alloc(64, sizeof(float) * SP), a->vb = aligned_alloc(64, sizeof(float) * SP);
    a->corr = malloc(sizeof(float) * rows);
    a->c = aligned_alloc(64, sizeof(float) * AR * D);
    a->ci = aligned_alloc(64, sizeof(int32_t) * AR * 16);
    if (!a->p || !a->vp || !a->vs || !a->vb || !a->corr || !a->c || !a->ci) {
        amx_free(a);
        return NULL;
    }
    amx_tiles_16x64(); /* AR rows of 64 bytes each */
    return a;
}

/* Tiles: 0-3 a row tile's value products (16 dimensions each), 4 query codes or the hi
 * bfloat16 probabilities (A), 5 key codes or interleaved value codes (B), 6 a score tile or the
 * lo probabilities (A). */

/* Scores of the m rows (codes qq) against the step's keys [k0, k0 + n), scaled, into sc. */
AI void amx_scores(const job_t *j, int64_t D, int64_t g, const int64_t *slots, int64_t k0,
                   int64_t n, int64_t k_hi, int64_t m, const qrows_t *qq, float *kt, float *sc,
                   amx_t *a) {
    const int64_t stride = j->Hkv * KV_ROW(D), at0 = g * KV_ROW(D), tiles = (m + AR - 1) / AR;
    for (int64_t p0 = 0; p0 < n; p0 += KB) {
        const int64_t k = k0 + p0, nk = n - p0 < KB ? n - p0 : KB;
        if (k + KB < k_hi) prefetch_panel(j, slots, k + KB, k_hi, at0, stride, KV_ROW(D));
        int64_t at[KB];
        float sk[KB], bk[KB];
        panel_at(slots, k, nk, stride, at0, at);
        load_codes(j->k, D, at, (__m512i *)kt, sk, bk);
        for (int64_t rt = 0; rt < tiles; rt++)
            for (int h = 0; h < 2; h++) {
                _tile_zero(6);
                for (int64_t d0 = 0; d0 < D; d0 += 64) {
                    _tile_loadd(4, qq->c + rt * AR * D + d0, D);
                    _tile_loadd(5, (const char *)kt + (d0 / 2 + h) * 64, 128);
                    _tile_dpbsud(6, 4, 5);
                }
                _tile_stored(6, a->ci, 64);
                const __m512 skv = _mm512_loadu_ps(sk + 16 * h), bkv = _mm512_loadu_ps(bk + 16 * h);
                for (int64_t r = 0, i = rt * AR; r < AR && i < m; r++, i++) {
                    const __m512 off = _mm512_mul_ps(bkv, _mm512_set1_ps((float)qq->sum[i]));
                    const __m512i dots = _mm512_load_si512(a->ci + 16 * r);
                    const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), skv, off);
                    const __m512 raw = _mm512_mul_ps(dot, _mm512_set1_ps(qq->s[i]));
                    _mm512_storeu_ps(sc + i * SP + p0 + 16 * h,
                                     _mm512_mul_ps(raw, _mm512_set1_ps(j->scale)));
                }
            }
    }
}

/* The step's value rows as B tiles: codes less 128 widened to bfloat16 (float32's upper half:
 * exact for integers of magnitude up to 128; centred, the products p_t s_t (u_t - 128) and so
 * their rounding are half the size), keys 2 kp and 2 kp + 1 interleaved per dimension; and
 * their parameters, the bias taking the 128 s_t back. */
AI void amx_pack_values(const job_t *j, int64_t D, int64_t g, const int64_t *slots, int64_t k0,
                        int64_t n, amx_t *a) {
    const int64_t stride = j->Hkv * KV_ROW(D), at0 = g * KV_ROW(D);
    const __m512i c128 = _mm512_set1_epi32(128);
    for (int64_t p0 = 0; p0 < n; p0 += KB) {
        const int64_t nk = n - p0 < KB ? n - p0 : KB;
        int64_t at[KB];
        panel_at(slots, k0 + p0, nk, stride, at0, at);
        for (int64_t t = 0; t < KB; t += 2) {
            const uint8_t *ua = j->v + at[t], *ub = j->v + at[t + 1];
            for (int e = 0; e < 2; e++) {
                float *vs = &a->vs[p0 + t + e], *vb = &a->vb[p0 + t + e];
                kv8_params(e ? ub : ua, D, vs, vb);
                *vb += 128.0f * *vs; /* the codes' side takes u - 128 */
            }
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
                const __m512i fa = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_sub_epi32(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ua + d0))), c128)));
                const __m512i fb = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_sub_epi32(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ub + d0))), c128)));
                const __m512i pair = _mm512_or_si512(fb, _mm512_srli_epi32(fa, 16));
                _mm512_store_si512(a->vp + ((d0 / 16) * (SP / 2) + (p0 + t) / 2) * 32, pair);
            }
        }
    }
}

/* x as two bfloat16s, hi + lo, 32 floats (lo16, hi16) at a time. */
AI void amx_split(__m512 lo16, __m512 hi16, uint16_t *hi, uint16_t *lo) {
    const __m512bh h = _mm512_cvtne2ps_pbh(hi16, lo16);
    const __m512i w = (__m512i)h;
    const __m512 back_lo = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)), 16));
    const __m512 back_hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1)), 16));
    _mm512_store_si512(hi, w);
    _mm512_store_si512(lo, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(hi16, back_hi),
                                                         _mm512_sub_ps(lo16, back_lo)));
}

/* Row i's probabilities times the values' scales as hi + lo bfloat16s (zero on panels it does
 * not read), and the bias term of its output (vb already holds b_t + 128 s_t). */
AI void amx_pack_row(int64_t i, int64_t m, int64_t n, const int64_t *span, const float *sc,
                     amx_t *a) {
    uint16_t *hi = a->p + i * SP, *lo = hi + a->rows * SP;
    __m512 corr = _mm512_setzero_ps();
    for (int64_t p0 = 0; p0 < n; p0 += KB) {
        const int64_t nk = n - p0 < KB ? n - p0 : KB;
        if (i < m && reads(span, i, p0, nk)) {
            const float *pi = sc + i * SP + p0;
            const __m512 p_lo = _mm512_load_ps(pi), p_hi = _mm512_load_ps(pi + 16);
            corr = _mm512_fmadd_ps(p_lo, _mm512_load_ps(a->vb + p0), corr);
            corr = _mm512_fmadd_ps(p_hi, _mm512_load_ps(a->vb + p0 + 16), corr);
            amx_split(_mm512_mul_ps(p_lo, _mm512_load_ps(a->vs + p0)),
                      _mm512_mul_ps(p_hi, _mm512_load_ps(a->vs + p0 + 16)), hi + p0, lo + p0);
        } else {
            _mm512_store_si512(hi + p0, _mm512_setzero_si512());
            _mm512_store_si512(lo + p0, _mm512_setzero_si512());
        }
    }
    a->corr[i] = _mm512_reduce_add_ps(corr);
}

/* The step's values accumulated into the rows' outputs o [m][D] (already rescaled by
 * softmax_step), 64 dimensions of one row tile at a time in tiles 0-3. */
AI void amx_values(const job_t *j, int64_t D, int64_t g, const int64_t *slots, int64_t k0,
                   int64_t n, int64_t m, const int64_t *span, const float *sc, float *o,
                   amx_t *a) {
    const int64_t tiles = (m + AR - 1) / AR, panels = (n + KB - 1) / KB;
    amx_pack_values(j, D, g, slots, k0, n, a);
    for (int64_t i = 0; i < tiles * AR; i++) amx_pack_row(i, m, n, span, sc, a);
    for (int64_t rt = 0; rt < tiles; rt++) {
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t p = 0; p < panels; p++) {
                const uint16_t *vp = a->vp + ((d0 / 16) * (SP / 2) + p * 16) * 32;
                _tile_loadd(4, a->p + rt * AR * SP + p * KB, SP * 2);
                _tile_loadd(6, a->p + (a->rows + rt * AR) * SP + p * KB, SP * 2);
                _tile_loadd(5, vp, 64);
                _tile_dpbf16ps(0, 4, 5);
                _tile_dpbf16ps(0, 6, 5);
                _tile_loadd(5, vp + SP / 2 * 32, 64);
                _tile_dpbf16ps(1, 4, 5);
                _tile_dpbf16ps(1, 6, 5);
                _tile_loadd(5, vp + SP * 32, 64);
                _tile_dpbf16ps(2, 4, 5);
                _tile_dpbf16ps(2, 6, 5);
                _tile_loadd(5, vp + SP / 2 * 3 * 32, 64);
                _tile_dpbf16ps(3, 4, 5);
                _tile_dpbf16ps(3, 6, 5);
            }
            _tile_stored(0, a->c + d0, D * 4);
            _tile_stored(1, a->c + d0 + 16, D * 4);
            _tile_stored(2, a->c + d0 + 32, D * 4);
            _tile_stored(3, a->c + d0 + 48, D * 4);
        }
        for (int64_t r = 0, i = rt * AR; r < AR && i < m; r++, i++) {
            const __m512 corr = _mm512_set1_ps(a->corr[i]);
            for (int64_t d = 0; d < D; d += 16) {
                const __m512 sum = _mm512_add_ps(_mm512_load_ps(a->c + r * D + d), corr);
                _mm512_storeu_ps(o + i * D + d, _mm512_add_ps(_mm512_loadu_ps(o + i * D + d), sum));
            }
        }
    }
}

/* ATTEND_KEYS's contract on the tiles; fewer than AR rows take the vector kernel. */
static void keys_amx(const job_t *j, int64_t g, const int64_t *slots, int64_t k_lo, int64_t k_hi,
                     int64_t m, const float *const *q, const qrows_t *qq, const int64_t *pos,
                     float *mx, float *l, float *o, const bufs_t *b) {
    const int64_t D = j->D;
    if (m < AR) {
        vector_keys(D)(j, g, slots, k_lo, k_hi, m, q, qq, pos, mx, l, o, b);
        return;
    }
    if (k_lo < k_hi)
        prefetch_panel(j, slots, k_lo, k_hi, g * KV_ROW(D), j->Hkv * KV_ROW(D), KV_ROW(D));
    for (int64_t k0 = k_lo; k0 < k_hi; k0 += SP) {
        const int64_t n = k_hi - k0 < SP ? k_hi - k0 : SP;
        amx_scores(j, D, g, slots, k0, n, k_hi, m, qq, b->kt, b->sc, b->amx);
        softmax_step(D, k0, n, m, pos, j->window, b->sc, b->span, mx, l, o);
        amx_values(j, D, g, slots, k0, n, m, b->span, b->sc, o, b->amx);
    }
}
#undef AR
#else
int64_t KV_NAME(kvcli_attention_amx)(int64_t want) {
    (void)want;
    return 0;
}
static inline void *amx_start(int64_t D, int64_t rows) {
    (void)D, (void)rows;
    return NULL;
}
static inline void amx_end(void *buf) { (void)buf; }
static inline int64_t prefill_positions(int64_t D) {
    (void)D;
    return QT;
}
#define keys_amx keys_any /* never chosen: amx_start gives NULL */
#endif
#endif
