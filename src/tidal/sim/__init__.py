"""Trace-driven cluster simulator: replays workloads through the same policies as the controller."""
