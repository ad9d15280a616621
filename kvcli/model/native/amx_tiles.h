/* The AMX tile configuration the int8 kernels share (prefill_amx.h, w8a8.c): all eight tiles 16
 * rows of 64 bytes. Include where the AMX intrinsics are enabled (-march or a target pragma);
 * tile state is per thread, so each thread configures its own before its first tile
 * instruction and releases it after its last. */
#ifndef KVCLI_AMX_TILES_H
#define KVCLI_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) void amx_tiles_16x64(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

#endif
