"""KVCacheManager with a disk tier (torch-free): the hit walk continues on disk, loads never
evict the prefix being walked, each loaded block is credited once, and only blocks a step
really computed are handed to the writer."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcli.engine.kv_cache import KVCacheManager
from kvcli.engine.request import Request
from kvcli.sampling_params import SamplingParams

BS = 4


@dataclass
class FakeDisk:
    """Blocks "on disk" by hash; remembers which pool block each load filled."""

    held: set[bytes] = field(default_factory=set)
    loads: list[tuple[bytes, int]] = field(default_factory=list)

    def load(self, block_hash: bytes, block_id: int) -> bool:
        if block_hash not in self.held:
            return False
        self.loads.append((block_hash, block_id))
        return True


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), block_size=BS)


def admit(kv: KVCacheManager, r: Request) -> int:
    hits, num_hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - num_hit, hits) is not None
    r.num_computed_tokens = r.num_tokens
    return num_hit


def test_the_walk_continues_on_disk_and_credits_each_load_once():
    disk = FakeDisk()
    kv = KVCacheManager(16, BS, disk=disk)
    tokens = list(range(21))  # 5 full blocks + 1 token
    disk.held = set(req("probe", tokens).block_hashes)
    a, b = req("a", tokens), req("b", tokens)
    assert admit(kv, a) == 20 and len(disk.loads) == 5
    assert kv.disk_hit_tokens["a"] == 20 and kv.stats.disk_hits == 20
    assert admit(kv, b) == 20 and len(disk.loads) == 5  # memory hits now
    assert kv.disk_hit_tokens["b"] == 0 and kv.stats.disk_hits == 20 and kv.stats.hits == 40
    assert kv.get_blocks("a")[:5] == kv.get_blocks("b")[:5]
    assert kv.drain_new_full_blocks() == []  # loaded blocks are not written back


def test_memory_hits_then_disk_then_a_miss():
    disk = FakeDisk()
    kv = KVCacheManager(16, BS, disk=disk)
    tokens = list(range(17))
    hashes = req("probe", tokens).block_hashes
    first = req("first", tokens[:8] + [99])  # computes blocks 0-1 in memory
    admit(kv, first)
    kv.free(first)
    disk.held = {hashes[2]}  # block 2 on disk, block 3 nowhere
    r = req("r", tokens)
    assert admit(kv, r) == 12 and [h for h, _ in disk.loads] == [hashes[2]]
    assert kv.disk_hit_tokens["r"] == 4


def test_loading_never_evicts_the_prefix_it_walks():
    disk = FakeDisk()
    kv = KVCacheManager(5, BS, disk=disk)
    tokens = list(range(21))
    hashes = req("probe", tokens).block_hashes
    first = req("first", tokens[:9])  # blocks 0-1 cached, then freed: the LRU front
    admit(kv, first)
    kv.free(first)
    memory = [kv.block_pool.get_cached_block(h).block_id for h in hashes[:2]]
    disk.held = set(hashes[2:])
    hits, num_hit = kv.get_computed_blocks(req("r", tokens))
    # Every free block but the two pinned hits is taken by a load, none of those two.
    assert num_hit == 20 and [b.block_hash for b in hits] == hashes[:5]
    assert [bid for _, bid in disk.loads] == [b.block_id for b in hits[2:]]
    assert not set(memory) & {bid for _, bid in disk.loads}
    assert kv.num_free_blocks == 5  # nothing is held until allocate_slots takes them


def test_only_blocks_a_step_computed_are_drained():
    disk = FakeDisk()
    kv = KVCacheManager(16, BS, disk=disk)
    a = req("a", list(range(10)))
    admit(kv, a)
    assert [h for _, h in kv.drain_new_full_blocks()] == a.block_hashes[:2]
    b = req("b", list(range(10)))  # memory hits: nothing new to write
    admit(kv, b)
    assert kv.drain_new_full_blocks() == []
    c = req("c", list(range(50, 60)))
    hits, n = kv.get_computed_blocks(c)
    kv.allocate_slots(c, c.num_tokens, hits)
    kv.free(c)  # preempted before its step ran: its blocks were never computed
    assert kv.drain_new_full_blocks() == []


def test_probes_never_read_the_disk():
    disk = FakeDisk()
    kv = KVCacheManager(16, BS, disk=disk)
    r = req("r", list(range(9)))
    disk.held = set(r.block_hashes)
    assert kv.get_computed_blocks(r, record_stats=False) == ([], 0) and disk.loads == []



def test_loads_take_only_blocks_the_request_needs_anyway():
    disk = FakeDisk()
    kv = KVCacheManager(4, BS, disk=disk)
    r = req("r", list(range(13)))  # 3 full blocks + 1 token: 4 blocks, hit or not
    disk.held = set(r.block_hashes)
    hits, num_hit = kv.get_computed_blocks(r)
    assert num_hit == 12 and len(disk.loads) == 3
    assert kv.allocate_slots(r, r.num_tokens - num_hit, hits) is not None
    assert kv.num_free_blocks == 0
