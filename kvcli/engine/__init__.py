"""kvcli's inference engine (the thread-pool environment it needs is set in kvcli/__init__.py)."""
