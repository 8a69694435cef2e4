"""GPU workers: diffusers model registry and loading, approximate caching (resume from step K),
smaller models, cascades, and the worker loop. Heavy imports are lazy."""
