/* One instruction-set variant of the integer-activation matmul (qint.c includes this file once
 * per variant, each under its own `#pragma GCC target`, with QV naming the variant):
 *   QV 0  AVX512-VNNI: 16 channels per register, vpdpbusd (u8 x s8 -> 4 products summed in i32)
 *   QV 1  AVX-VNNI:    8 channels per register (two per 16-channel group), VEX vpdpbusd
 *   QV 2  AVX2:        vpmaddubsw (u8 x s8 -> pairs in saturating i16), summed in i16 over as
 *                      many k-groups as cannot overflow (run16), then vpmaddwd by ones; the
 *                      nibble types through qint_nibble_avx2.h's tile
 * The packed layout (qint_layout.h, qint_pack.c) is the same for all three, so one repack serves
 * every variant.
 * A register tile is QMR rows x QNV channel vectors: AVX-512 takes 4 rows x 2 groups (16 sums
 * and their 16 accumulators; 6 x 2 spilled, ~5% slower on Zen 4), AVX-VNNI 4 rows x one half
 * group, AVX2 6 rows x one half group (2-6% faster than 4 on Zen 3: the weights' vector and its
 * unsigned form serve 6 rows; its sums live only within a block, each run's i16 sums widened
 * into them as the run ends). Q6_K's second set of sums (two scales per block) adds QMR x QNV
 * registers: 27 of AVX-512's 32.
 */

#if QV == 0
#define QN(name) name##_vnni512
#define CH 16
#define QMR 4
#define QNV TILE_GROUPS_512
#define qvi __m512i
#define qvf __m512
#define LOADW(p) _mm512_loadu_si512((const void *)(p))
#define SPLAT8(v) _mm512_set1_epi8((char)(v))
#define AND(a, b) _mm512_and_si512(a, b)
#define SRL16(a, n) _mm512_srli_epi16(a, n)
#define BCAST32(p) _mm512_set1_epi32(load32(p))
#define SETI(v) _mm512_set1_epi32(v)
#define ZEROI() _mm512_setzero_si512()
#define ZEROF() _mm512_setzero_ps()
#define TOF(v) _mm512_cvtepi32_ps(v)
#define SETF(v) _mm512_set1_ps(v)
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define MULF(a, b) _mm512_mul_ps(a, b)
#define HALFS(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOADF(p) _mm512_loadu_ps((const float *)(p))
#define STOREF(p, v) _mm512_storeu_ps(p, v)
#else
#define CH 8
#if QV == 2
#define QMR 6
#else
#define QMR 4
#endif
#define QNV 1
#define qvi __m256i
#define qvf __m256
#define LOADW(p) _mm256_loadu_si256((const __m256i *)(p))
#define SPLAT8(v) _mm256_set1_epi8((char)(v))
#define AND(a, b) _mm256_and_si256(a, b)
#define SRL16(a, n) _mm256_srli_epi16(a, n)
#define BCAST32(p) _mm256_set1_epi32(load32(p))
#define SETI(v) _mm256_set1_epi32(v)
#define ZEROI() _mm256_setzero_si256()
#define ZEROF() _mm256_setzero_ps()
#define TOF(v) _mm256_cvtepi32_ps(v)
#define SETF(v) _mm256_set1_ps(v)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define MULF(a, b) _mm256_mul_ps(a, b)
#define HALFS(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LOADF(p) _mm256_loadu_ps((const float *)(p))
#define STOREF(p, v) _mm256_storeu_ps(p, v)
#if QV == 1
#define QN(name) name##_avxvnni
#else
#define QN(name) name##_avx2
#endif
#endif
#define HALVES (GROUP / CH)
#define AI inline __attribute__((always_inline))

/* Unsigned weight bytes of k-group kg (k = 4 kg .. 4 kg + 3 of the block) for the channels of
 * half h: Q4 nibbles (group kg in the low nibbles of vector kg % 4, kg + 4 in the high ones),
 * or the byte types' offset bytes (signed value + 128). */
static AI qvi QN(wbytes)(const int type, const uint8_t *qs, const int h, const int kg) {
    if (is_byte(type)) return LOADW(qs + kg * 64 + h * CH * 4);
    const qvi v = LOADW(qs + (kg & 3) * 64 + h * CH * 4);
    return AND(kg < 4 ? v : SRL16(v, 4), SPLAT8(15));
}

