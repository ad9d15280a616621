/* The paged decode kernel over a bfloat16 KV cache under a float32 model: paged_attention.c
 * built with KV_BF16, as kvcli_paged_decode_attention_bf16 (bfloat16 widened in registers). */
#define KV_BF16 1
#include "paged_attention.c"
