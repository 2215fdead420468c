# Imported first so that every Ray the tests start (in-process or through `bca sweep`) listens on loopback.
import orchestrator.sweep  # noqa: F401
