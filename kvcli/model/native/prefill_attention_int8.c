/* The many-row kernels (prefill chunks, shared-prefix decode) over the int8 KV cache:
 * prefill_attention.c built with KV_INT8, as kvcli_paged_prefill_attention_int8 and
 * kvcli_shared_decode_attention_int8 (same arguments, the cache as kv_int8.h's rows). */
#define KV_INT8 1
#include "prefill_attention.c"
