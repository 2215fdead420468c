"""The on-disk feature cache and load_benchmark, the real-dataset entry point for sweep trials."""

from orchestrator.features.benchmark import RealBenchmark, load_benchmark
from orchestrator.features.cache import CachedFeatures, CorruptImageError, FeatureCache

__all__ = ["CachedFeatures", "CorruptImageError", "FeatureCache", "RealBenchmark", "load_benchmark"]
