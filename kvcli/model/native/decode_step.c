/* Whole decode steps of a Llama-family model, one call each (quantized or float32 weights):
 * kvcli_decode_step for one sequence (batch 1), kvcli_decode_rows for a step whose every row is
 * one sequence's next token (a batched decode step).
 *
 * At batch 1 the weights of SmolLM2-135M in Q4_1 are ~84 MB a token, a few milliseconds of
 * memory traffic; what the fused NumPy path (kvcli/model/numpy_decode.py) spent besides was
 * ~150 ctypes calls and ~1200 small NumPy operations a step (~4-5 ms). At batch 32 the torch
 * path's Python and dispatch between the ~10 kernels of a layer cost ~0.3 of its ~1.45 ms (Xeon
 * with AMX, fast, docs/BENCHMARKS.md). Here the layer stack runs in C, composed of the kernels
 * the batched path calls one by one: the matmuls of qgemm.c (--quantization gguf: float32 math
 * on the GGUF blocks), qint.c (gguf-int) or, for float32 weights, gemv.c at one row (where
 * NumPy's OpenBLAS gemv ran before) and gemm.c at more (the batched path's), the RMSNorm, RoPE
 * and SiLU-and-mul of elementwise.c, the int8 KV write of paged_attention_int8.c, and the
 * attention of prefill_attention.c (batch 1: one query row over the context's slots) or
 * paged_attention.c (rows: the batched path's paged decode kernel). The same arithmetic as the
 * batched path, kernel by kernel, so the outputs are those kernels'; rows is equal to it bit for
 * bit (tests/test_native_step.py).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int kvcli_qgemm(int64_t type, const float *x, const uint8_t *w, const float *scale,
                const float *bias, float *y, int64_t M, int64_t N, int64_t K, int64_t threads);
int kvcli_gemv(const float *x, const float *w, const float *bias, float *y, int64_t N,
               int64_t K, int64_t threads);
void kvcli_gemm(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N,
                int64_t K, int64_t threads);
int kvcli_qint_gemm(int64_t variant, int64_t type, const float *x, const uint8_t *w,
                    const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                    int64_t threads);
int kvcli_w8a8_gemm(const float *x, const int8_t *w, const float *scales, const float *bias,
                    float *y, int64_t M, int64_t N, int64_t K, int64_t threads);
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
typedef int (*shared_fn)(const float *q, int64_t q_stride, const void *k, const void *v,
                         const int64_t *slots, const int64_t *seqs, const int64_t *groups,
                         float *out, int64_t num_groups, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, float scale, int64_t num_threads);
int kvcli_shared_decode_attention(const float *, int64_t, const float *, const float *,
                                  const int64_t *, const int64_t *, const int64_t *, float *,
                                  int64_t, int64_t, int64_t, int64_t, float, int64_t);
int kvcli_shared_decode_attention_int8(const float *, int64_t, const uint8_t *, const uint8_t *,
                                       const int64_t *, const int64_t *, const int64_t *, float *,
                                       int64_t, int64_t, int64_t, int64_t, float, int64_t);
typedef int (*paged_fn)(const float *q, const void *k, const void *v, const int64_t *block_tables,
                        const int64_t *seq_lens, float *out, int64_t num_seqs, int64_t num_heads,
                        int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                        int64_t max_blocks, int64_t window, float scale, int64_t num_threads);
int kvcli_paged_decode_attention(const float *, const float *, const float *, const int64_t *,
                                 const int64_t *, float *, int64_t, int64_t, int64_t, int64_t,
                                 int64_t, int64_t, int64_t, float, int64_t);
int kvcli_paged_decode_attention_int8(const float *, const uint8_t *, const uint8_t *,
                                      const int64_t *, const int64_t *, float *, int64_t, int64_t,
                                      int64_t, int64_t, int64_t, int64_t, int64_t, float, int64_t);

/* One matrix: kvcli_qgemm's (int_kernel 0: [out, in] GGUF blocks or int8 rows with `scale`),
 * kvcli_qint_gemm's (1: its packed tiles, for `variant`) or, for a float32 [in, out] buffer (2),
 * kvcli_gemv's at one row and kvcli_gemm's at more. An integer one may also have fast's int8
 * copy (w8a8.c's tiles and channel scales), which calls of at least w8_rows rows run (routes.py's
 * w8a8_copy_rows; a batched step never has the bfloat16 copy's rows). Mirrored by
 * native_step.py. */
