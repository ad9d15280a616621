/* One instruction-set variant of the integer-activation matmul (qint.c includes this file once
 * per variant, each under its own `#pragma GCC target`, with QV naming the variant):
 *   QV 0  AVX512-VNNI: 16 channels per register, vpdpbusd (u8 x s8 -> 4 products summed in i32)
 *   QV 1  AVX-VNNI:    8 channels per register (two per 16-channel group), VEX vpdpbusd
 *   QV 2  AVX2:        vpmaddubsw (u8 x s8 -> pairs in saturating i16) then vpmaddwd by ones
 * The packed layout (qint.c) is the same for all three, so one repack serves every variant.
 */

#if QV == 0
#define QN(name) name##_vnni512
#define CH 16
#define QMR 8
#define qvi __m512i
#define qvf __m512
#define LOADW(p) _mm512_loadu_si512((const void *)(p))
#define SPLAT8(v) _mm512_set1_epi8((char)(v))
#define AND(a, b) _mm512_and_si512(a, b)
#define SRL16(a, n) _mm512_srli_epi16(a, n)
#define BCAST32(p) _mm512_set1_epi32(load32(p))
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
#define QMR 4
#define qvi __m256i
#define qvf __m256
#define LOADW(p) _mm256_loadu_si256((const __m256i *)(p))
#define SPLAT8(v) _mm256_set1_epi8((char)(v))
#define AND(a, b) _mm256_and_si256(a, b)
#define SRL16(a, n) _mm256_srli_epi16(a, n)
#define BCAST32(p) _mm256_set1_epi32(load32(p))
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

/* Unsigned weight bytes of k-group kg (k = 4 kg .. 4 kg + 3 of the block) for the channels of
 * half h: Q4 nibbles (group kg in the low nibbles of vector kg % 4, kg + 4 in the high ones),
 * or Q8_0's / I8's offset bytes (w + 128). */
static inline __attribute__((always_inline)) qvi QN(wbytes)(const int type, const uint8_t *qs,
                                                            const int h, const int kg) {
    if (is_byte(type)) return LOADW(qs + kg * 64 + h * CH * 4);
    const qvi v = LOADW(qs + (kg & 3) * 64 + h * CH * 4);
    return AND(kg < 4 ? v : SRL16(v, 4), SPLAT8(15));
}

/* acc += per-channel sum of 4 weight bytes x the 4 activation bytes at x. The AVX2 Q4 path sums
 * its pairs in i16 (8 steps of at most 2 * 15 * 127 fit 32767; finish() widens); its Q8_0 path
 * moves the sign onto the weight (|x| is the unsigned operand), so it sums w * x directly; a
 * weight byte of -128, which quantizers never write (they round to +-127), would negate wrongly. */
static inline __attribute__((always_inline)) qvi QN(step)(const int type, qvi acc, qvi w,
                                                          const int8_t *x) {
    const qvi xb = BCAST32(x);
#if QV == 0
    (void)type;
    return _mm512_dpbusd_epi32(acc, w, xb);
#elif QV == 1
    (void)type;
    return _mm256_dpbusd_avx_epi32(acc, w, xb);
#else
    if (!is_byte(type)) return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, xb));
    const qvi ws = _mm256_xor_si256(w, SPLAT8(0x80)); /* back to the signed weight */
    const qvi p = _mm256_maddubs_epi16(_mm256_abs_epi8(xb), _mm256_sign_epi8(ws, xb));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

static inline __attribute__((always_inline)) qvf QN(finish)(const int type, qvi acc) {
#if QV == 2
    if (!is_byte(type)) acc = _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
#else
    (void)type;
#endif
    return TOF(acc);
}

/* The weight offset the integer sum carries (w = d * (byte - off) + m). */
static inline int QN(offset)(const int type) {
    if (type == Q4_0) return 8;
    return is_byte(type) && QV != 2 ? 128 : 0;
}

/* Rows [i, i + mr) x the 16 channels of group g, over the whole K: per 32-value block the
 * integer sums of each row, then y += dw * dx * sum + (m - off * dw) * dx * sum(qx). The 8-channel
 * variants take the group's halves one after the other, so only one half's accumulators are
 * live (both at once spilled AVX2's 16 registers: prefill 2.6x slower than AVX-VNNI). */
