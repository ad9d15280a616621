"""One kvcli row in a process of its own (`python -m kvcli.bench.kvcli_runner ROW_JSON`).

The parent (kvcli_process.py) talks to it as to a peer's runner (peer_serve.py's loop, one
JSON object a line). argv[1] is {"row": KvcliRow's fields, "threads": n or null}; the runner
loads the row with kvcli_rows.load_row, the bench's own loader, and says {"ready": true,
"load_s": ..., what the report needs of the row}. Then it answers:
  {"workload": {"name": ..., options}}  the workload tokenized by this row's tokenizer
  {"prepare": {"prompts": [[ids]], "max_new_tokens": n}}  the KV pool sized for it, untimed
  {"prompts": [[ids]], "max_new_tokens": n}  one run (KvcliSystem.run), with this process's
      peak RSS during it and its growth over the run (the peak counter is reset first)
A load that cannot work, or a workload option that cannot, is answered {"usage_error": ...}
(the parent's BenchConfigError, exit status 2, as when the row runs in the bench's process).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from typing import Any

from kvcli.bench.kvcli_rows import KvcliRow, load_row
from kvcli.bench.measure import RssTracker
from kvcli.bench.peer_serve import serve, status_kib
from kvcli.bench.workloads import BenchConfigError
from kvcli.engine import engine_class


def load(args: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    engine_class()  # torch imported as `kvcli generate` imports it (its objects frozen)
    import torch

    if args.get("threads"):
        torch.set_num_threads(int(args["threads"]))  # before the load: the pools' size
    try:
        system = load_row(KvcliRow(**args["row"]))
    except BenchConfigError as err:
        return None, {"usage_error": str(err)}
    rss = status_kib("VmRSS")
    return system, {"exact": system.exact, "precision": system.precision,
                    "weights_kind": system.weights_kind, "max_model_len": system.max_model_len,
                    "load_rss_mb": None if rss is None else round(rss / 1024, 1)}


def handle(system: Any, request: dict[str, Any]) -> dict[str, Any]:
    if "workload" in request:
        options = dict(request["workload"])
        try:
            return {"workload": asdict(system.workload(options.pop("name"), **options))}
        except BenchConfigError as err:
            return {"usage_error": str(err)}
    if "prepare" in request:
        system.prepare(request["prepare"]["prompts"], request["prepare"]["max_new_tokens"])
        return {"prepared": True}
    rss = RssTracker()
    rss.start()
    start = time.perf_counter()
    result = system.run(request["prompts"], request["max_new_tokens"])
    wall = time.perf_counter() - start
    result.peak_rss_mb, result.rss_growth_mb = rss.stop()
    return {"result": asdict(result), "wall_s": wall}


if __name__ == "__main__":
    sys.exit(serve(load, handle))
