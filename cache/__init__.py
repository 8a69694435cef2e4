"""Approximate latent cache: prompt-embedding index (in-process HNSW over SQLite, or Qdrant),
latent blob stores (local directory, S3 via boto3), NIRVANA thresholds, LCBFU eviction and health.

Entry point: :class:`cache.latent_cache.LatentCache` (``LatentCache.from_config(settings.cache)``).
Heavy imports (hnswlib, qdrant_client, boto3, safetensors) happen when an index or store is built.
"""
