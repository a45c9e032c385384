"""Private server instances for tests and benchmarks: free port, temp dir, stopped by PID."""
