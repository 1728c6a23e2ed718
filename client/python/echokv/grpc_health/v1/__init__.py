"""grpc.health.v1 stubs, generated into this package (see tools/generate_stubs.py)."""
