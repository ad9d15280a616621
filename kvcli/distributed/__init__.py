"""``kvcli generate --ray``: the same batch job, its engines spread over Ray actors.

Only imported when ``--ray`` is given; ``options`` alone is importable without Ray
(it holds the settings and the "Ray is not installed" check). The rest imports ray.

    options     RayOptions, require_ray()
    routing     prefix-affinity routing with bounded loads (and random, for comparison)
    prediction  the audit's single-engine cache-hit prediction, one request at a time
    worker      EngineWorker: the Ray actor holding one engine
    tally       per-worker counts and engine stats, merged for the summary
    cluster     connecting to Ray, starting the actors
    pool        WorkerPool: the engine interface the batch job drives, over the actors
    run         run_generate_on_ray(): the command's entry point
"""
