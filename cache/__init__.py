"""Approximate latent cache: prompt-embedding index (Qdrant), latent blob stores (local directory,
S3 via boto3), eviction and health. Heavy imports are lazy."""
