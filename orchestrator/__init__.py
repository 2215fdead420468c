"""Ray-distributed orchestrator for online test-time adaptation of CLIP (BCA, CVPR 2025)."""

__version__ = "0.1.0"