#if QV == 2
/* AVX2 sums vpmaddubsw's i16 pairs over this many k-groups before widening them to i32
 * (vpmaddwd by ones), as many as provably fit 32767: Q4 nibbles 8 x 2 * 15 * 127 = 30480,
 * Q5_K (0..31) and Q6_K (|w| <= 32) 4 x 2 * 32 * 127 = 32512, I8 and Q8_0 one (2 * 127 * 127). */
static AI int QN(run16)(const int type) {
    if (!is_byte(type)) return 8;
    return type == Q5_K || type == Q6_K ? 4 : 1;
}

/* The unsigned operand of vpmaddubsw for weight bytes w (once per tile and k-group, shared by
 * its rows): the nibbles; Q5_K's q (w - 128, never negative); else |w - 128|, whose sign
 * pairs() moves onto the activations. *ws gets the signed weight (byte types). */
static AI qvi QN(unsigned_w)(const int type, const qvi w, qvi *ws) {
    if (!is_byte(type)) return w;
    *ws = _mm256_xor_si256(w, SPLAT8(0x80));
    return type == Q5_K ? *ws : _mm256_abs_epi8(*ws);
}

/* The i16 pair sums of w * x for the 4 activation bytes broadcast in xb: |w| * sign(x, w) for
 * the signed weights (exact for a weight of -128 too, |x| <= 127 as the quantizer rounds). */
static AI qvi QN(pairs)(const int type, const qvi uw, const qvi ws, const qvi xb) {
    if (!is_byte(type) || type == Q5_K) return _mm256_maddubs_epi16(uw, xb);
    return _mm256_maddubs_epi16(uw, _mm256_sign_epi8(xb, ws));
}
#else
/* acc += per-channel sum of 4 weight bytes x the 4 activation bytes broadcast in xb. */
static AI qvi QN(step)(qvi acc, qvi w, qvi xb) {
#if QV == 0
    return _mm512_dpbusd_epi32(acc, w, xb);
#else
    return _mm256_dpbusd_avx_epi32(acc, w, xb);
#endif
}
#endif

/* The starting value of a block's integer sums: -off * sum(qx) (qint.c's o, 0 on AVX2's byte
 * paths), none for the nibbles with a min term. */
static AI qvi QN(start)(const int type, const int32_t *o) {
    if (nibble_min(type) || (QV == 2 && is_byte(type))) return ZEROI(); /* qint.c's weight_offset */
    return SETI(*o);
}

/* Block-level scale vectors of the channels of half h: the first (d; none for I8, whose
 * channel scale is applied at the end) and, for two_scales types, the second. */
static AI qvf QN(scale)(const int type, const uint8_t *sc, const int h, const int second) {
    if (float_scales(type)) return LOADF(sc + (second ? GROUP * 4 : 0) + h * CH * 4);
    return HALFS(sc + (second ? GROUP * 2 : 0) + h * CH * 2);
}

/* One block's integer sums of rows [0, mr) (activations x, row stride K; their o entries at o,
 * row stride ostride) with nv channel vectors of weights (half h of the tile at w, the next
 * group gs bytes on): sum, and for Q6_K sum (k-groups 0-3) and sum2 (k-groups 4-7). */
static AI void QN(block_sums)(const int type, const uint8_t *w, const int64_t gs, const int h,
                              const int8_t *x, const int64_t K, const int32_t *o,
                              const int64_t ostride, const int mr, const int nv,
                              qvi sum[QMR][QNV], qvi sum2[QMR][QNV]) {
#if QV == 2
    qvi part[QMR][QNV]; /* the i16 pair sums of the current run of k-groups */
#else
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nv; j++) {
            sum[r][j] = QN(start)(type, o + r * ostride);
            if (type == Q6_K) sum2[r][j] = QN(start)(type, o + r * ostride + 1);
        }