typedef struct {
    int64_t int_kernel, type, variant;
    const uint8_t *w;
    const float *scale, *bias;
    const int8_t *w8;
    const float *w8_scale;
    int64_t w8_rows;
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

/* The rows of one step and how they attend (mirrored by native_step.py): one sequence through
 * the many-row kernel over its context's slots (context != NULL), or each row one sequence's
 * next token as the batched path attends it (kvcli/model/attention/native_cpu.py): groups of
 * sequences sharing a cached prefix through the shared-prefix decode kernel, the other rows
 * (`paged` of them) through the paged decode kernel over their block tables. */
typedef struct {
    int64_t rows;
    const int64_t *slots;   /* [rows]: each row's new K/V slot */
    const int64_t *context; /* batch 1: the context's slots (this token's last), else NULL */
    int64_t context_len;
    const int64_t *paged_rows; /* [paged]: the paged kernel's rows; NULL: every row, in order */
    int64_t paged;
    const int64_t *block_tables, *seq_lens; /* [paged, max_blocks], [paged] */
    int64_t block_size, max_blocks;
    const int64_t *shared_slots, *shared_seqs, *groups; /* the shared kernel's arguments */
    int64_t num_groups;
} step_rows;

/* Floats of scratch per row: x, qkv, the paged kernel's queries and output, the attention's
 * output, gate_up, act, delta. */
static int64_t row_floats(const step_model *m) {
    const int64_t q_size = m->heads * m->head_dim;
    return 2 * m->hidden + q_size + 2 * m->kv_heads * m->head_dim + 3 * q_size + 3 * m->ffn;
}

static int matmul(const step_matrix *m, const float *x, float *y, int64_t M, int64_t N,
                  int64_t K, int64_t threads) {
    if (m->int_kernel == 2 && M == 1)
        return kvcli_gemv(x, (const float *)m->w, m->bias, y, N, K, threads);
    if (m->int_kernel == 2) {
        kvcli_gemm(x, (const float *)m->w, m->bias, y, M, N, K, threads);
        return 0;
    }
    if (m->w8 && M >= m->w8_rows)
        return kvcli_w8a8_gemm(x, m->w8, m->w8_scale, m->bias, y, M, N, K, threads);
    if (m->int_kernel)
        return kvcli_qint_gemm(m->variant, m->type, x, m->w, m->bias, y, M, N, K, threads);
    return kvcli_qgemm(m->type, x, m->w, m->scale, m->bias, y, M, N, K, threads);
}

/* The rows' K and V into their slots of one layer's cache. */
static void write_kv(const step_model *m, const float *qkv, uint8_t *k, uint8_t *v,
                     const step_rows *r, int64_t threads) {
    const int64_t q_size = m->heads * m->head_dim, kv_size = m->kv_heads * m->head_dim;
    const int64_t stride = q_size + 2 * kv_size;
    if (m->kv_int8) {
        kvcli_quantize_kv(qkv + q_size, r->slots, k, r->rows, m->kv_heads, m->head_dim, stride,
                          threads);
        kvcli_quantize_kv(qkv + q_size + kv_size, r->slots, v, r->rows, m->kv_heads,
                          m->head_dim, stride, threads);
        return;
    }
    for (int64_t i = 0; i < r->rows; i++) {
        memcpy(k + r->slots[i] * m->row_bytes, qkv + i * stride + q_size, sizeof(float) * kv_size);
        memcpy(v + r->slots[i] * m->row_bytes, qkv + i * stride + q_size + kv_size,
               sizeof(float) * kv_size);
    }
}

/* The paged decode kernel over rows r->paged_rows (all, in order, where NULL) into out, through
 * q_in (their queries, contiguous) and, for listed rows, p_out. */
static int attend_paged(const step_model *m, const float *qkv, const uint8_t *k,
                        const uint8_t *v, const step_rows *r, float *q_in, float *p_out,
                        float *out, int64_t threads) {
    const int64_t D = m->head_dim, q_size = m->heads * D, stride = q_size + 2 * m->kv_heads * D;
    for (int64_t i = 0; i < r->paged; i++)
        memcpy(q_in + i * q_size, qkv + (r->paged_rows ? r->paged_rows[i] : i) * stride,
               sizeof(float) * q_size);
    const paged_fn fn = m->kv_int8 ? (paged_fn)kvcli_paged_decode_attention_int8
                                   : (paged_fn)kvcli_paged_decode_attention;
    float *dst = r->paged_rows ? p_out : out;
    const int status = fn(q_in, k, v, r->block_tables, r->seq_lens, dst, r->paged, m->heads,
                          m->kv_heads, D, r->block_size, r->max_blocks, 0, m->scale, threads);
    for (int64_t i = 0; r->paged_rows && i < r->paged; i++)
        memcpy(out + r->paged_rows[i] * q_size, p_out + i * q_size, sizeof(float) * q_size);
    return status;
}

/* The rows' new K/V into one layer's cache, then their attention into out [rows, q_size].
 * q_in, p_out: the paged kernel's scratch. */
static int attend(const step_model *m, float *qkv, uint8_t *kv, const step_rows *r, float *q_in,
                  float *p_out, float *out, int64_t threads) {
    const int64_t D = m->head_dim, q_size = m->heads * D, stride = q_size + 2 * m->kv_heads * D;
    uint8_t *k = kv, *v = kv + m->v_bytes;
    write_kv(m, qkv, k, v, r, r->context ? 1 : threads);
    if (r->context) {
        const int64_t seqs[4] = {0, 1, r->context_len, 0}; /* first row, rows, context, slot */
        const attention_fn fn = m->kv_int8 ? (attention_fn)kvcli_paged_prefill_attention_int8
                                           : (attention_fn)kvcli_paged_prefill_attention;
        return fn(qkv, q_size, k, v, r->context, seqs, out, 1, m->heads, m->kv_heads, D, 0,
                  m->scale, threads);
    }
    int status = 0;
    if (r->num_groups) {
        const shared_fn fn = m->kv_int8 ? (shared_fn)kvcli_shared_decode_attention_int8
                                        : (shared_fn)kvcli_shared_decode_attention;
        status = fn(qkv, stride, k, v, r->shared_slots, r->shared_seqs, r->groups, out,
                    r->num_groups, m->heads, m->kv_heads, D, m->scale, threads);
    }
    if (!status && r->paged) status = attend_paged(m, qkv, k, v, r, q_in, p_out, out, threads);
    return status;
}

static void add(float *h, const float *delta, int64_t n) {
    for (int64_t j = 0; j < n; j++) h[j] += delta[j];
}

/* h [rows, hidden]: the tokens' embeddings in, the residual stream after the last layer out;
 * out [rows, hidden]: its final norm. cos/sin [rows, head_dim]: the rows' positions. The
 * element-wise kernels of one row run on the caller. Returns 0, else the failing kernel's
 * status (an unknown weight type, or memory ran out). */
static int run(const step_model *m, float *h, const float *cos, const float *sin,
               uint8_t *kv_cache, const step_rows *r, float *out, int64_t threads) {
    const int64_t H = m->hidden, F = m->ffn, D = m->head_dim, R = r->rows;
    const int64_t q_size = m->heads * D, qkv_size = q_size + 2 * m->kv_heads * D;
    const int64_t each = R > 1 ? threads : 1; /* element-wise passes over one row: no workers */
    float *x = malloc(sizeof(float) * R * row_floats(m));
    if (!x) return -2;
    float *qkv = x + R * H, *q_in = qkv + R * qkv_size, *p_out = q_in + R * q_size;
    float *attn = p_out + R * q_size;
    float *gate_up = attn + R * q_size, *act = gate_up + R * 2 * F, *delta = act + R * F;
    int status = 0;
    for (int64_t i = 0; i < m->num_layers && !status; i++) {
        const step_layer *l = &m->layers[i];
        kvcli_rms_norm(h, l->in_norm, x, R, H, m->eps, each);
        status = matmul(&l->qkv, x, qkv, R, qkv_size, H, threads);
        if (status) break;
        kvcli_rope(qkv, cos, sin, R, qkv_size, m->heads + m->kv_heads, D, each);
        status = attend(m, qkv, kv_cache + i * m->layer_bytes, r, q_in, p_out, attn, threads);
        if (!status) status = matmul(&l->o, attn, delta, R, H, q_size, threads);
        if (status) break;
        add(h, delta, R * H);
        kvcli_rms_norm(h, l->post_norm, x, R, H, m->eps, each);
        status = matmul(&l->gate_up, x, gate_up, R, 2 * F, H, threads);
        if (status) break;
        kvcli_silu_and_mul(gate_up, act, R, F, each);
        status = matmul(&l->down, act, delta, R, H, F, threads);
        add(h, delta, R * H);
    }
    if (!status) kvcli_rms_norm(h, m->final_norm, out, R, H, m->eps, each);
    free(x);
    return status;
}

/* One token of one sequence: its K/V written at `slot`, attending over `context` (the
 * context's slots, this token's last). */
int kvcli_decode_step(const step_model *m, float *h, const float *cos, const float *sin,
                      uint8_t *kv_cache, int64_t slot, const int64_t *context,
                      int64_t context_len, float *out, int64_t threads) {
    const step_rows r = {1, &slot, context, context_len, NULL, 0, NULL, NULL, 0, 0,
                         NULL, NULL, NULL, 0};
    return run(m, h, cos, sin, kv_cache, &r, out, threads);
}

/* The next token of each of r->rows sequences (r: how they attend). */
int kvcli_decode_rows(const step_model *m, float *h, const float *cos, const float *sin,
                      uint8_t *kv_cache, const step_rows *r, float *out, int64_t threads) {
    return r->context ? -1 : run(m, h, cos, sin, kv_cache, r, out, threads);
}
