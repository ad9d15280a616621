/* The many-row kernels (prefill chunks, shared-prefix decode) over a bfloat16 KV cache under a
 * float32 model: prefill_attention.c built with KV_BF16, as kvcli_paged_prefill_attention_bf16
 * and kvcli_shared_decode_attention_bf16 (same arguments, the cache as bfloat16 rows). */
#define KV_BF16 1
#include "prefill_attention.c"