#endif
#pragma GCC unroll 8
    for (int kg = 0; kg < 8; kg++) {
        qvi wv[QNV], uv[QNV];
        for (int j = 0; j < nv; j++) wv[j] = QN(wbytes)(type, w + j * gs, h, kg);
#if QV == 2
        for (int j = 0; j < nv; j++) uv[j] = QN(unsigned_w)(type, wv[j], &wv[j]);
#else
        (void)uv;
#endif
        for (int r = 0; r < mr; r++) {
            const qvi xb = BCAST32(x + r * K + kg * 4);
            for (int j = 0; j < nv; j++) {
                const int second = type == Q6_K && kg >= 4;
                qvi *s = second ? &sum2[r][j] : &sum[r][j];
#if QV == 2
                const int run = QN(run16)(type), at = kg - 4 * second;
                const qvi p = QN(pairs)(type, uv[j], wv[j], xb);
                part[r][j] = at % run ? _mm256_add_epi16(part[r][j], p) : p;
                __asm__("" : "+x"(part[r][j])); /* as nibble_tile's: no tree of spilled sums */
                if (at % run != run - 1) continue;
                /* widened; the first run's sums start at the block's start value */
                const qvi wide = _mm256_madd_epi16(part[r][j], _mm256_set1_epi16(1));
                const qvi from = at == run - 1 ? QN(start)(type, o + r * ostride + second) : *s;
                *s = _mm256_add_epi32(from, wide);
                __asm__("" : "+x"(*s));
#else
                *s = QN(step)(*s, wv[j], xb);
#endif
            }
        }
    }
}

/* Row r's outputs of channels [n0, n0 + CH), v (with the bias where the vector is whole): the
 * channels past N of the last group are dropped, their bias added lane by lane. */
static AI void QN(store_row)(const qint_args *a, const int64_t r, const int64_t n0, const qvf v) {
    float *y = a->y + r * a->N + n0;
    if (n0 + CH <= a->N) {
        STOREF(y, v);
        return;
    }
    float out[CH];
    STOREF(out, v);
    for (int c = 0; n0 + c < a->N; c++) y[c] = out[c] + (a->bias ? a->bias[n0 + c] : 0.0f);
}

/* Rows [i, i + mr) x nv channel vectors from group g (AVX-512: groups g, g + 1; else half h of
 * group g), over the whole K. Per 32-value block the integer sums of each row start at
 * -off * sum(qx) (qint.c's o), so the float work per block is one conversion and
 *   I8:                acc += dx * sum              (dw, the channel's, is applied at the end)
 *   Q4_0, Q8_0:        acc += dw * (dx * sum)
 *   Q4_1, Q4_K, Q5_K:  acc += dw * (dx * sum) + m * (dx * sum(qx))
 *   Q6_K:              acc += dw * (dx * sum) + dw2 * (dx * sum2)   (sum2: k-groups 4-7). */
static AI void QN(tile)(const qint_args *a, const int type, const int64_t i, const int mr,
                        const int nv, const int64_t g, const int h) {
    const int64_t K = a->K, kb = K / 32, tb = tile_bytes(type), qsb = qs_bytes(type);
    const int64_t gs = kb * tb; /* bytes per group */
    const int os = type == Q6_K ? 2 : 1; /* o entries per block */
    const uint8_t *w = a->w + g * gs;
    const int8_t *x = a->q + i * K;
    const float *dx = a->d + i * kb, *sx = a->s + i * kb;
    const int32_t *ox = a->o + i * kb * os;
    qvf acc[QMR][QNV];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nv; j++) acc[r][j] = ZEROF();
    for (int64_t b = 0; b < kb; b++, w += tb, x += 32) {
        qvi isum[QMR][QNV], isum2[QMR][QNV];
        QN(block_sums)(type, w, gs, h, x, K, ox + b * os, kb * os, mr, nv, isum, isum2);
        for (int j = 0; j < nv; j++) {
            const uint8_t *sc = w + j * gs + qsb;
            const qvf dw = type == I8 ? SETF(1.0f) : QN(scale)(type, sc, h, 0);
            const qvf mw = two_scales(type) ? QN(scale)(type, sc, h, 1) : ZEROF();
            for (int r = 0; r < mr; r++) {
                const int64_t at = r * kb + b;
                const qvf sum = TOF(isum[r][j]);
                if (type == I8) {
                    acc[r][j] = FMA(sum, SETF(dx[at]), acc[r][j]);
                    continue;
                }
                acc[r][j] = FMA(MULF(sum, SETF(dx[at])), dw, acc[r][j]);
                if (type == Q6_K)
                    acc[r][j] = FMA(MULF(TOF(isum2[r][j]), SETF(dx[at])), mw, acc[r][j]);
                else if (two_scales(type))
                    acc[r][j] = FMA(mw, SETF(sx[at]), acc[r][j]);
            }
        }
    }
    for (int j = 0; j < nv; j++) {
        const int64_t n0 = (g + j) * GROUP + h * CH;
        const int full = n0 + CH <= a->N;
        const qvf dw = type == I8 ? LOADF(a->w + (g + j) * gs + qsb + h * CH * 4) : SETF(1.0f);
        const qvf bias = a->bias && full ? LOADF(a->bias + n0) : ZEROF();
        for (int r = 0; r < mr; r++) QN(store_row)(a, i + r, n0, FMA(acc[r][j], dw, bias));
    }
}

