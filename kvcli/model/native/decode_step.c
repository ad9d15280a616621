/* One whole batch-1 decode step of a Llama-family model, in one call (quantized or float32
 * weights).
 *
 * At batch 1 the weights of SmolLM2-135M in Q4_1 are ~84 MB a token, a few milliseconds of
 * memory traffic; what the fused NumPy path (kvcli/model/numpy_decode.py) spent besides was
 * ~150 ctypes calls and ~1200 small NumPy operations a step (~4-5 ms). Here the layer stack
 * runs in C, composed of the kernels the batched path calls one by one: the matmuls of
 * qgemm.c (--quantization gguf: float32 math on the GGUF blocks), qint.c (gguf-int) or
 * gemv.c (float32 weights, where NumPy's OpenBLAS gemv ran before), the
 * RMSNorm, RoPE and SiLU-and-mul of elementwise.c, the int8 KV write of paged_attention_int8.c
 * and the many-row attention of prefill_attention.c (one query row over the context's slots).
 * Only the matmuls and the attention use the worker pool; the element-wise passes over a
 * 576-float row run on the caller. The same arithmetic as a batched step's row, kernel by
 * kernel, so the outputs are those kernels'.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int kvcli_qgemm(int64_t type, const float *x, const uint8_t *w, const float *scale,
                const float *bias, float *y, int64_t M, int64_t N, int64_t K, int64_t threads);
int kvcli_gemv(const float *x, const float *w, const float *bias, float *y, int64_t N,
               int64_t K, int64_t threads);
int kvcli_qint_gemm(int64_t variant, int64_t type, const float *x, const uint8_t *w,
                    const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                    int64_t threads);
void kvcli_rms_norm(const float *x, const float *weight, float *out, int64_t rows, int64_t dim,
                    float eps, int64_t threads);
void kvcli_silu_and_mul(const float *gate_up, float *out, int64_t rows, int64_t dim,
                        int64_t threads);
void kvcli_rope(float *x, const float *cos, const float *sin, int64_t rows, int64_t stride,
                int64_t heads, int64_t head_dim, int64_t threads);
void kvcli_quantize_kv(const float *x, const int64_t *slots, uint8_t *cache, int64_t num_tokens,
                       int64_t num_kv_heads, int64_t head_dim, int64_t row_stride,
                       int64_t threads);
typedef int (*attention_fn)(const float *q, int64_t q_stride, const void *k, const void *v,
                            const int64_t *slots,
                            const int64_t *seqs, float *out, int64_t num_seqs, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, int64_t window, float scale,
                            int64_t num_threads);
int kvcli_paged_prefill_attention(const float *, int64_t, const float *, const float *,
                                  const int64_t *, const int64_t *, float *, int64_t, int64_t,
                                  int64_t, int64_t, int64_t, float, int64_t);
int kvcli_paged_prefill_attention_int8(const float *, int64_t, const uint8_t *, const uint8_t *,
                                       const int64_t *, const int64_t *, float *, int64_t,
                                       int64_t, int64_t, int64_t, int64_t, float, int64_t);

/* One matrix: kvcli_qgemm's (int_kernel 0: [out, in] GGUF blocks or int8 rows with `scale`),
 * kvcli_qint_gemm's (1: its packed tiles, for `variant`) or kvcli_gemv's (2: a float32 [in, out]
 * buffer). Mirrored by native_step.py. */
typedef struct {
    int64_t int_kernel, type, variant;
    const uint8_t *w;
    const float *scale, *bias;
} step_matrix;

typedef struct {
    const float *in_norm, *post_norm;
    step_matrix qkv, o, gate_up, down;
} step_layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, ffn;
    float eps, scale;
    const step_layer *layers;
    const float *final_norm;
    int64_t kv_int8;                     /* the cache holds kv_int8.h rows, not float32 */
    int64_t layer_bytes, v_bytes, row_bytes; /* cache strides: a layer, K to V, one slot */
} step_model;

