/* How prefill_attention.c's many-row kernels bring a panel of KB keys out of the paged cache:
 * the rows' offsets, K transposed into a [D][KB] float panel (a float cache through 16 x 16
 * register blocks; a converted one widened row by row first), V as addresses in the cache or
 * rows widened into a [KB][D] scratch, and the next panel prefetched. Included once
 * prefill_attention.c has defined job_t, kv_t, KV_ROW and KB. */
#ifndef KVCLI_PREFILL_PANELS_H
#define KVCLI_PREFILL_PANELS_H

/* Row offsets in the cache of keys [k, k + nk) of `slots` for KV head offset at0; the panel's
 * tail past nk repeats the first key (read, never used). */
static inline void panel_at(const int64_t *slots, int64_t k, int64_t nk, int64_t stride,
                            int64_t at0, int64_t *at) {
    for (int64_t t = 0; t < KB; t++) at[t] = slots[k + (t < nk ? t : 0)] * stride + at0;
}

#if defined(KV_CONVERTED)
/* The row at `at` of a converted cache widened into dst [D]: x = u * scale + bias. */
static inline void widen_row(const kv_t *row, int64_t D, float *dst) {
    float sc, bias;
    kv_params(row, D, &sc, &bias);
    for (int64_t d = 0; d < D; d++) dst[d] = kv_f32(row[d]) * sc + bias;
}
#endif

#if defined(KV_INT8) && defined(KV8_INT_SCORES)
#define KV_VNNI 1 /* integer scores over the codes (kv_int8.h, prefill_scores.h) */
#endif

#if defined(__AVX512F__) && (!defined(KV_CONVERTED) || defined(KV_VNNI))
/* r[i] = column i of the 16 x 16 block whose rows r[] held: four rounds of shuffles. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    }
}
#endif

/* The panel's K rows (offsets at[t]) transposed into kt [D][KB]; vb [KB][D] is scratch. A float
 * cache with AVX-512 moves 16 x 16 blocks through registers: scalar stores of one float each
 * were most of a panel's cost for a decode sequence's own tail (3 query rows per panel). */
static inline void load_panel_keys(const job_t *j, int64_t D, const int64_t *at, float *kt,
                                   float *vb) {
#if defined(__AVX512F__) && !defined(KV_CONVERTED)
    if (D % 16 == 0) {
        for (int64_t h = 0; h < KB; h += 16)
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(j->k + at[h + i] + d0);
                transpose16(r);
                for (int i = 0; i < 16; i++) _mm512_storeu_ps(kt + (d0 + i) * KB + h, r[i]);
            }
        return;
    }
#endif
    for (int64_t t = 0; t < KB; t++) {
#if defined(KV_CONVERTED)
        float *row = vb + t * D; /* widened first (a vector loop), then transposed from L1 */
        widen_row(j->k + at[t], D, row);
#else
        const float *row = j->k + at[t];
        (void)vb;
#endif
        for (int64_t d = 0; d < D; d++) kt[d * KB + t] = row[d];
    }
}

/* The panel's V rows: their addresses in a float cache, or widened into vb [KB][D]. */
static inline void load_panel_values(const job_t *j, int64_t D, const int64_t *at, float *vb,
                                     const float **vrow) {
    for (int64_t t = 0; t < KB; t++) {
#if defined(KV_CONVERTED)
        widen_row(j->v + at[t], D, vb + t * D);
        vrow[t] = vb + t * D;
#else
        (void)D, (void)vb;
        vrow[t] = j->v + at[t];
#endif
    }
}

/* Fetches the K and V rows of the panel at key positions [k0, k0 + KB) of `slots` into the
 * cache while the current panel is worked on. The rows lie where the block table put them, so
 * no hardware prefetcher sees the pattern: without this, every row's first line missed the
 * cache one after another (the transposing loads took ~half of the shared-prefix decode). */
static inline void prefetch_panel(const job_t *j, const int64_t *slots, int64_t k0,
                                  int64_t k_hi, int64_t at0, int64_t stride, int64_t bytes) {
    const int64_t nk = k_hi - k0 < KB ? k_hi - k0 : KB;
    for (int64_t t = 0; t < nk; t++) {
        const char *kr = (const char *)(j->k + slots[k0 + t] * stride + at0);
        const char *vr = (const char *)(j->v + slots[k0 + t] * stride + at0);
        for (int64_t b = 0; b < bytes; b += 64) {
            __builtin_prefetch(kr + b, 0, 3);
            __builtin_prefetch(vr + b, 0, 3);
        }
    }
}
#endif
