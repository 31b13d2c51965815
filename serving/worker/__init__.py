"""The worker agent: verified vLLM replicas on one host."""