static int matmul(const step_matrix *m, const float *x, float *y, int64_t N, int64_t K,
                  int64_t threads) {
    if (m->int_kernel == 2)
        return kvcli_gemv(x, (const float *)m->w, m->bias, y, N, K, threads);
    if (m->int_kernel)
        return kvcli_qint_gemm(m->variant, m->type, x, m->w, m->bias, y, 1, N, K, threads);
    return kvcli_qgemm(m->type, x, m->w, m->scale, m->bias, y, 1, N, K, threads);
}

/* This token's K and V into `slot` of one layer's cache, then its attention over `context`. */
static int attend(const step_model *m, float *qkv, uint8_t *kv, int64_t slot,
                  const int64_t *context, int64_t context_len, float *out, int64_t threads) {
    const int64_t D = m->head_dim, q_size = m->heads * D, kv_size = m->kv_heads * D;
    uint8_t *k = kv, *v = kv + m->v_bytes;
    if (m->kv_int8) {
        kvcli_quantize_kv(qkv + q_size, &slot, k, 1, m->kv_heads, D, kv_size, 1);
        kvcli_quantize_kv(qkv + q_size + kv_size, &slot, v, 1, m->kv_heads, D, kv_size, 1);
    } else {
        memcpy(k + slot * m->row_bytes, qkv + q_size, sizeof(float) * kv_size);
        memcpy(v + slot * m->row_bytes, qkv + q_size + kv_size, sizeof(float) * kv_size);
    }
    const int64_t seqs[4] = {0, 1, context_len, 0}; /* first row, rows, context, first slot */
    const attention_fn fn = m->kv_int8 ? (attention_fn)kvcli_paged_prefill_attention_int8
                                       : (attention_fn)kvcli_paged_prefill_attention;
    return fn(qkv, q_size, k, v, context, seqs, out, 1, m->heads, m->kv_heads, D, 0, m->scale,
              threads);
}

/* h [hidden]: the token's embedding in, the residual stream after the last layer out; out
 * [hidden]: the final norm of it. cos/sin: this position's rows. Returns 0, else the failing
 * kernel's status (an unknown weight type, or memory ran out). */
int kvcli_decode_step(const step_model *m, float *h, const float *cos, const float *sin,
                      uint8_t *kv_cache, int64_t slot, const int64_t *context,
                      int64_t context_len, float *out, int64_t threads) {
    const int64_t H = m->hidden, F = m->ffn, D = m->head_dim;
    const int64_t q_size = m->heads * D, qkv_size = q_size + 2 * m->kv_heads * D;
    const int64_t floats = H + qkv_size + q_size + 2 * F + F + H;
    float *x = malloc(sizeof(float) * floats);
    if (!x) return -2;
    float *qkv = x + H, *attn = qkv + qkv_size, *gate_up = attn + q_size, *act = gate_up + 2 * F;
    float *delta = act + F;
    int status = 0;
    for (int64_t i = 0; i < m->num_layers && !status; i++) {
        const step_layer *l = &m->layers[i];
        kvcli_rms_norm(h, l->in_norm, x, 1, H, m->eps, 1);
        status = matmul(&l->qkv, x, qkv, qkv_size, H, threads);
        if (status) break;
        kvcli_rope(qkv, cos, sin, 1, qkv_size, m->heads + m->kv_heads, D, 1);
        status = attend(m, qkv, kv_cache + i * m->layer_bytes, slot, context, context_len, attn,
                        threads);
        if (!status) status = matmul(&l->o, attn, delta, H, q_size, threads);
        if (status) break;
        for (int64_t j = 0; j < H; j++) h[j] += delta[j];
        kvcli_rms_norm(h, l->post_norm, x, 1, H, m->eps, 1);
        status = matmul(&l->gate_up, x, gate_up, 2 * F, H, threads);
        if (status) break;
        kvcli_silu_and_mul(gate_up, act, 1, F, 1);
        status = matmul(&l->down, act, delta, H, F, threads);
        for (int64_t j = 0; j < H; j++) h[j] += delta[j];
    }
    if (!status) kvcli_rms_norm(h, m->final_norm, out, 1, H, m->eps, 1);
    free(x);
    return status;
}
