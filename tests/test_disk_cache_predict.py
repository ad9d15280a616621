"""What DIR holds predicts the next run's hits exactly, torch-free: a fingerprint from the
model's config, hashes from kvcli/hashing.py, the audit's leading-hit rule over memory or disk
(the building block for `kvcli audit --kv-cache-dir`)."""

from __future__ import annotations

from kvcli import LLM, SamplingParams
from kvcli.audit.hits import leading_hits, usable_blocks
from kvcli.hashing import hash_token_blocks
from kvcli.kvstore import open_model_store
from kvcli.kvstore.fingerprint import model_fingerprint

BS = 4
SYSTEM = "Caching the keys and values of a shared prompt prefix saves a great deal of work. "


class SeenOrOnDisk:
    def __init__(self, seen: set[bytes], store) -> None:
        self.seen, self.store = seen, store

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.seen or block_hash in self.store


def test_the_directory_predicts_generates_cached_tokens(tiny_models, kvcli_home, tmp_path):
    model, kv = tiny_models["llama"], tmp_path / "kv"
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    llm = LLM(str(model), block_size=BS, kv_cache_dir=str(kv))
    llm.generate([SYSTEM + "The fox went", "Once upon a time there was a fox"], params)
    llm.engine.close()
    cfg, encode = llm.engine.model.config, llm.engine.tokenizer.encode
    prompts = [encode(SYSTEM + q, add_special_tokens=True) for q in
               ("The fox went to the river", "What is the weather", "The fox went to the sea")]
    store = open_model_store(kv, model_fingerprint(cfg, model, "float32", "cpu", BS,
                                                   digest_cache=kvcli_home / "file-digests"))
    seen: set[bytes] = set()
    predicted = []
    for ids in prompts:
        hashes = hash_token_blocks(ids, BS)
        predicted.append(usable_blocks(leading_hits(hashes, SeenOrOnDisk(seen, store)), len(ids),
                                       BS, True) * BS)
        seen.update(hashes)
    second = LLM(str(model), block_size=BS, kv_cache_dir=str(kv))
    outs = second.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    second.engine.close()
    assert [o.num_cached_tokens for o in outs] == predicted
    assert outs[0].num_disk_cached_tokens > 0


def test_an_int8_runs_directory_is_found_with_its_kv_dtype_only(tiny_models, kvcli_home, tmp_path):
    """The torch-free fingerprint keys by --kv-cache-dtype as the engine's does (the audit's
    `--kv-cache-dtype int8 --kv-cache-dir`): int8 blocks under the int8 key, none under float32's."""
    model, kv = tiny_models["llama"], tmp_path / "kv"
    llm = LLM(str(model), block_size=BS, kv_cache_dir=str(kv), kv_cache_dtype="int8")
    llm.generate([SYSTEM + "The fox went"], SamplingParams(max_tokens=6, ignore_eos=True))
    llm.engine.close()
    ids = llm.engine.tokenizer.encode(SYSTEM + "The fox went", add_special_tokens=True)
    hashes = hash_token_blocks(ids, BS)
    digests = kvcli_home / "file-digests"
    cfg = llm.engine.model.config
    int8 = open_model_store(kv, model_fingerprint(cfg, model, "float32", "cpu", BS,
                                                  digest_cache=digests, kv_cache_dtype="int8"))
    f32 = open_model_store(kv, model_fingerprint(cfg, model, "float32", "cpu", BS,
                                                 digest_cache=digests))
    assert hashes[0] in int8 and hashes[0] not in f32
