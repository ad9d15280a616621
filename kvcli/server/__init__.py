"""`kvcli serve`: the OpenAI Files + Batches API over one loaded engine (imports the web stack)."""
