/* The int8 KV cache's write (kvcli_quantize_kv) and paged decode kernel
 * (kvcli_paged_decode_attention_int8): paged_attention_kv.c built for int8 rows. */
#define KV_INT8 1
#include "paged_attention_kv.c"