#if QV == 2
#include "qint_nibble_avx2.h" /* nibble_tile */
#endif

/* Rows [i, i + mr) x groups [g0, g1), tile by tile (AVX-512: the last one may be a lone group). */
static AI void QN(span)(const qint_args *a, const int type, const int64_t i, const int mr,
                        const int64_t g0, const int64_t g1) {
    for (int64_t g = g0; g < g1; g += QNV)
        for (int h = 0; h < HALVES; h++) {
#if QV == 2
            if (!is_byte(type)) {
                QN(nibble_tile)(a, type, i, mr, g, h);
                continue;
            }
#endif
            if (g + QNV > g1)
                QN(tile)(a, type, i, mr, 1, g, h);
            else
                QN(tile)(a, type, i, mr, QNV, g, h);
        }
}

#define QSPAN(MRC) QN(span)(a, type, i, MRC, g0, g1)

/* Rows [r0, r1) x groups [g0, g1), row tile by row tile: a tile's quantized rows stay in L1
 * while they meet every group of the chunk. */
static AI void QN(rows)(const qint_args *a, const int type, const int64_t r0, const int64_t r1,
                        const int64_t g0, const int64_t g1) {
    int64_t i = r0;
    for (; i + QMR <= r1; i += QMR) QSPAN(QMR);
    switch (r1 - i) {
    case 1: QSPAN(1); break;
    case 2: QSPAN(2); break;
    case 3: QSPAN(3); break;
#if QMR > 4
    case 4: QSPAN(4); break;
    case 5: QSPAN(5); break;
#endif
    default: break;
    }
}
#undef QSPAN

/* Groups [g0, g1) of the thread's share: row panel by row panel (its quantized rows stay in L2),
 * and within one, chunk of groups by chunk (its packed weights stay in L1 / L2 while every row
 * tile of the panel meets them). */
static AI void QN(part)(const qint_args *a, const int type, const int64_t t, const int64_t n) {
    const int64_t tiles = ((a->N + GROUP - 1) / GROUP + QNV - 1) / QNV;
    const int64_t g0 = tiles * t / n * QNV, g1 = tiles * (t + 1) / n * QNV;
    const int64_t groups = (a->N + GROUP - 1) / GROUP, end = g1 < groups ? g1 : groups;
    const int64_t panel = panel_rows(a->K, QMR), chunk = chunk_groups(type, a->K, QNV);
    for (int64_t r0 = 0; r0 < a->M; r0 += panel) {
        const int64_t r1 = r0 + panel < a->M ? r0 + panel : a->M;
        for (int64_t g = g0; g < end; g += chunk) QN(rows)(a, type, r0, r1, g, g + chunk < end ? g + chunk : end);
    }
}

#define QPART(name, TYPE)                                                                       \
    static void QN(name)(const void *a, int64_t t, int64_t n) {                                 \
        QN(part)((const qint_args *)a, TYPE, t, n);                                             \
    }
QPART(part_q4_0, Q4_0)
QPART(part_q4_1, Q4_1)
QPART(part_q8_0, Q8_0)
QPART(part_i8, I8)
QPART(part_q4_k, Q4_K)
QPART(part_q5_k, Q5_K)
QPART(part_q6_k, Q6_K)
#undef QPART

#undef QN
#undef qvi
#undef qvf
#undef CH
#undef QMR
#undef QNV
#undef LOADW
#undef SPLAT8
#undef AND
#undef SRL16
#undef BCAST32
#undef SETI
#undef ZEROI
#undef ZEROF
#undef TOF
#undef SETF
#undef FMA
#undef MULF
#undef HALFS
#undef LOADF
#undef STOREF
#undef HALVES
#undef AI
