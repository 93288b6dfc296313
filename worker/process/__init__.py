"""A worker process's life: heartbeats, its lanes, shutdown within the grace period, memory kept, metrics."""
