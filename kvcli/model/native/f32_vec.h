/* The float32 vector type of the few-row GEMMs (gemm.c, gemm_nt.c): the widest the build's ISA
 * has, and unaligned loads and stores of it (memcpy: one vmovups, no aliasing assumptions). */
#ifndef KVCLI_F32_VEC_H
#define KVCLI_F32_VEC_H
#include <string.h>

#if defined(__AVX512F__)
#define VW 16 /* floats per vector register */
#else
#define VW 8
#endif

typedef float vec __attribute__((vector_size(VW * 4)));

static inline vec loadu(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void storeu(float *p, vec v) { memcpy(p, &v, sizeof v); }

#endif
