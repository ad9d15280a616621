/* Part of qint_kernel.h's AVX2 variant (QV 2; included there, after its macros), for the
 * nibble types. */
/* The AVX2 tile of the nibble types (Q4_0, Q4_1, Q4_K: the default model's) written out: one
 * load of a block's weight vector kv gives k-groups kv and kv + 4, each row's i16 pair sums
 * run over the whole block, and per row only acc and part stay live (2 mr + 5 registers).
 * Integer adds are associative, so GCC turned tile()'s sums into a tree whose products were all
 * computed first and spilled (~90 stack moves in a 6-row block's ~330 instructions; the loop
 * runs at the rate it issues them): an empty asm on each running sum keeps it in a register,
 * in order. 6-row blocks: 0.74-0.86x the time of tile()'s at 8-512 rows on Zen 3, the same
 * integer sums bit for bit. */
static AI void QN(nibble_tile)(const qint_args *a, const int type, const int64_t i, const int mr,
                               const int64_t g, const int h) {
    const int64_t K = a->K, kb = K / 32, tb = tile_bytes(type), qsb = qs_bytes(type);
    const uint8_t *w = a->w + g * kb * tb + h * CH * 4;
    const int8_t *x = a->q + i * K;
    const float *dx = a->d + i * kb, *sx = a->s + i * kb;
    const int32_t *ox = a->o + i * kb;
    const qvi low = SPLAT8(15), ones = _mm256_set1_epi16(1);
    qvf acc[QMR];
    for (int r = 0; r < mr; r++) acc[r] = ZEROF();
    for (int64_t b = 0; b < kb; b++, w += tb, x += 32) {
        qvi part[QMR];
#pragma GCC unroll 4
        for (int kv = 0; kv < 4; kv++) {
            const qvi v = LOADW(w + kv * 64);
            const qvi lo = AND(v, low), hi = AND(SRL16(v, 4), low);
            for (int r = 0; r < mr; r++) {
                const int8_t *xr = x + r * K + kv * 4; /* k-groups kv and kv + 4 */
                const qvi p = _mm256_maddubs_epi16(lo, BCAST32(xr));
                part[r] = kv ? _mm256_add_epi16(part[r], p) : p;
                part[r] = _mm256_add_epi16(part[r], _mm256_maddubs_epi16(hi, BCAST32(xr + 16)));
                __asm__("" : "+x"(part[r])); /* no reassociation into a tree of spilled sums */
            }
        }
        const qvf dw = QN(scale)(type, w - h * CH * 4 + qsb, h, 0);
        const qvf mw = nibble_min(type) ? QN(scale)(type, w - h * CH * 4 + qsb, h, 1) : ZEROF();
        for (int r = 0; r < mr; r++) {
            qvi wide = _mm256_madd_epi16(part[r], ones);
            if (!nibble_min(type)) wide = _mm256_add_epi32(wide, SETI(ox[r * kb + b]));
            const qvf sum = MULF(TOF(wide), SETF(dx[r * kb + b]));
            acc[r] = FMA(sum, dw, acc[r]);
            if (nibble_min(type)) acc[r] = FMA(mw, SETF(sx[r * kb + b]), acc[r]);
        }
    }
    const int64_t n0 = g * GROUP + h * CH;
    for (int r = 0; r < mr; r++) {
        float *y = a->y + (i + r) * a->N + n0, out[CH];
        STOREF(out, acc[r]);
        for (int c = 0; c < CH && n0 + c < a->N; c++)
            y[c] = out[c] + (a->bias ? a->bias[n0 + c] : 0.0f);
    }
}
