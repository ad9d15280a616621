/* The AMX tile configuration the tile kernels share (qint_amx.h, prefill_amx.h, w8a8.c,
 * swiglu_amx.c). Include where the AMX intrinsics are enabled (-march or a target pragma);
 * tile state is per thread, so each thread configures its own before its first tile
 * instruction and releases it after its last. */
#ifndef KVCLI_AMX_TILES_H
#define KVCLI_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Tiles 0-7 as rows[t] rows of colsb[t] bytes (palette 1). */
static inline __attribute__((always_inline)) void amx_load_config(const uint8_t rows[8],
                                                                   const uint16_t colsb[8]) {
    amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = rows[t], cfg.colsb[t] = colsb[t];
    _tile_loadconfig(&cfg);
}

/* All eight tiles 16 rows of 64 bytes (prefill_amx.h, w8a8.c, swiglu_amx.c). */
static inline __attribute__((always_inline)) void amx_tiles_16x64(void) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    amx_load_config(rows, colsb);
}

#endif
