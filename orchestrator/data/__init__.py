"""Data: the synthetic embedding benchmark, real dataset readers and the stream container."""