static inline __attribute__((always_inline)) void QN(tile)(const qint_args *a, const int type,
                                                           const int64_t i, const int mr,
                                                           const int64_t g) {
    const int64_t kb = a->K / 32, tb = tile_bytes(type), qsb = qs_bytes(type);
    const float off = (float)QN(offset)(type);
    for (int h = 0; h < HALVES; h++) {
        const uint8_t *w = a->w + g * kb * tb;
        qvf acc[QMR];
        for (int r = 0; r < mr; r++) acc[r] = ZEROF();
        for (int64_t b = 0; b < kb; b++, w += tb) {
            const uint8_t *sc = w + qsb;
            qvi isum[QMR];
            for (int r = 0; r < mr; r++) isum[r] = ZEROI();
            for (int kg = 0; kg < 8; kg++) {
                const qvi wv = QN(wbytes)(type, w, h, kg);
                for (int r = 0; r < mr; r++)
                    isum[r] = QN(step)(type, isum[r], wv, a->q + (i + r) * a->K + b * 32 + kg * 4);
            }
            const qvf dw = type == I8 ? LOADF(sc + h * CH * 4) : HALFS(sc + h * CH * 2);
            const qvf cw = type == Q4_1 ? HALFS(sc + 32 + h * CH * 2) : MULF(dw, SETF(-off));
            for (int r = 0; r < mr; r++) {
                const int64_t at = (i + r) * kb + b;
                acc[r] = FMA(QN(finish)(type, isum[r]), MULF(dw, SETF(a->d[at])), acc[r]);
                acc[r] = FMA(cw, SETF(a->s[at]), acc[r]);
            }
        }
        for (int r = 0; r < mr; r++) {
            float out[CH];
            STOREF(out, acc[r]);
            for (int c = 0; c < CH; c++) {
                const int64_t n = g * GROUP + h * CH + c;
                if (n < a->N) a->y[(i + r) * a->N + n] = out[c] + (a->bias ? a->bias[n] : 0.0f);
            }
        }
    }
}

#define QTILES(MRC)                                                                            \
    for (int64_t g = g0; g < g1; g++) QN(tile)(a, type, i, MRC, g)

/* Groups [g0, g1) row tile by row tile, so a tile's quantized rows stay in L1 while they meet
 * every group of the chunk (whose packed weights stay in L2). */
static inline __attribute__((always_inline)) void QN(rows)(const qint_args *a, const int type,
                                                           const int64_t g0, const int64_t g1) {
    int64_t i = 0;
    for (; i + QMR <= a->M; i += QMR) QTILES(QMR);
    switch (a->M - i) {
    case 1: QTILES(1); break;
    case 2: QTILES(2); break;
    case 3: QTILES(3); break;
#if QMR > 4
    case 4: QTILES(4); break;
    case 5: QTILES(5); break;
    case 6: QTILES(6); break;
    case 7: QTILES(7); break;
#endif
    default: break;
    }
}
#undef QTILES

static inline __attribute__((always_inline)) void QN(part)(const qint_args *a, const int type,
                                                           const int64_t t, const int64_t n) {
    const int64_t groups = (a->N + GROUP - 1) / GROUP;
    const int64_t g0 = groups * t / n, g1 = groups * (t + 1) / n;
    const int64_t chunk = chunk_groups(type, a->K);
    for (int64_t g = g0; g < g1; g += chunk) QN(rows)(a, type, g, g + chunk < g1 ? g + chunk : g1);
}

static void QN(part_q4_0)(const void *a, int64_t t, int64_t n) {
    QN(part)((const qint_args *)a, Q4_0, t, n);
}
static void QN(part_q4_1)(const void *a, int64_t t, int64_t n) {
    QN(part)((const qint_args *)a, Q4_1, t, n);
}
static void QN(part_q8_0)(const void *a, int64_t t, int64_t n) {
    QN(part)((const qint_args *)a, Q8_0, t, n);
}
static void QN(part_i8)(const void *a, int64_t t, int64_t n) {
    QN(part)((const qint_args *)a, I8, t, n);
}

#undef QN
#undef qvi
#undef qvf
#undef CH
#undef QMR
#undef LOADW
#undef SPLAT8
#undef AND
#undef SRL16
#undef BCAST32
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
